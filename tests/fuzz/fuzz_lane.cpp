// libFuzzer target: what a node does with the records of a TCP lane (runtime/transport/tcp_lane.hpp) from
// a writer holding the lane's key, whose plaintexts are anything. The input is a sequence of
// records, each a 2-byte length and its plaintext, sealed as the writer would and fed to a
// LaneOpener in cuts the input also decides; a length's top bit changes one byte of that sealed
// record (a record that must not open). The opener must give whole messages, report those over
// its limit, or break naming why (and stay broken), never reading outside what it was fed.
#include <cstdint>
#include <string>

#include "tcp_lane.hpp"

using namespace xmesh;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string key(kLaneKeyBytes, 'k');
  LaneSealer sealer(key);
  LaneOpener opener(key, 100000);  // a small limit: the too-large path is reached too
  bool broken = false;
  for (size_t at = 0; at + 2 <= size;) {
    size_t word = size_t(data[at]) | size_t(data[at + 1]) << 8;
    size_t n = std::min<size_t>(word & 0x7fff, size - at - 2);
    std::string_view plain(reinterpret_cast<const char*>(data + at + 2), n);
    at += 2 + n;
    std::string sealed;
    if (n == 0) continue;  // a writer never seals an empty record
    sealer.seal_bytes(plain, sealed);
    if (word & 0x8000) sealed[4 + n / 2] ^= 0x20;
    for (size_t cut = 0; cut < sealed.size();) {  // fed in pieces of 1 + (n % 97) bytes
      size_t piece = std::min(sealed.size() - cut, 1 + n % 97);
      opener.feed(sealed.data() + cut, piece);
      cut += piece;
      Message m;
      std::string error;
      uint64_t payload = 0;
      for (;;) {
        auto got = opener.next(&m, &error, &payload);
        if (got == LaneOpener::Got::nothing) break;
        if (got == LaneOpener::Got::broken) {
          if (error.empty()) __builtin_trap();  // broken says why
          broken = true;
          break;
        }
        if (broken) __builtin_trap();  // nothing comes out of a broken lane
        if (got == LaneOpener::Got::message && m.header.sender.empty()) __builtin_trap();  // a decoded header has one
        if (got == LaneOpener::Got::too_large && payload <= 100000) __builtin_trap();
      }
    }
  }
  return 0;
}
