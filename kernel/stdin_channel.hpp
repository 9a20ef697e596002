// The kernel's ZeroMQ server: xeus 2.4's shell-on-main-thread server with a stdin channel that
// drops late answers. An input request that was interrupted (Ctrl-C at the debugger prompt, or
// `xmesh debug` taking the prompt over) leaves its input box in the front end; what the user
// types there later must not become the answer to the next request. ipykernel drains its stdin
// socket before each request for this; xeus 2.4 keeps the socket private, so replies are
// matched to requests by their parent header instead (see stdin_channel.cpp).
#pragma once

#include <memory>
#include <set>
#include <string>

#include <xeus/xinterpreter.hpp>
#include <xeus/xkernel_configuration.hpp>
#include <xeus/xserver_shell_main.hpp>
#include <zmq.hpp>
#include <pybind11/pybind11.h>

namespace xmesh::kernel {

class StdinGuardedServer : public xeus::xserver_shell_main {
 public:
  StdinGuardedServer(zmq::context_t& context, const xeus::xconfiguration& config, nl::json::error_handler_t eh);

  // Takes the stdin replies over from xeus's kernel core (call once the kernel is built).
  void route_replies_to(xeus::xinterpreter& interpreter);

 protected:
  void send_stdin_impl(xeus::xmessage msg) override;

 private:
  void on_reply(xeus::xmessage reply);
  void drain_self();

  zmq::socket_t m_self;              // a DEALER on our own stdin ROUTER: "wait again" requests go here
  std::set<std::string> m_abandoned;  // requests whose wait was interrupted (their box may still answer)
  bool m_stale = false;               // the reply just received answered an abandoned request
  xeus::xinterpreter* p_interpreter = nullptr;
};

std::unique_ptr<xeus::xserver> make_stdin_guarded_server(xeus::xcontext& context, const xeus::xconfiguration& config,
                                                         nl::json::error_handler_t eh);

// `input_request(prompt, password=False)` of the kernel module (stdin_prompt.cpp): a line from the
// front end's input box, waited for without the GIL; an interrupt raises KeyboardInterrupt.
void bind_stdin(pybind11::module_& m);

}  // namespace xmesh::kernel
