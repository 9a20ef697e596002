// libFuzzer target: the host agent's workspace-sync receiver fed one step from a peer, the way
// the agent gets it. The input is [u16 header length][wire header][frames, each after its 4-byte
// length]; the header goes through the node's decoder and its body through the typed read, as in
// the agent; the receiver must apply the step or refuse it with a message, and never write
// outside its root (checked after each run).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "receiver.hpp"
#include "wire.hpp"
#include "sync_bodies.hpp"

namespace fs = std::filesystem;

namespace {
const std::string& scratch() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/xmesh-fuzz-sync-XXXXXX";
    std::string d = mkdtemp(tmpl);
    fs::create_directories(d + "/root");
    return d;
  }();
  return dir;
}

// Everything under the scratch directory must stay inside root/.
void check_contained() {
  for (auto& e : fs::directory_iterator(scratch()))
    if (e.path().filename() != "root") __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static xmesh::ws::SyncReceiver receiver(scratch() + "/root", 60000);
  static int64_t now = 1;
  if (size < 2) return 0;
  size_t header_len = (size_t(data[0]) << 8) | data[1];
  if (header_len > size - 2) return 0;
  std::string error;
  auto header = xmesh::decode_header(data + 2, header_len, error);
  if (!header) return 0;  // dropped by the node before the agent (fuzz_wire covers the decoder)
  std::vector<std::string_view> frames;
  size_t pos = 2 + header_len;
  while (pos + 4 <= size) {
    uint32_t n = (uint32_t(data[pos]) << 24) | (uint32_t(data[pos + 1]) << 16) | (uint32_t(data[pos + 2]) << 8) | data[pos + 3];
    pos += 4;
    if (n > size - pos) break;
    frames.emplace_back(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
  }
  auto step = xmesh::read_as<xmesh::SyncStepBody>(header->body);
  if (!step) return 0;  // refused before the receiver (test_workspace_sync.cpp covers the message)
  step->space = "c-fuzz";  // as the agent sets it, never from the wire
  fs::create_directories(scratch() + "/root/c-fuzz");
  try {
    (void)receiver.handle_step(*step, frames, now += 10);
  } catch (const std::exception&) {
    // refused, with a message for the controller: what a peer's bad step should get
  }
  check_contained();
  return 0;
}
