// One Python class per typed message body (runtime/protocol/bodies.hpp and the subsystems' *_bodies.hpp), made from the body's own field
// list: `_core.StopProcsBody(alloc="1f", immediately=True)` (keywords only; an unknown one is a
// TypeError, a bad value a ValueError naming the field), its fields as read-only attributes
// (nested bodies as their own classes, JSON values as dicts and lists), `to_dict()` for the
// wire, `T.from_dict(d)` to read one, and == by value.
#pragma once
#include <pybind11/pybind11.h>

#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "bodies.hpp"
#include "json_py.hpp"

namespace xmesh {

namespace body_py {
template <class V>
struct is_vector : std::false_type {};
template <class V>
struct is_vector<std::vector<V>> : std::true_type {};
template <class V>
struct is_map : std::false_type {};
template <class V>
struct is_map<std::map<std::string, V>> : std::true_type {};

template <class V>
pybind11::object value_to_py(const V& v) {
  if constexpr (std::is_same_v<V, nlohmann::json>) {
    return to_py(v);
  } else if constexpr (body_detail::is_optional<V>::value) {
    return v ? value_to_py(*v) : pybind11::none();
  } else if constexpr (is_vector<V>::value) {
    pybind11::list l;
    for (auto& e : v) l.append(value_to_py(e));
    return std::move(l);
  } else if constexpr (is_map<V>::value) {
    pybind11::dict d;
    for (auto& [k, e] : v) d[pybind11::str(k)] = value_to_py(e);
    return std::move(d);
  } else {
    return pybind11::cast(v);  // scalars, strings, and nested bodies (bound as their own classes)
  }
}

template <class T>
std::set<std::string> field_names() {
  std::set<std::string> names;
  T::fields([&](const char* name, auto, Need) { names.insert(name); });
  return names;
}

template <class T>
T from_json_checked(const nlohmann::json& j) {
  std::string why;
  auto read = read_as<T>(j, &why);
  if (!read) throw pybind11::value_error(why);
  return std::move(*read);
}

// Built from Python: keywords only, each one a field of the body.
template <class T>
T from_kwargs(const pybind11::kwargs& kw, const char* cls) {
  static const std::set<std::string> names = field_names<T>();
  for (auto item : kw) {
    std::string key = pybind11::str(item.first);
    if (!names.count(key)) throw pybind11::type_error(std::string(cls) + "() has no field '" + key + "'");
  }
  return from_json_checked<T>(from_py(kw));
}
}  // namespace body_py

template <class T>
pybind11::class_<T> bind_body(pybind11::module_& m, const char* cls, const char* doc) {
  namespace py = pybind11;
  py::class_<T> c(m, cls, doc);
  c.def(py::init([cls](py::kwargs kw) { return body_py::from_kwargs<T>(kw, cls); }));
  c.def_static("from_dict", [](py::handle d) { return body_py::from_json_checked<T>(from_py(d)); }, py::arg("d"),
               "Reads a body as it came off the wire (ValueError naming a bad field).");
  c.def("to_dict", [](const T& b) { return to_py(nlohmann::json(b)); }, "The body as it goes on the wire.");
  c.def("__eq__", [](const T& a, const T& b) { return nlohmann::json(a) == nlohmann::json(b); });
  c.def("__repr__", [cls](const T& b) { return std::string("<") + cls + " " + nlohmann::json(b).dump() + ">"; });
  T::fields([&](const char* name, auto member, Need) {
    c.def_property_readonly(name, [member](const T& b) { return body_py::value_to_py(b.*member); });
  });
  return c;
}

}  // namespace xmesh
