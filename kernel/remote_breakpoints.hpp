// JupyterLab's visual debugger drives debugpy inside the kernel, but an endpoint runs on the
// procs: a gutter breakpoint inside an endpoint would be accepted and never fire. This wraps
// xeus-python's debugger (a decorator of xeus::xdebugger): every request goes to it unchanged,
// and the breakpoints a front end sets are passed on to xmesh (python/xmesh/_kernel/interpreter.py
// note_breakpoints), which tells the user, once, when one lies in an endpoint.
#pragma once
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "xeus/xdebugger.hpp"
#include "xeus/xeus_context.hpp"
#include "xeus/xkernel_configuration.hpp"

namespace xmesh::kernel {

std::unique_ptr<xeus::xdebugger> make_xmesh_debugger(xeus::xcontext& context, const xeus::xconfiguration& config,
                                                     const std::string& user_name, const std::string& session_id,
                                                     const nlohmann::json& debugger_config);

}  // namespace xmesh::kernel
