#include "remote_breakpoints.hpp"

#include <vector>

#include "pybind11/embed.h"
#include "pybind11/stl.h"
#include "xeus-python/xdebugger.hpp"

namespace py = pybind11;

namespace xmesh::kernel {

namespace {

class XmeshDebugger : public xeus::xdebugger {
 public:
  explicit XmeshDebugger(std::unique_ptr<xeus::xdebugger> inner) : inner_(std::move(inner)) {}

 private:
  nl::json process_request_impl(const nl::json& header, const nl::json& message) override {
    if (!messenger_given_) {  // the kernel registers its messenger with us (a non-virtual call)
      inner_->register_control_messenger(get_control_messenger());
      messenger_given_ = true;
    }
    nl::json reply = inner_->process_request(header, message);
    if (message.value("command", "") == "setBreakpoints") note_breakpoints(message);
    return reply;
  }

  static void note_breakpoints(const nl::json& message) {
    try {
      const nl::json& args = message.at("arguments");
      std::string path = args.at("source").value("path", "");
      std::vector<int> lines;
      for (const auto& b : args.value("breakpoints", nl::json::array())) lines.push_back(b.value("line", 0));
      py::gil_scoped_acquire gil;
      py::module_::import("xmesh._kernel.interpreter").attr("note_breakpoints")(path, lines);
    } catch (const std::exception&) {
      // a malformed request is the debugger's to answer; telling the user is best effort
    }
  }

  std::unique_ptr<xeus::xdebugger> inner_;
  bool messenger_given_ = false;
};

}  // namespace

std::unique_ptr<xeus::xdebugger> make_xmesh_debugger(xeus::xcontext& context, const xeus::xconfiguration& config,
                                                     const std::string& user_name, const std::string& session_id,
                                                     const nlohmann::json& debugger_config) {
  return std::make_unique<XmeshDebugger>(
      xpyt::make_python_debugger(context, config, user_name, session_id, debugger_config));
}

}  // namespace xmesh::kernel
