// JupyterLab's visual debugger for the kernel's own Python: debugpy in the kernel process,
// reached over TCP by xeus's DAP client (xdap_tcp_client), with xeus's debugger base answering
// what needs no debugpy (debugInfo, dumpCell, the breakpoints it keeps, stack traces). Cells are
// files named by a hash of their code (cell_file), the scheme the front end computes from
// debugInfo to map its cells to files. Variables are read through debugpy while stopped and
// through xeus-python-shell's explorer of the user's namespace otherwise.
//
// A breakpoint set in an endpoint's line cannot stop there: endpoints run on the procs. The
// breakpoints a front end sets are passed to _kernel.interpreter.note_breakpoints, which says
// so once in the next cell.
#include "python_debugger.hpp"

#include <thread>
#include <vector>

#include <pybind11/eval.h>
#include <pybind11/stl.h>
#include <xeus/xdap_tcp_client.hpp>
#include <xeus/xdebugger_base.hpp>
#include <xeus/xmiddleware.hpp>
#include <xeus/xsystem.hpp>

#include "json_py.hpp"
#include "util.hpp"

namespace xmesh::kernel {

namespace {

const char* const kTmpName = "xmesh";

class DebugpyClient : public xeus::xdap_tcp_client {
 public:
  DebugpyClient(zmq::context_t& context, const xeus::xconfiguration& config, const std::string& user_name,
                const std::string& session_id, const event_callback& cb)
      : xeus::xdap_tcp_client(context, config, xeus::get_socket_linger(),
                              xeus::xdap_tcp_configuration(xeus::dap_tcp_type::client, xeus::dap_init_type::parallel,
                                                           user_name, session_id),
                              cb) {}

 private:
  void handle_event(nl::json message) override { forward_event(std::move(message)); }
};

class PythonDebugger : public xeus::xdebugger_base {
 public:
  PythonDebugger(zmq::context_t& context, const xeus::xconfiguration& config, const std::string& user_name,
                 const std::string& session_id, std::string python)
      : xeus::xdebugger_base(context),
        client_(std::make_unique<DebugpyClient>(context, config, user_name, session_id, get_event_callback())),
        port_(xeus::find_free_port(100, 5678, 5900)),
        python_(std::move(python)) {
    using std::placeholders::_1;
    register_request_handler("inspectVariables", std::bind(&PythonDebugger::inspect_variables, this, _1), false);
    register_request_handler("richInspectVariables", std::bind(&PythonDebugger::rich_inspect, this, _1), false);
    register_request_handler("attach", std::bind(&PythonDebugger::attach, this, _1), true);
    register_request_handler("configurationDone", std::bind(&PythonDebugger::configuration_done, this, _1), true);
    register_request_handler("setBreakpoints", std::bind(&PythonDebugger::set_breakpoints, this, _1), true);
  }

  ~PythonDebugger() override {
    py::gil_scoped_acquire gil;
    helper_ = py::object();
  }

 private:
  static nl::json response_to(const nl::json& message, bool success) {
    return {{"type", "response"}, {"request_seq", message.value("seq", 0)}, {"success", success},
            {"command", message.value("command", "")}};
  }

  nl::json inspect_variables(const nl::json& message) {
    py::gil_scoped_acquire gil;
    if (!helper()) return response_to(message, false);
    return from_py(helper_.attr("inspect_variables")(to_py(message)));
  }

  // The rich form of a variable (display_formatter.format): in the user's namespace while no
  // thread is stopped, else evaluated in the stopped frame through debugpy's setExpression.
  nl::json rich_inspect(const nl::json& message) {
    nl::json reply = response_to(message, false);
    const std::string name = message.value("arguments", nl::json::object()).value("variableName", "");
    reply["body"] = {{"data", nl::json::object()}, {"metadata", nl::json::object()}};
    py::gil_scoped_acquire gil;
    if (PyUnicode_IsIdentifier(py::str(name).ptr()) != 1) {
      reply["success"] = name == "special variables" || name == "function variables";
      return reply;
    }
    const std::string data = "__xmesh_repr_data", meta = "__xmesh_repr_metadata";
    py::dict globals = py::module_::import("__main__").attr("__dict__");
    try {
      if (get_stopped_threads().empty()) {
        py::exec(py::str(data + ", " + meta + " = get_ipython().display_formatter.format(" + name + ")"), globals);
      } else {
        nl::json request = {{"type", "request"}, {"command", "setExpression"}, {"seq", message.value("seq", 0) + 1},
                            {"arguments", {{"expression", data + ", " + meta},
                                           {"value", "get_ipython().display_formatter.format(" + name + ")"},
                                           {"frameId", message["arguments"].value("frameId", 0)}}}};
        py::gil_scoped_release release;  // debugpy answers from its own threads
        forward_message(request);
      }
      reply["body"] = {{"data", from_py(globals[py::str(data)])}, {"metadata", from_py(globals[py::str(meta)])}};
      globals.attr("pop")(data, py::none());
      globals.attr("pop")(meta, py::none());
      reply["success"] = true;
    } catch (const std::exception& e) {
      log_diag("kernel", std::string("richInspectVariables failed: ") + e.what());
    }
    return reply;
  }

