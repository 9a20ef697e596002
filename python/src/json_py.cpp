// JSON values <-> Python objects, for message headers and bodies (json_py.hpp).
#include "json_py.hpp"

namespace xmesh {

namespace py = pybind11;
using json = nlohmann::json;

py::object to_py(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return py::none();
    case json::value_t::boolean: return py::bool_(j.get<bool>());
    case json::value_t::number_integer: return py::int_(j.get<int64_t>());
    case json::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case json::value_t::number_float: return py::float_(j.get<double>());
    case json::value_t::string: return py::str(j.get_ref<const std::string&>());
    case json::value_t::binary: {
      auto& b = j.get_binary();
      return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
    }
    case json::value_t::array: {
      py::list l;
      for (auto& e : j) l.append(to_py(e));
      return std::move(l);
    }
    case json::value_t::object: {
      py::dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d[py::str(it.key())] = to_py(it.value());
      return std::move(d);
    }
    default: return py::none();
  }
}

json from_py(const py::handle& o) {
  if (o.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(o)) return o.cast<bool>();
  if (py::isinstance<py::int_>(o)) {
    // Ids are unsigned 64-bit (buffer ids): past INT64_MAX they go as unsigned.
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o.ptr(), &overflow);
    if (overflow > 0) return o.cast<uint64_t>();
    if (overflow < 0) throw py::value_error("an integer below -2**63 cannot go into a message");
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    return static_cast<int64_t>(v);
  }
  if (py::isinstance<py::float_>(o)) return o.cast<double>();
  if (py::isinstance<py::str>(o)) return o.cast<std::string>();
  if (py::isinstance<py::bytes>(o)) {
    std::string s = o.cast<std::string>();
    return json::binary(std::vector<uint8_t>(s.begin(), s.end()));
  }
  if (py::isinstance<py::dict>(o)) {
    json j = json::object();
    for (auto kv : o.cast<py::dict>()) j[py::str(kv.first).cast<std::string>()] = from_py(kv.second);
    return j;
  }
  if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    json j = json::array();
    for (auto e : o) j.push_back(from_py(e));
    return j;
  }
  if (py::hasattr(o, "to_dict")) return from_py(o.attr("to_dict")());  // a typed body (bodies.hpp)
  throw py::type_error("cannot put a " + std::string(py::str(o.get_type())) + " into a message header");
}

}  // namespace xmesh
