// The machinery of typed message bodies: one definition of each body, written by its sender
// and read by its receivers on both sides, C++ and Python through pybind11 (xmesh._core:
// `_core.StopProcsBody(alloc=...)`, `msg.proc_exited()`, `_core.AttachReply.from_dict(d)`),
// instead of JSON objects built in one language and read by string keys in the other.
//
// Each body lives with the subsystem whose message it is (transport/link_bodies.hpp,
// node/node_bodies.hpp, cast/cast_bodies.hpp, data/data_bodies.hpp, output/output_bodies.hpp,
// protocol/agent_bodies.hpp for the host agent's API, workspace_sync/sync_bodies.hpp,
// debugger/debug_bodies.hpp) and knows its kind (`static constexpr Kind kind`; Node::send(addr,
// body) fills the header from it); this file keeps what they share, and ErrorBody, the protocol's
// own. Each body lists its fields once, in `fields(f)`: f(wire name, member pointer, Need). That one
// list gives the JSON writer and reader (write_body / read_body below), the Python class's
// attributes and its keyword constructor (python/src/body_bindings.hpp, bind_body). Reading
// validates: a missing required field, a field of the wrong type or a value a body's check()
// refuses throws std::invalid_argument naming the body and the field. Unknown fields are
// ignored on the wire (a newer peer may add some), refused when Python builds a body.
// docs/architecture/02-protocol.md has the table of kinds and their bodies.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <limits>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace xmesh {

enum class Need { Required, Optional };

namespace body_detail {
template <class V>
struct is_optional : std::false_type {};
template <class V>
struct is_optional<std::optional<V>> : std::true_type {};
template <class T, class = void>
struct has_check : std::false_type {};
template <class T>
struct has_check<T, std::void_t<decltype(std::declval<T&>().check())>> : std::true_type {};
template <class V>
struct is_sequence : std::false_type {};
template <class E>
struct is_sequence<std::vector<E>> : std::true_type {};
template <class E, size_t N>
struct is_sequence<std::array<E, N>> : std::true_type {};

// Whether a JSON number fits the integer type V: the library's conversion of a float that does
// not (NaN, infinite, out of range, negative into unsigned) is undefined behaviour, and of an
// integer that does not a silent wrap. Found by fuzz_wire.
template <class V>
bool fits_integer(const nlohmann::json& j) {
  using L = std::numeric_limits<V>;
  if (j.is_number_float()) {
    double d = j.get<double>();
    return d >= static_cast<double>(L::min()) && d < static_cast<double>(L::max()) + 1.0;  // false for NaN
  }
  if (j.is_number_unsigned()) return j.get<uint64_t>() <= static_cast<uint64_t>(L::max());
  if (j.is_number_integer()) return std::is_signed_v<V> ? true : j.get<int64_t>() >= 0;
  return true;  // not a number: the conversion itself refuses it
}

// Every number in j that becomes an integer of V (or of its elements) fits it.
template <class V>
bool numbers_fit(const nlohmann::json& j) {
  if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool>) {
    return fits_integer<V>(j);
  } else if constexpr (is_optional<V>::value) {
    return numbers_fit<typename V::value_type>(j);
  } else if constexpr (is_sequence<V>::value) {
    if (!j.is_array()) return true;
    for (const auto& e : j)
      if (!numbers_fit<typename V::value_type>(e)) return false;
    return true;
  } else {
    return true;  // strings, maps of strings, json, nested bodies (read_body checks their fields)
  }
}
}  // namespace body_detail

template <class T>
void write_body(nlohmann::json& j, const T& b) {
  j = nlohmann::json::object();
  T::fields([&](const char* name, auto member, Need) {
    const auto& v = b.*member;
    using V = std::decay_t<decltype(v)>;
    if constexpr (body_detail::is_optional<V>::value) {
      if (v) j[name] = *v;
    } else {
      j[name] = v;
    }
  });
}

