// JupyterLab's visual debugger for the kernel's own Python code (python_debugger.cpp): debugpy
// in the kernel process behind xeus's debugger base, and the breakpoints a front end sets passed
// on to xmesh, which explains those that lie in endpoints.
#pragma once
#include <memory>
#include <string>

#include <pybind11/pybind11.h>
#include <nlohmann/json.hpp>
#include <xeus/xdebugger.hpp>
#include <xeus/xeus_context.hpp>
#include <xeus/xkernel_configuration.hpp>

namespace xmesh::kernel {

namespace py = pybind11;

// The file a cell's code is compiled as: a hash of the code under the kernel's temporary
// directory, as the front end computes it from debugInfo (so its breakpoints meet the code).
std::string cell_file(const std::string& code);

std::unique_ptr<xeus::xdebugger> make_python_debugger(xeus::xcontext& context, const xeus::xconfiguration& config,
                                                      const std::string& user_name, const std::string& session_id,
                                                      const nlohmann::json& debugger_config);

}  // namespace xmesh::kernel
