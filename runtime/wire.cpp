#include "wire.hpp"

#include "build_info.hpp"

namespace xmesh {

int protocol_version() { return XMESH_PROTOCOL_VERSION; }

const std::string& version_string() {
  static const std::string v = XMESH_VERSION;
  return v;
}

const std::string& build_id() {
  static const std::string b = std::string(XMESH_VERSION) + "+" + XMESH_BUILD_TIME;
  return b;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Hello: return "hello";
    case Kind::Refuse: return "refuse";
    case Kind::Call: return "call";
    case Kind::Reply: return "reply";
    case Kind::SpawnActor: return "spawn-actor";
    case Kind::StopActor: return "stop-actor";
    case Kind::ProcReady: return "proc-ready";
    case Kind::PeerDead: return "peer-dead";
    case Kind::Fault: return "fault";
    case Kind::Cancel: return "cancel";
    case Kind::SpawnProcs: return "spawn-procs";
    case Kind::ProcExited: return "proc-exited";
    case Kind::Log: return "log";
    case Kind::StopProcs: return "stop-procs";
    case Kind::Heartbeat: return "heartbeat";
    case Kind::HeartbeatAck: return "heartbeat-ack";
    case Kind::Goodbye: return "goodbye";
    case Kind::Status: return "status";
    case Kind::Shutdown: return "shutdown";
  }
  return "unknown";
}

bool kind_known(int k) {
  return (k == 1 || k == 3) || (k >= 10 && k <= 17) || (k == 20) || (k >= 22 && k <= 28) || k == 30;
}

std::vector<uint8_t> encode_header(const Header& h) {
  json j = json::object();
  j["k"] = static_cast<int>(h.kind);
  j["s"] = h.sender;
  if (h.incarnation) j["i"] = h.incarnation;
  if (h.seq) j["q"] = h.seq;
  if (h.corr) j["c"] = h.corr;
  if (h.index >= 0) j["r"] = h.index;
  if (!h.actor.empty()) j["a"] = h.actor;
  if (!h.method.empty()) j["m"] = h.method;
  if (!h.ctx.is_null()) j["x"] = h.ctx;
  if (!h.body.is_null()) j["b"] = h.body;
  return json::to_cbor(j);
}

namespace {
bool get_uint(const json& j, const char* key, uint64_t& out, std::string& error) {
  auto it = j.find(key);
  if (it == j.end()) return true;
  if (!it->is_number_unsigned()) {
    error = std::string("header field '") + key + "' is not an unsigned integer";
    return false;
  }
  out = it->get<uint64_t>();
  return true;
}
bool get_string(const json& j, const char* key, std::string& out, std::string& error) {
  auto it = j.find(key);
  if (it == j.end()) return true;
  if (!it->is_string()) {
    error = std::string("header field '") + key + "' is not a string";
    return false;
  }
  out = it->get<std::string>();
  return true;
}
}  // namespace

std::optional<Header> decode_header(const void* data, size_t size, std::string& error) {
  if (size == 0) {
    error = "empty header frame";
    return std::nullopt;
  }
  if (size > (1u << 20)) {
    error = "header frame of " + std::to_string(size) + " bytes exceeds the 1 MiB header limit";
    return std::nullopt;
  }
  const auto* p = static_cast<const uint8_t*>(data);
  json j;
  try {
    // allow_exceptions=false is not enough: declared sizes beyond max_size() still throw.
    j = json::from_cbor(p, p + size, /*strict=*/true, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {
    error = std::string("header frame is not valid CBOR: ") + e.what();
    return std::nullopt;
  }
  if (j.is_discarded()) {
    error = "header frame is not valid CBOR";
    return std::nullopt;
  }
  if (!j.is_object()) {
    error = "header is not a map";
    return std::nullopt;
  }
  Header h;
  auto k = j.find("k");
  if (k == j.end() || !k->is_number_integer()) {
    error = "header has no message kind";
    return std::nullopt;
  }
  int64_t kind = k->get<int64_t>();
  if (kind < 0 || kind > 1000 || !kind_known(static_cast<int>(kind))) {
    error = "unknown message kind " + std::to_string(kind);
    return std::nullopt;
  }
  h.kind = static_cast<Kind>(kind);
  if (!get_string(j, "s", h.sender, error)) return std::nullopt;
  if (h.sender.empty()) {
    error = "header has no sender";
    return std::nullopt;
  }
  if (!get_uint(j, "i", h.incarnation, error)) return std::nullopt;
  if (!get_uint(j, "q", h.seq, error)) return std::nullopt;
  if (!get_uint(j, "c", h.corr, error)) return std::nullopt;
  auto r = j.find("r");
  if (r != j.end()) {
    if (!r->is_number_integer() || r->get<int64_t>() < 0) {
      error = "header field 'r' is not a non-negative integer";
      return std::nullopt;
    }
    h.index = r->get<int64_t>();
  }
  if (!get_string(j, "a", h.actor, error)) return std::nullopt;
  if (!get_string(j, "m", h.method, error)) return std::nullopt;
  auto x = j.find("x");
  if (x != j.end()) h.ctx = *x;
  auto b = j.find("b");
  if (b != j.end()) {
    if (!b->is_object()) {
      error = "header field 'b' is not a map";
      return std::nullopt;
    }
    h.body = *b;
  }
  return h;
}

size_t Message::payload_bytes() const {
  size_t n = 0;
  for (auto& f : frames) n += f.size();
  return n;
}

}  // namespace xmesh
