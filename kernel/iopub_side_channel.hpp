// IopubSideChannel: publishing iopub messages from any thread (DESIGN §4, PLATFORM-NOTES).
//
// xeus 2.4's publish_* methods end in the shell thread's PUB socket, which no other thread
// may touch. xeus's publisher thread binds a SUB socket at inproc://publisher and forwards
// whatever arrives there to the iopub socket; this channel is a second PUB socket in the
// kernel's ZeroMQ context connected there, used under a mutex, with messages serialized and
// signed the way xeus does. The log output uses it for late output: update_display_data of a
// cell that already finished.
//
// Python reaches it as `xmesh._kernel_ext.publish(msg_type, content_json, parent_header_json)`.
#pragma once
#include <memory>
#include <mutex>
#include <string>

#include "nlohmann/json.hpp"
#include "pybind11/pybind11.h"
#include "xeus/xauthentication.hpp"
#include "zmq.hpp"

namespace xmesh::kernel {

class IopubSideChannel {
 public:
  IopubSideChannel(zmq::context_t& context, const std::string& signature_scheme, const std::string& key,
                   const std::string& user_name);
  ~IopubSideChannel();
  void publish(const std::string& msg_type, nlohmann::json content, nlohmann::json parent_header);

 private:
  std::mutex mu_;
  zmq::socket_t socket_;
  std::unique_ptr<xeus::xauthentication> auth_;
  std::string user_name_, session_id_;
};

// The process's channel, made by serve() (kernel_module.cpp) once the kernel's context exists; closed (and the
// Python module made inert) before the context is destroyed.
void make_iopub_side_channel(zmq::context_t& context, const std::string& signature_scheme, const std::string& key,
                             const std::string& user_name);
void close_iopub_side_channel();

// Publishes through the channel, from any thread holding the GIL (given back while it sends);
// false once the channel is closed.
bool publish_from_any_thread(const std::string& msg_type, nlohmann::json content, nlohmann::json parent);

void bind_iopub(pybind11::module_& m);

}  // namespace xmesh::kernel
