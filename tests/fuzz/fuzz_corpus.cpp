// Writes the fuzzers' seed corpora from real messages: a header of every kind with the body it
// carries in use (wire/), the records of messages on a ring (ring/), and the steps of a real
// workspace sync of a small tree (sync/).
// Usage: fuzz_corpus OUT_DIR
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "agent_bodies.hpp"
#include "bodies.hpp"
#include "cast_bodies.hpp"
#include "link_bodies.hpp"
#include "node_bodies.hpp"
#include "message_layout.hpp"
#include "ring_links.hpp"
#include "scan.hpp"
#include "wire.hpp"

using namespace xmesh;

namespace {
int written = 0;

void put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  ++written;
}

void put_header(const std::string& dir, Kind kind, json body, const std::string& method = "") {
  Header h;
  h.kind = kind;
  h.sender = "controller-host-1234-abcd";
  h.incarnation = 77;
  h.seq = 3;
  h.corr = 9;
  h.index = 1;
  h.actor = "trainer";
  h.method = method;
  h.ctx = {{"cell", "c1"}, {"call", 4}};
  h.body = std::move(body);
  auto bytes = encode_header(h);
  put(dir + "/" + kind_name(kind) + "-" + std::to_string(written), std::string(bytes.begin(), bytes.end()));
}

void wire_corpus(const std::string& dir) {
  HelloBody hello;
  hello.proto = protocol_version();
  hello.version = version_string();
  hello.addr = "ipc:///run/xmesh/c/1.sock";
  hello.role = "controller";
  hello.reply_cookie = std::string(64, 'a');
  hello.pid = 1234;
  hello.max_message_bytes = 1 << 30;
  put_header(dir, Kind::Hello, hello);
  put_header(dir, Kind::Call, nullptr, "step");
  put_header(dir, Kind::Reply, {{"m", 12}});
  put_header(dir, Kind::Reply, error_body(ErrorKind::Actor, "ValueError: x"));
  put_header(dir, Kind::Refuse, RefuseBody{"wrong protocol", "ipc:///x"});
  ProcExitedBody exited;
  exited.alloc = "1f";
  exited.rank = 2;
  exited.pid = 99;
  exited.addr = "ipc:///run/xmesh/p/2.sock";
  exited.text = "proc rank 2 exited with code 1";
  exited.exit_code = 1;
  put_header(dir, Kind::ProcExited, exited);
  SpawnProcsBody spawn;
  spawn.alloc = "2a";
  spawn.argv = {"/usr/bin/python3", "-m", "xmesh._proc.worker"};
  spawn.env = {{"XMESH_JOB_COOKIE", "c0ffee"}};
  SpawnRank r;
  r.rank = 0;
  r.coords = {{"gpus", 0}};
  spawn.ranks = {r};
  put_header(dir, Kind::SpawnProcs, spawn);
  put_header(dir, Kind::StopProcs, {{"name", "job"}});
  put_header(dir, Kind::Attach, {{"name", "job"}, {"observe", true}, {"controller_pid", 5}});
  put_header(dir, Kind::Adopt, {{"cookies", {"c1"}}, {"refuse", {"ipc://old"}}, {"refuse_text", "taken"}});
  put_header(dir, Kind::Log, {{"rank", 1}, {"stream", 1}, {"actor", "a"}});
  put_header(dir, Kind::Sync, {{"op", "begin"}, {"sid", "ab12"}, {"dest", ""}, {"digest", std::string(32, '0')}});
  put_header(dir, Kind::DebugCommand, {{"cmd", "continue"}});
  CastBody cast;  // a cast tree's message and its answers (cast_tree.hpp)
  cast.origin = "tcp://10.0.0.1:7000";
  cast.origin_id = "controller-x-1-ab";
  cast.fanout = 3;
  cast.behind = {CastTarget{"tcp://10.0.0.2:7000/1", "a", 1, 4, "ipc:///r/p1.sock"},
                 CastTarget{"tcp://10.0.0.2:7000/2", "a", 2, 4, ""}};
  put_header(dir, Kind::Call, {{"cast", cast}}, "step");
  put_header(dir, Kind::Replies, RepliesBody{"tcp://10.0.0.1:7000", {ReplyEntry{1, true, nullptr, 0},
                                                                     ReplyEntry{2, false, error_body(ErrorKind::Actor, "x"), 0}}});
  put_header(dir, Kind::CastLost, CastLostBody{{3, 4}, std::string("controller-x-1-ab")});
  Header big;
  big.kind = Kind::SpawnActor;
  big.sender = "proc-x";
  big.pieces = {1, 3, 1};
  auto bytes = encode_header(big);
  put(dir + "/pieces", std::string(bytes.begin(), bytes.end()));
}

