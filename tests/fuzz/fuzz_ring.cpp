// libFuzzer target: what a node does with the records a peer writes into a ring it reads (a
// same-host link, runtime/ring_links.hpp). The input is a sequence of records, each a 2-byte
// length and its bytes, written into a 4 KiB ring read by a RingReaders; it must deliver whole
// messages, report those over its limit, or close the ring naming why, and never read outside
// the ring or a record.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "ring_links.hpp"

using namespace xmesh;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto ring = ShmRing::create(4096);
  RingReaders readers(100000);  // a small limit: the too-large path is reached too
  readers.enable();
  RingOfferBody offer{getpid(), ring.fd(), ring.token()};
  if (!readers.take_offer("ipc:///fuzz", offer).ok) __builtin_trap();
  readers.start_reading("ipc:///fuzz");
  RingReaders::Report report;
  auto deliver = [](Message& m) { return !m.header.sender.empty(); };  // a decoded header has one
  for (size_t at = 0; at + 2 <= size && !ring.closed();) {
    size_t n = std::min<size_t>(size_t(data[at]) | size_t(data[at + 1]) << 8, size - at - 2);
    n = std::min(n, ring.max_message());
    std::string_view record(reinterpret_cast<const char*>(data + at + 2), n);
    at += 2 + n;
    if (ring.write(record, 0) != ShmRing::Result::ok) break;
    readers.poll(deliver, report);
  }
  readers.poll(deliver, report);
  if (ring.closed() && report.broken.empty() && readers.reading() != 0) __builtin_trap();  // closed but still read
  return 0;
}
