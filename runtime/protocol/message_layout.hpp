// The layout of one message as bytes in a stream that has no frames of its own: a shared-memory
// ring (ring_links.hpp) and a TCP lane (tcp_lane.hpp) carry messages so. A 16-byte prefix (the
// total size of everything here, 8 bytes; the encoded header's length, 4; the frame count, 4),
// 8 bytes per frame length, the encoded header (wire.hpp), the frames. Little-endian, as every
// node of a cluster runs on the same architecture (the wire's own integers are so too).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "wire.hpp"

namespace xmesh {

constexpr size_t kLayoutPrefix = 16;

// One message laid out: `parts` views the prefix (owned here), the header and the frames, in
// order, without copying them; `total` is their joined size. Filled in place (a move of the
// prefix could leave the view of it behind), neither copied nor moved.
struct LaidOut {
  LaidOut(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames);
  LaidOut(const LaidOut&) = delete;
  LaidOut& operator=(const LaidOut&) = delete;
  std::string prefix;
  std::vector<std::string_view> parts;
  size_t total = 0;
};

// The bytes [offset, offset + length) of the joined parts, as slices of them (into `out`).
void slice_parts(const std::vector<std::string_view>& parts, size_t offset, size_t length,
                 std::vector<std::string_view>& out);

// The most a message may spend besides its frames (header, frame lengths): what a reader holds
// in memory for one message before its frames is bounded by this, not by the peer's word.
constexpr uint64_t kMaxLayoutOverhead = 64 << 20;

// What the prefix at the start of a message says; `overhead` is everything but the frames.
struct LayoutPrefix {
  uint64_t total = 0;
  uint32_t header_bytes = 0, count = 0;
  uint64_t overhead() const { return kLayoutPrefix + 8 * uint64_t(count) + header_bytes; }
  uint64_t payload() const { return total - overhead(); }  // the frames' bytes (total >= overhead)
};
// From the first `n` bytes of a message (n >= kLayoutPrefix): false when the prefix cannot
// start a message (its total smaller than what it says comes before the frames).
bool read_layout_prefix(const char* p, size_t n, LayoutPrefix* out);

// A whole laid-out message: false (with *error) when its parts do not add up to its bytes or
// its header does not decode. The frames are copied out.
bool decode_laid_out(const std::string& bytes, Message* out, std::string* error);
// The header alone from the start of a message (its first piece): false when it is not whole
// there or does not decode.
bool decode_laid_out_header(const std::string& start, Message* out);

}  // namespace xmesh
