#include "wire.hpp"

#include "bodies.hpp"

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
#define XMESH_KIND(name, number, wire_name) \
  case Kind::name:                          \
    return wire_name;
#include "kinds.def"
#undef XMESH_KIND
  }
  return "unknown";
}

bool kind_known(int k) {
  switch (k) {
#define XMESH_KIND(name, number, wire_name) case number:
#include "kinds.def"
#undef XMESH_KIND
    return true;
    default:
      return false;
  }
}

const char* error_kind_name(ErrorKind k) {
  switch (k) {
#define XMESH_ERROR(name, wire_name) \
  case ErrorKind::name:              \
    return wire_name;
#include "errors.def"
#undef XMESH_ERROR
  }
  return "unknown";
}

std::optional<ErrorKind> error_kind_of(const json& body) {
  if (!body.is_object()) return std::nullopt;
  auto it = body.find("kind");
  if (it == body.end() || !it->is_string()) return std::nullopt;
  const std::string& k = it->get_ref<const std::string&>();
#define XMESH_ERROR(name, wire_name) \
  if (k == wire_name) return ErrorKind::name;
#include "errors.def"
#undef XMESH_ERROR
  return std::nullopt;
}

json error_body(ErrorKind k, const std::string& text) {
  ErrorBody b;
  b.kind = error_kind_name(k);
  b.text = text;
  return b;
}