template <class T>
void read_body(const nlohmann::json& j, T& b) {
  if (!j.is_object()) throw std::invalid_argument(std::string(T::what) + " body is not an object");
  T::fields([&](const char* name, auto member, Need need) {
    auto& v = b.*member;
    using V = std::decay_t<decltype(v)>;
    auto it = j.find(name);
    if (it == j.end() || (it->is_null() && need == Need::Optional)) {
      if (need == Need::Required) throw std::invalid_argument(std::string(T::what) + " body without '" + name + "'");
      return;  // the default stays
    }
    if (!body_detail::numbers_fit<V>(*it))
      throw std::invalid_argument(std::string(T::what) + " body: '" + name + "' is out of range");
    try {
      if constexpr (body_detail::is_optional<V>::value)
        v = it->template get<typename V::value_type>();
      else
        v = it->template get<V>();
    } catch (const nlohmann::json::exception&) {
      throw std::invalid_argument(std::string(T::what) + " body: '" + name + "' has the wrong type");
    } catch (const std::invalid_argument& e) {  // a nested body's own error
      throw std::invalid_argument(std::string(T::what) + " body: '" + name + "': " + e.what());
    }
  });
  if constexpr (body_detail::has_check<T>::value) b.check();
}

// The one way a receiver reads a body: the body, or nullopt with *why naming the body and the
// field that did not read (read_body's message).
template <class T>
std::optional<T> read_as(const nlohmann::json& j, std::string* why = nullptr) {
  try {
    T out;
    read_body(j, out);
    return out;
  } catch (const std::invalid_argument& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
}

// Gives a body type its nlohmann to_json / from_json (found by argument-dependent lookup).
#define XMESH_BODY_JSON(T)                                                              \
  inline void to_json(nlohmann::json& j, const T& b) { write_body(j, b); }             \
  inline void from_json(const nlohmann::json& j, T& b) { read_body(j, b); }

using StringMap = std::map<std::string, std::string>;

// A body's check() refusing a value: std::invalid_argument "<what> body: <why>".
[[noreturn]] void refuse_body(const char* what, const std::string& why);

// The body of a failed Reply, of a call failed by supervision, and of a Fault (a broadcast's
// endpoint raised, nobody waits for it: proc -> controller): its kind (errors.def), the text to
// show, and the fields some kinds add.
struct ErrorBody {
  static constexpr const char* what = "error";
  std::string kind, text;
  // actor: where the endpoint raised (and the cell that made the call, for a Fault).
  std::optional<std::string> type, traceback, method, actor, host, cell;
  std::optional<int64_t> pid, rank;
  std::optional<nlohmann::json> coords;
  std::optional<nlohmann::json> shape;    // name-taken: the live allocation's shape
  std::optional<std::string> request;     // hostd: the kind of the request it failed
  std::optional<nlohmann::json> info;     // supervision: the ProcExited notice
  template <class F>
  static void fields(F&& f) {
    f("kind", &ErrorBody::kind, Need::Required);
    f("text", &ErrorBody::text, Need::Required);
    f("type", &ErrorBody::type, Need::Optional);
    f("traceback", &ErrorBody::traceback, Need::Optional);
    f("method", &ErrorBody::method, Need::Optional);
    f("actor", &ErrorBody::actor, Need::Optional);
    f("host", &ErrorBody::host, Need::Optional);
    f("cell", &ErrorBody::cell, Need::Optional);
    f("pid", &ErrorBody::pid, Need::Optional);
    f("rank", &ErrorBody::rank, Need::Optional);
    f("coords", &ErrorBody::coords, Need::Optional);
    f("shape", &ErrorBody::shape, Need::Optional);
    f("request", &ErrorBody::request, Need::Optional);
    f("info", &ErrorBody::info, Need::Optional);
  }
};
XMESH_BODY_JSON(ErrorBody)

}  // namespace xmesh