// The input fuzz_sync_receiver reads: [u16 header length][wire header][4-byte length, frame]...
std::string step(const json& body, const std::vector<std::string>& frames) {
  Header h;
  h.kind = Kind::Sync;
  h.sender = "controller-host-1234-abcd";
  h.seq = 5;
  h.corr = 6;
  h.body = body;
  auto header = encode_header(h);
  std::string out;
  out += static_cast<char>(header.size() >> 8);
  out += static_cast<char>(header.size() & 0xff);
  out.append(header.begin(), header.end());
  for (auto& f : frames) {
    uint32_t n = static_cast<uint32_t>(f.size());
    for (int shift : {24, 16, 8, 0}) out += static_cast<char>((n >> shift) & 0xff);
    out += f;
  }
  return out;
}

void sync_corpus(const std::string& dir, const std::string& scratch) {
  mkdir((scratch + "/pkg").c_str(), 0700);
  std::ofstream(scratch + "/pkg/mod.py") << "VALUE = 1\n";
  std::ofstream(scratch + "/run.sh") << "#!/bin/sh\necho hi\n";
  ws::ScanResult s = ws::scan_tree(scratch, {}, nullptr);
  const std::string digest = s.manifest.digest().hex();
  put(dir + "/begin", step({{"op", "begin"}, {"sid", "ab12"}, {"dest", ""}, {"digest", digest}}, {}));
  put(dir + "/plan", step({{"op", "plan"}, {"sid", "ab12"}}, {s.manifest.encode_wire()}));
  put(dir + "/data", step({{"op", "data"}, {"sid", "ab12"}, {"pieces", {{0, 0, 10, 10, 0}}}}, {"VALUE = 1\n"}));
  put(dir + "/commit", step({{"op", "commit"}, {"sid", "ab12"}}, {}));
  put(dir + "/abort", step({{"op", "abort"}, {"sid", "ab12"}}, {}));
}
}  // namespace

// A Call of the trainer's step with one frame of `size` bytes: its encoded header (frames filled).
std::vector<uint8_t> step_call(size_t size, std::vector<zmq::message_t>& frames) {
  Header h;
  h.kind = Kind::Call;
  h.sender = "controller-host-1234-abcd";
  h.corr = 9;
  h.actor = "trainer";
  h.method = "step";
  frames.emplace_back(size);
  std::memset(frames.back().data(), 'x', size);
  return encode_header(h);
}

// Records as a RingWriter writes them (one message of one record, one of several), each as the
// fuzz_ring input format: a 2-byte length, the record.
void ring_corpus(const std::string& dir) {
  const size_t sizes[] = {0, 10, 3000, 9000, 200000};
  for (size_t size : sizes) {
    RingWriter writer(4096);
    ShmRing raw = ShmRing::attach(writer.offer().fd);
    std::vector<zmq::message_t> frames;
    auto header = step_call(size, frames);
    std::string input, record;
    // Written and read in turns (a 4 KiB ring holds a few records): the records as they came.
    std::thread reader([&] {
      for (;;) {
        auto r = raw.read(record, 2000);
        if (r != ShmRing::Result::ok) return;
        input.push_back(static_cast<char>(record.size() & 0xff));
        input.push_back(static_cast<char>(record.size() >> 8));
        input += record;
      }
    });
    writer.write(header, frames, true, 2000);
    usleep(20000);
    raw.close();
    reader.join();
    if (input.size() <= 65536) put(dir + "/call-" + std::to_string(size), input);
  }
}

// Plaintexts of lane records as a LaneSealer cuts messages (small ones: one record each; one
// message of two records), in the fuzz_lane input format: a 2-byte length, the plaintext.
void lane_corpus(const std::string& dir) {
  const size_t sizes[] = {0, 10, 3000, 9000};
  std::string two;
  for (size_t size : sizes) {
    std::vector<zmq::message_t> frames;
    auto header = step_call(size, frames);
    LaidOut laid(header, frames);
    std::string plain;
    for (auto& p : laid.parts) plain.append(p);
    std::string input;
    for (size_t at = 0; at < plain.size(); at += 4000) {  // records of 4000 bytes: several for 9000
      std::string piece = plain.substr(at, 4000);
      input.push_back(static_cast<char>(piece.size() & 0xff));
      input.push_back(static_cast<char>(piece.size() >> 8));
      input += piece;
    }
    two += input;
    put(dir + "/call-" + std::to_string(size), input);
  }
  put(dir + "/calls", two);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_corpus OUT_DIR\n");
    return 2;
  }
  const std::string out = argv[1];
  for (const char* sub : {"", "/wire", "/sync", "/tree", "/ring", "/lane"}) mkdir((out + sub).c_str(), 0700);
  wire_corpus(out + "/wire");
  ring_corpus(out + "/ring");
  lane_corpus(out + "/lane");
  sync_corpus(out + "/sync", out + "/tree");
  std::printf("fuzz_corpus: %d seeds in %s\n", written, out.c_str());
  return 0;
}
