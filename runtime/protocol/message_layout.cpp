#include "message_layout.hpp"

#include <algorithm>
#include <cstring>

namespace xmesh {

namespace {
template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

template <class T>
T get(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
}  // namespace

LaidOut::LaidOut(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames) {
  total = kLayoutPrefix + 8 * frames.size() + header.size();
  for (auto& f : frames) total += f.size();
  prefix.reserve(kLayoutPrefix + 8 * frames.size());
  put<uint64_t>(prefix, total);
  put<uint32_t>(prefix, static_cast<uint32_t>(header.size()));
  put<uint32_t>(prefix, static_cast<uint32_t>(frames.size()));
  for (auto& f : frames) put<uint64_t>(prefix, f.size());
  parts.reserve(2 + frames.size());
  parts.emplace_back(prefix);
  parts.emplace_back(reinterpret_cast<const char*>(header.data()), header.size());
  for (auto& f : frames) parts.emplace_back(static_cast<const char*>(f.data()), f.size());
}

void slice_parts(const std::vector<std::string_view>& parts, size_t offset, size_t length,
                 std::vector<std::string_view>& out) {
  out.clear();
  for (auto& p : parts) {
    if (length == 0) break;
    if (offset >= p.size()) {
      offset -= p.size();
      continue;
    }
    size_t n = std::min(length, p.size() - offset);
    out.push_back(p.substr(offset, n));
    offset = 0;
    length -= n;
  }
}

bool read_layout_prefix(const char* p, size_t n, LayoutPrefix* out) {
  if (n < kLayoutPrefix) return false;
  out->total = get<uint64_t>(p);
  out->header_bytes = get<uint32_t>(p + 8);
  out->count = get<uint32_t>(p + 12);
  return out->total >= out->overhead();
}

bool decode_laid_out_header(const std::string& start, Message* out) {
  LayoutPrefix prefix;
  if (!read_layout_prefix(start.data(), start.size(), &prefix)) return false;
  uint64_t at = kLayoutPrefix + 8 * uint64_t(prefix.count);
  if (at > start.size() || prefix.header_bytes > start.size() - at) return false;
  std::string error;
  auto h = decode_header(start.data() + at, prefix.header_bytes, error);
  if (h) out->header = std::move(*h);
  return h.has_value();
}

bool decode_laid_out(const std::string& bytes, Message* out, std::string* error) {
  const char* p = bytes.data();
  size_t size = bytes.size();
  if (size < kLayoutPrefix) return *error = "a message shorter than its prefix", false;
  uint32_t header_bytes = get<uint32_t>(p + 8), count = get<uint32_t>(p + 12);
  size_t at = kLayoutPrefix;
  if (count > (size - at) / 8) return *error = "a frame count past the message", false;
  size_t body = at + 8 * size_t(count);
  if (header_bytes > size - body) return *error = "a header past the message", false;
  size_t offset = body + header_bytes;
  std::vector<uint64_t> lengths(count);
  for (uint32_t i = 0; i < count; ++i) {
    lengths[i] = get<uint64_t>(p + at + 8 * size_t(i));
    if (lengths[i] > size - offset) return *error = "a frame past the message", false;
    offset += lengths[i];
  }
  if (offset != size) return *error = "bytes after the last frame", false;
  auto header = decode_header(p + body, header_bytes, *error);
  if (!header) return false;
  out->header = std::move(*header);
  out->frames.clear();
  out->frames.reserve(count);
  offset = body + header_bytes;
  for (uint32_t i = 0; i < count; ++i) {
    out->frames.emplace_back(p + offset, lengths[i]);
    offset += lengths[i];
  }
  return true;
}

}  // namespace xmesh
