// JSON values <-> Python objects: dict, list, str, int, float, bool, None and bytes (JSON's
// binary). The one conversion message headers, bodies and reports cross the binding through.
#pragma once
#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

namespace xmesh {

pybind11::object to_py(const nlohmann::json& j);
// Throws TypeError naming the type of a value JSON cannot hold.
nlohmann::json from_py(const pybind11::handle& o);

}  // namespace xmesh
