#include "stdin_channel.hpp"

#include <xeus/xeus_context.hpp>
#include <xeus/xmessage.hpp>
#include <xeus/xmiddleware.hpp>

namespace xmesh::kernel {

namespace {
const char kSelfId[] = "xmesh-stdin-self";
}

StdinGuardedServer::StdinGuardedServer(zmq::context_t& context, const xeus::xconfiguration& config,
                                       nl::json::error_handler_t eh)
    : xeus::xserver_shell_main(context, config, eh), m_self(context, zmq::socket_type::dealer) {
  m_self.set(zmq::sockopt::routing_id, std::string(kSelfId));
  m_self.set(zmq::sockopt::linger, 0);
  m_self.connect(xeus::get_end_point(config.m_transport, config.m_ip, config.m_stdin_port));
}

void StdinGuardedServer::route_replies_to(xeus::xinterpreter& interpreter) {
  p_interpreter = &interpreter;
  register_stdin_listener([this](xeus::xmessage reply) { on_reply(std::move(reply)); });
}

void StdinGuardedServer::send_stdin_impl(xeus::xmessage msg) {
  const std::string id = msg.header().value("msg_id", "");
  try {
    m_stale = false;
    xserver_zmq_split::send_stdin_impl(std::move(msg));  // sends the request, waits for one reply
    while (m_stale) {
      // That reply answered a box abandoned earlier; the front end still shows this request's
      // box. Wait for its answer without showing another: a request addressed to ourselves.
      m_stale = false;
      drain_self();
      xeus::xmessage wait_again(xeus::xmessage::guid_list{kSelfId}, xeus::make_header("input_request", "", ""),
                                nl::json::object(), nl::json::object(),
                                nl::json{{"prompt", ""}, {"password", false}}, xeus::buffer_sequence());
      xserver_zmq_split::send_stdin_impl(std::move(wait_again));
    }
  } catch (...) {
    if (!id.empty()) m_abandoned.insert(id);
    throw;
  }
}

void StdinGuardedServer::on_reply(xeus::xmessage reply) {
  const nl::json& parent = reply.parent_header();
  const std::string answered = parent.is_object() ? parent.value("msg_id", "") : "";
  if (!answered.empty() && m_abandoned.erase(answered) > 0) {
    m_stale = true;  // late: its request is gone
    return;
  }
  // A reply with no parent header (some clients send none) cannot be told apart: it is taken.
  if (p_interpreter != nullptr) p_interpreter->input_reply(reply.content().value("value", ""));
}

void StdinGuardedServer::drain_self() {
  zmq::message_t part;
  while (m_self.recv(part, zmq::recv_flags::dontwait)) {
  }
}

std::unique_ptr<xeus::xserver> make_stdin_guarded_server(xeus::xcontext& context, const xeus::xconfiguration& config,
                                                         nl::json::error_handler_t eh) {
  return std::make_unique<StdinGuardedServer>(context.get_wrapped_context<zmq::context_t>(), config, eh);
}

}  // namespace xmesh::kernel