  nl::json attach(const nl::json& message) {
    nl::json forwarded = message;
    forwarded["arguments"]["connect"] = {{"host", "127.0.0.1"}, {"port", std::stoi(port_)}};
    forwarded["arguments"]["logToFile"] = true;
    return forward_message(forwarded);
  }

  nl::json configuration_done(const nl::json& message) {
    nl::json reply = response_to(message, true);
    reply["seq"] = message.value("seq", 0);
    return reply;
  }

  nl::json set_breakpoints(const nl::json& message) {
    nl::json reply = set_breakpoints_request(message);
    note_breakpoints(message);
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

  nl::json variables_request_impl(const nl::json& message) override {
    if (!get_stopped_threads().empty()) {
      nl::json reply = xeus::xdebugger_base::variables_request_impl(message);
      py::gil_scoped_acquire gil;
      if (!helper()) return reply;
      return from_py(helper_.attr("build_variables_response")(to_py(message), to_py(reply["body"]["variables"])));
    }
    py::gil_scoped_acquire gil;
    if (!helper()) return response_to(message, false);
    return from_py(helper_.attr("variables")(to_py(message)));
  }

  // xeus-python-shell's helper (variables of the user's namespace), once debugpy runs.
  bool helper() {
    if (helper_) return true;
    try {
      helper_ = py::module_::import("xeus_python_shell.debugger").attr("XDebugger")();
    } catch (py::error_already_set& e) {
      log_diag("kernel", std::string("the debugger's variable explorer is unavailable: ") + e.what());
    }
    return static_cast<bool>(helper_);
  }

  // debugpy listens in this process; it must be started on the shell thread (it traces that
  // thread), which the control messenger asks for.
  bool start_debugpy() {
    std::string code = "import debugpy\n";
    if (!python_.empty()) code += "debugpy.configure({'python': r'" + python_ + "'})\n";
    code += "debugpy.listen(('127.0.0.1', " + port_ + "))\n";
    nl::json reply = get_control_messenger().send_to_shell({{"code", code}});
    if (reply.value("status", "") != "ok") {
      log_diag("kernel", "debugpy could not start: " + reply.value("evalue", std::string("(no reason given)")));
      return false;
    }
    return true;
  }

  bool start(zmq::socket_t& header_socket, zmq::socket_t& request_socket) override {
    static const bool started = start_debugpy();
    if (!started) return false;
    const std::string controller = xeus::get_controller_end_point("debugger");
    const std::string controller_header = xeus::get_controller_end_point("debugger_header");
    request_socket.bind(controller);
    header_socket.bind(controller_header);
    std::thread(&xeus::xdap_tcp_client::start_debugger, client_.get(), "tcp://127.0.0.1:" + port_,
                xeus::get_publisher_end_point(), controller, controller_header)
        .detach();
    request_socket.send(zmq::message_t("REQ", 3), zmq::send_flags::none);
    zmq::message_t ack;
    (void)request_socket.recv(ack);
    xeus::create_directory(xeus::get_tmp_prefix(kTmpName));
    return true;
  }

  void stop(zmq::socket_t& header_socket, zmq::socket_t& request_socket) override {
    request_socket.unbind(xeus::get_controller_end_point("debugger"));
    header_socket.unbind(xeus::get_controller_end_point("debugger_header"));
  }

  xeus::xdebugger_info get_debugger_info() const override {
    return xeus::xdebugger_info(xeus::get_tmp_hash_seed(), xeus::get_tmp_prefix(kTmpName), ".py", true,
                                {"Python Exceptions"});
  }

  std::string get_cell_temporary_file(const std::string& code) const override { return cell_file(code); }

  std::unique_ptr<DebugpyClient> client_;
  std::string port_;
  std::string python_;
  py::object helper_;
};

}  // namespace

std::string cell_file(const std::string& code) {
  return xeus::get_cell_tmp_file(xeus::get_tmp_prefix(kTmpName), code, ".py");
}

std::unique_ptr<xeus::xdebugger> make_python_debugger(xeus::xcontext& context, const xeus::xconfiguration& config,
                                                      const std::string& user_name, const std::string& session_id,
                                                      const nl::json& debugger_config) {
  return std::make_unique<PythonDebugger>(context.get_wrapped_context<zmq::context_t>(), config, user_name,
                                          session_id, debugger_config.value("python", ""));
}

}  // namespace xmesh::kernel