namespace {
// Minimal CBOR writing for the fixed header fields.
void put_head(std::vector<uint8_t>& out, uint8_t major, uint64_t v) {
  major = static_cast<uint8_t>(major << 5);
  if (v < 24) {
    out.push_back(static_cast<uint8_t>(major | v));
  } else if (v <= 0xff) {
    out.push_back(major | 24);
    out.push_back(static_cast<uint8_t>(v));
  } else if (v <= 0xffff) {
    out.push_back(major | 25);
    for (int s = 8; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
  } else if (v <= 0xffffffffULL) {
    out.push_back(major | 26);
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
  } else {
    out.push_back(major | 27);
    for (int s = 56; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
  }
}
void put_key(std::vector<uint8_t>& out, char k) {
  out.push_back(0x61);  // text string of length 1
  out.push_back(static_cast<uint8_t>(k));
}
void put_text(std::vector<uint8_t>& out, const std::string& t) {
  put_head(out, 3, t.size());
  out.insert(out.end(), t.begin(), t.end());
}
}  // namespace

std::vector<uint8_t> encode_header(const Header& h) {
  std::vector<uint8_t> out;
  out.reserve(64 + h.sender.size() + h.actor.size() + h.method.size());
  uint64_t n = 2 + (h.incarnation != 0) + (h.seq != 0) + (h.oseq != 0) + (h.corr != 0) + (h.index >= 0) + h.ok + !h.actor.empty() +
               !h.method.empty() + !h.ctx.is_null() + !h.body.is_null() + !h.pieces.empty();
  put_head(out, 5, n);
  put_key(out, 'k');
  put_head(out, 0, static_cast<uint64_t>(h.kind));
  put_key(out, 's');
  put_text(out, h.sender);
  if (h.incarnation) put_key(out, 'i'), put_head(out, 0, h.incarnation);
  if (h.seq) put_key(out, 'q'), put_head(out, 0, h.seq);
  if (h.oseq) put_key(out, 'u'), put_head(out, 0, h.oseq);
  if (h.corr) put_key(out, 'c'), put_head(out, 0, h.corr);
  if (h.index >= 0) put_key(out, 'r'), put_head(out, 0, static_cast<uint64_t>(h.index));
  if (h.ok) put_key(out, 'o'), out.push_back(0xf5);
  if (!h.actor.empty()) put_key(out, 'a'), put_text(out, h.actor);
  if (!h.method.empty()) put_key(out, 'm'), put_text(out, h.method);
  if (!h.ctx.is_null()) put_key(out, 'x'), json::to_cbor(h.ctx, out);
  if (!h.body.is_null()) put_key(out, 'b'), json::to_cbor(h.body, out);
  if (!h.pieces.empty()) {
    put_key(out, 'z');
    put_head(out, 4, h.pieces.size());
    for (uint64_t n : h.pieces) put_head(out, 0, n);
  }
  return out;
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

namespace {
// Walks a CBOR item without recursion and says whether it is one well-formed item within the
// bounds, before nlohmann's recursive decoder sees it: a header nested 40,000 levels deep would
// otherwise overflow the I/O thread's stack (one message, before any Hello, killed any node).
// Definite lengths only (our encoder writes no other), at most kMaxHeaderDepth levels, and no
// declared count or length beyond the bytes that are there.
constexpr size_t kMaxHeaderDepth = 32;

bool cbor_within_bounds(const uint8_t* p, const uint8_t* end, std::string& error) {
  // Runs for every header the fast reader leaves to the general decoder (a call with a cell
  // context is one): no allocation.
  uint64_t open[kMaxHeaderDepth];  // items still to read in each enclosing array or map
  size_t depth = 0;
  uint64_t pending = 1;            // items still to read at the current level
  while (true) {
    while (pending == 0) {
      if (depth == 0) {
        if (p != end) error = "header frame has bytes after its map";
        return p == end;
      }
      pending = open[--depth];
    }
    if (p >= end) {
      error = "header frame ends inside an item";
      return false;
    }
    uint8_t major = *p >> 5, info = *p & 0x1f;
    ++p;
    uint64_t n = info;
    if (info >= 24 && info <= 27) {
      size_t width = size_t(1) << (info - 24);
      if (static_cast<size_t>(end - p) < width) {
        error = "header frame ends inside an item";
        return false;
      }
      n = 0;
      for (size_t i = 0; i < width; ++i) n = (n << 8) | *p++;
    } else if (info > 27) {
      error = "header frame holds an indefinite-length or reserved item";
      return false;
    }
    --pending;
    size_t left = static_cast<size_t>(end - p);
    switch (major) {
      case 2:
      case 3:  // byte and text strings
        if (n > left) {
          error = "header frame declares a string longer than the frame";
          return false;
        }
        p += n;
        break;
      case 4:
      case 5: {  // arrays and maps: their items are read next, one level down
        uint64_t items = major == 5 ? n * 2 : n;
        if (n > left || items > left) {
          error = "header frame declares more items than it has bytes";
          return false;
        }
        if (depth == kMaxHeaderDepth) {
          error = "header frame nests deeper than " + std::to_string(kMaxHeaderDepth) + " levels";
          return false;
        }
        open[depth++] = pending;
        pending = items;
        break;
      }
      case 6:  // a tag: one item follows
        ++pending;
        break;
      default:  // integers, simple values and floats: nothing follows
        break;
    }
  }
}
}  // namespace

namespace {
// The frame as a CBOR map, checked before the recursive decoder sees it (nullopt, error).
std::optional<json> cbor_map(const void* data, size_t size, std::string& error) {
  if (size == 0) {
    error = "empty header frame";
    return std::nullopt;
  }
  if (size > kMaxHeaderBytes) {
    error = "header frame of " + std::to_string(size) + " bytes exceeds the 1 MiB header limit";
    return std::nullopt;
  }
  const auto* p = static_cast<const uint8_t*>(data);
  if (!cbor_within_bounds(p, p + size, error)) return std::nullopt;
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
  return j;
}

// Who sent it and where it stands in the sender's streams: kind, sender, incarnation, seq,
// order number, correlation id.
bool read_routing_fields(const json& j, Header& h, std::string& error) {
  auto k = j.find("k");
  if (k == j.end() || !k->is_number_integer()) {
    error = "header has no message kind";
    return false;
  }
  int64_t kind = k->get<int64_t>();
  if (kind < 0 || kind > 1000 || !kind_known(static_cast<int>(kind))) {
    error = "unknown message kind " + std::to_string(kind);
    return false;
  }
  h.kind = static_cast<Kind>(kind);
  if (!get_string(j, "s", h.sender, error)) return false;
  if (h.sender.empty()) {
    error = "header has no sender";
    return false;
  }
  return get_uint(j, "i", h.incarnation, error) && get_uint(j, "q", h.seq, error) &&
         get_uint(j, "u", h.oseq, error) && get_uint(j, "c", h.corr, error);
}

// What it says: target index, ok, actor, method, causal context, body, frame pieces.
bool read_content_fields(const json& j, Header& h, std::string& error) {
  auto r = j.find("r");
  if (r != j.end()) {
    if (!r->is_number_integer() || r->get<int64_t>() < 0) {
      error = "header field 'r' is not a non-negative integer";
      return false;
    }
    h.index = r->get<int64_t>();
  }
  auto o = j.find("o");
  if (o != j.end()) {
    if (!o->is_boolean()) {
      error = "header field 'o' is not a boolean";
      return false;
    }
    h.ok = o->get<bool>();
  }
  if (!get_string(j, "a", h.actor, error) || !get_string(j, "m", h.method, error)) return false;
  auto x = j.find("x");
  if (x != j.end()) h.ctx = *x;
  auto b = j.find("b");
  if (b != j.end()) {
    if (!b->is_object()) {
      error = "header field 'b' is not a map";
      return false;
    }
    h.body = *b;
  }
  auto z = j.find("z");
  if (z == j.end()) return true;
  if (!z->is_array() || z->empty()) {
    error = "header field 'z' is not a list of piece counts";
    return false;
  }
  for (auto& n : *z) {
    if (!n.is_number_unsigned() || n.get<uint64_t>() == 0) {
      error = "header field 'z' holds a piece count that is not a positive integer";
      return false;
    }
    h.pieces.push_back(n.get<uint64_t>());
  }
  return true;
}
}  // namespace

std::optional<Header> decode_header_general(const void* data, size_t size, std::string& error) {
  auto j = cbor_map(data, size, error);
  if (!j) return std::nullopt;
  Header h;
  if (!read_routing_fields(*j, h, error) || !read_content_fields(*j, h, error)) return std::nullopt;
  return h;
}

namespace {
// The fast path reads exactly what encode_header writes (plus any key order); on anything else
// it gives up and the general decoder decides, so the two never disagree on what is valid.
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool head(uint8_t& major, uint64_t& v) {
    if (p >= end) return false;
    uint8_t b = *p++;
    major = b >> 5;
    uint8_t ai = b & 31;
    if (ai < 24) {
      v = ai;
      return true;
    }
    int len = ai == 24 ? 1 : ai == 25 ? 2 : ai == 26 ? 4 : ai == 27 ? 8 : 0;
    if (len == 0 || end - p < len) return false;
    v = 0;
    for (int i = 0; i < len; ++i) v = (v << 8) | *p++;
    return true;
  }
  bool uint(uint64_t& v) {
    uint8_t major;
    return head(major, v) && major == 0;
  }
  bool text(std::string& out) {
    uint8_t major;
    uint64_t n;
    if (!head(major, n) || major != 3 || static_cast<uint64_t>(end - p) < n) return false;
    out.assign(reinterpret_cast<const char*>(p), n);
    p += n;
    return true;
  }
};
}  // namespace

std::optional<Header> decode_header(const void* data, size_t size, std::string& error) {
  if (size > 0 && size <= kMaxHeaderBytes) {
    Reader r{static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + size};
    Header h;
    uint8_t major;
    uint64_t n;
    bool fast = r.head(major, n) && major == 5 && n <= 13;
    bool have_kind = false;
    for (uint64_t i = 0; fast && i < n; ++i) {
      std::string key;
      if (!r.text(key) || key.size() != 1) {
        fast = false;
        break;
      }
      uint64_t v = 0;
      switch (key[0]) {
        case 'k':
          fast = r.uint(v) && v <= 1000 && kind_known(static_cast<int>(v));
          h.kind = static_cast<Kind>(v);
          have_kind = true;
          break;
        case 's': fast = r.text(h.sender); break;
        case 'i': fast = r.uint(h.incarnation); break;
        case 'q': fast = r.uint(h.seq); break;
        case 'u': fast = r.uint(h.oseq); break;
        case 'c': fast = r.uint(h.corr); break;
        case 'r':
          fast = r.uint(v) && v <= static_cast<uint64_t>(INT64_MAX);
          h.index = static_cast<int64_t>(v);
          break;
        case 'o':
          fast = r.p < r.end && (*r.p == 0xf5 || *r.p == 0xf4);
          if (fast) h.ok = *r.p++ == 0xf5;
          break;
        case 'a': fast = r.text(h.actor); break;
        case 'm': fast = r.text(h.method); break;
        case 'x': {  // a call's context is its cell's id, a string: anything else, the general decoder
          std::string cell;
          fast = r.text(cell);
          if (fast) h.ctx = std::move(cell);
          break;
        }
        default: fast = false;  // body, unknown keys: the general decoder
      }
    }
    if (fast && have_kind && !h.sender.empty() && r.p == r.end) return h;
  }
  return decode_header_general(data, size, error);
}

size_t Message::payload_bytes() const {
  size_t n = 0;
  for (auto& f : frames) n += f.size();
  return n;
}

std::vector<zmq::message_t> copy_frames(const std::vector<zmq::message_t>& frames) {
  std::vector<zmq::message_t> copy(frames.size());
  for (size_t f = 0; f < frames.size(); ++f) copy[f].copy(const_cast<zmq::message_t&>(frames[f]));  // shares large buffers
  return copy;
}

}  // namespace xmesh
