// Helpers of the workspace sync tests: temporary trees, files, manifest entries, and a
// receiver driven through whole syncs as the controller would drive it.
#pragma once
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <zstd.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fs_ops.hpp"
#include "manifest.hpp"
#include "plan_parts.hpp"
#include "receiver.hpp"
#include "scan.hpp"

namespace xmesh::ws::testing {

using json = nlohmann::json;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/xmesh-ws-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { remove_tree(path); }
};

inline void write(const std::string& path, const std::string& text) {
  size_t slash = path.rfind('/');
  make_dirs_path(path.substr(0, slash));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

inline std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

inline std::vector<std::string> paths(const Manifest& m) {
  std::vector<std::string> out;
  for (auto& e : m.entries) out.push_back(e.path);
  return out;
}

// The delta the controller plans from base to target (PlanParts), its parts put together.
struct Delta {
  Manifest upserts, deleted;
};
inline Delta delta_of(const Manifest& base, const Manifest& target) {
  PlanParts parts(mapped_copy(target), mapped_copy(base));
  Delta d;
  PlanPart p;
  while (parts.next(p)) {
    for (auto& e : Manifest::decode_wire(p.frames.at(0)).entries) d.upserts.entries.push_back(e);
    for (auto& e : Manifest::decode_wire(p.frames.at(1)).entries) d.deleted.entries.push_back(e);
  }
  return d;
}

inline Entry file_entry(const std::string& path, const std::string& content, uint32_t mode = 0644) {
  Entry e;
  e.path = path;
  e.type = EntryType::File;
  e.mode = mode;
  e.size = content.size();
  e.hash = hash_bytes(content.data(), content.size());
  return e;
}

inline Entry dir_entry(const std::string& path) {
  Entry e;
  e.path = path;
  e.type = EntryType::Dir;
  e.mode = 0755;
  return e;
}

// Sends the content one plan part asked for (its need frame) as the controller would (in 7-byte
// pieces, alternately zstd-compressed, to exercise both paths).
inline void send_need(SyncReceiver& r, const std::string& src, const Manifest& m, const std::string& sid,
                      const std::string& need, uint64_t part = 0) {
  for (size_t i = 0; i * 16 < need.size(); ++i) {
    Hash128 h;
    std::memcpy(&h.lo, need.data() + i * 16, 8);
    std::memcpy(&h.hi, need.data() + i * 16 + 8, 8);
    const Entry* e = nullptr;
    for (auto& x : m.entries)
      if (x.type == EntryType::File && x.hash == h) e = &x;
    REQUIRE(e);
    std::string content = read(src + "/" + e->path);
    for (size_t off = 0; off < content.size(); off += 7) {
      std::string piece = content.substr(off, 7);
      std::string stored = piece;
      int z = 0;
      if ((off / 7) % 2) {
        stored.resize(ZSTD_compressBound(piece.size()));
        stored.resize(ZSTD_compress(stored.data(), stored.size(), piece.data(), piece.size(), 1));
        z = 1;
      }
      r.handle({{"op", "data"}, {"sid", sid}, {"part", part},
                {"pieces", json::array({json::array({i, off, piece.size(), stored.size(), z})})}},
               {stored}, 0);
    }
  }
}

// The same for a plan of one part, then the commit; returns the commit's reply.
inline json send_and_commit(SyncReceiver& r, const std::string& src, const Manifest& m, const std::string& sid,
                            const std::string& need) {
  send_need(r, src, m, sid, need);
  return r.handle({{"op", "commit"}, {"sid", sid}}, {}, 0).body;
}

// Drives a receiver through one whole sync of the local tree src.
inline json push_tree(SyncReceiver& r, const std::string& src, const std::string& dest, const std::string& sid = "ab12") {
  ScanResult s = scan_tree(src, {}, nullptr);
  auto begin = r.handle({{"op", "begin"}, {"sid", sid}, {"dest", dest}, {"digest", s.manifest.digest().hex()}}, {}, 0);
  if (begin.body.value("same", false)) return begin.body;
  auto plan = r.handle({{"op", "plan"}, {"sid", sid}}, {s.manifest.encode_wire()}, 0);
  return send_and_commit(r, src, s.manifest, sid, plan.frames.at(0));
}

// Drives a receiver through one sync of a manifest without file content (directories, links).
inline json push_manifest(SyncReceiver& r, const Manifest& m, const std::string& sid, const std::string& dest = "") {
  r.handle({{"op", "begin"}, {"sid", sid}, {"dest", dest}, {"digest", m.digest().hex()}}, {}, 0);
  auto plan = r.handle({{"op", "plan"}, {"sid", sid}}, {m.encode_wire()}, 0);
  REQUIRE(plan.frames.at(0).empty());
  return r.handle({{"op", "commit"}, {"sid", sid}}, {}, 0).body;
}

}  // namespace xmesh::ws::testing

using namespace xmesh::ws;
using namespace xmesh::ws::testing;
