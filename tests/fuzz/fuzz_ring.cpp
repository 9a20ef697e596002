// libFuzzer target: what a node does with what a hostile same-host peer leaves in a ring it reads
// (runtime/transport/ring_links.hpp, shm_ring.hpp). The input is a sequence of steps: a record (a 2-byte
// length below 0xF000 and its bytes) written into a 4 KiB ring read by a RingReaders, or a poke
// (a byte from 0xF0, a byte, 8 bytes of value) of the ring's shared header (capacity, positions,
// futex words, closed flag) or its record area, as the peer's own code could scribble on the
// mapping. The reader must deliver whole messages, report those over its limit, or close the
// ring naming why, and never read outside the mapping or a record.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "ring_links.hpp"
#include "link_bodies.hpp"

using namespace xmesh;

namespace {
// Where a poke lands: the header's fields (shm_ring.cpp's layout), or the record area.
constexpr size_t kPokeAt[8] = {8, 16, 64, 128, 192, 256, 320, 4096};

void poke(char* shared, uint8_t op, uint8_t place, uint64_t value) {
  size_t at = kPokeAt[op & 7];
  if (at == 4096) at += place * 8;  // somewhere in the first 2 KiB of records
  std::memcpy(shared + at, &value, (op & 8) ? 4 : 8);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto ring = ShmRing::create(4096);
  RingReaders readers(100000);  // a small limit: the too-large path is reached too
  readers.enable();
  RingOfferBody offer{getpid(), ring.fd(), ring.token()};
  if (!readers.take_offer("ipc:///fuzz", offer).ok) __builtin_trap();
  readers.start_reading("ipc:///fuzz");
  RingReaders::Report report;
  auto deliver = [](Message& m) { return !m.header.sender.empty(); };  // a decoded header has one
  // The peer's own mapping of the ring, through which it scribbles.
  char* shared = static_cast<char*>(mmap(nullptr, 4096 + 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ring.fd(), 0));
  if (shared == MAP_FAILED) __builtin_trap();
  for (size_t at = 0; at + 2 <= size && !ring.closed();) {
    if (data[at] >= 0xF0) {
      if (at + 10 > size) break;
      uint64_t value;
      std::memcpy(&value, data + at + 2, 8);
      poke(shared, data[at], data[at + 1], value);
      at += 10;
      readers.poll(deliver, report);
      continue;
    }
    size_t n = std::min<size_t>(size_t(data[at]) | size_t(data[at + 1]) << 8, size - at - 2);
    n = std::min(n, ring.max_message());
    std::string_view record(reinterpret_cast<const char*>(data + at + 2), n);
    at += 2 + n;
    if (ring.write(record, 0) != ShmRing::Result::ok) break;
    readers.poll(deliver, report);
  }
  readers.poll(deliver, report);
  readers.poll(deliver, report);  // a closed ring is drained and forgotten by now
  if (ring.closed() && readers.reading() != 0) __builtin_trap();  // closed but still read
  munmap(shared, 8192);
  return 0;
}
