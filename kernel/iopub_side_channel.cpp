#include "iopub_side_channel.hpp"

#include "pybind11/pybind11.h"
#include "xeus/xguid.hpp"
#include "xeus/xmessage.hpp"
#include "xeus/xmiddleware.hpp"
#include "xeus/xzmq_serializer.hpp"
#include "zmq_addon.hpp"

namespace py = pybind11;

namespace xmesh::kernel {

IopubSideChannel::IopubSideChannel(zmq::context_t& context, const std::string& signature_scheme,
                                   const std::string& key, const std::string& user_name)
    : socket_(context, zmq::socket_type::pub),
      auth_(xeus::make_xauthentication(signature_scheme, key)),
      user_name_(user_name),
      session_id_(xeus::new_xguid()) {
  socket_.set(zmq::sockopt::linger, xeus::get_socket_linger());
  socket_.connect(xeus::get_publisher_end_point());
}

IopubSideChannel::~IopubSideChannel() = default;

void IopubSideChannel::publish(const std::string& msg_type, nlohmann::json content, nlohmann::json parent_header) {
  xeus::xpub_message msg("xmesh." + msg_type, xeus::make_header(msg_type, user_name_, session_id_),
                         std::move(parent_header), nlohmann::json::object(), std::move(content),
                         xeus::buffer_sequence());
  // Invalid UTF-8 in remote output must not make serialization throw on a runtime thread.
  zmq::multipart_t wire =
      xeus::xzmq_serializer::serialize_iopub(std::move(msg), *auth_, nlohmann::json::error_handler_t::replace);
  std::lock_guard<std::mutex> g(mu_);
  wire.send(socket_);
}

namespace {
std::mutex g_channel_mu;
std::unique_ptr<IopubSideChannel> g_channel;
}  // namespace

void make_iopub_side_channel(zmq::context_t& context, const std::string& signature_scheme, const std::string& key,
                             const std::string& user_name) {
  std::lock_guard<std::mutex> g(g_channel_mu);
  g_channel = std::make_unique<IopubSideChannel>(context, signature_scheme, key, user_name);
}

void close_iopub_side_channel() {
  std::lock_guard<std::mutex> g(g_channel_mu);
  g_channel.reset();
}

}  // namespace xmesh::kernel

namespace xmesh::kernel {

void bind_iopub(py::module_& m) {
  m.def("publish", [](const std::string& msg_type, const std::string& content, const std::string& parent) {
    auto c = nlohmann::json::parse(content, nullptr, false);
    auto p = nlohmann::json::parse(parent, nullptr, false);
    if (c.is_discarded() || p.is_discarded()) throw py::value_error("publish() takes JSON text");
    return publish_from_any_thread(msg_type, std::move(c), std::move(p));
  }, "publish(msg_type, content_json, parent_header_json) from any thread: False once the kernel closed.");
}

bool publish_from_any_thread(const std::string& msg_type, nlohmann::json content, nlohmann::json parent) {
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> g(g_channel_mu);
  if (!g_channel) return false;
  g_channel->publish(msg_type, std::move(content), std::move(parent));
  return true;
}

}  // namespace xmesh::kernel
