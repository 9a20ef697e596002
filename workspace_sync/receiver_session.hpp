// The state of a sync being received (receiver.hpp), shared by the receiver's two halves:
// receiver.cpp (sessions, the host's manifest, begin, plan, data) and receiver_commit.cpp (the
// commit). Internal to workspace_sync/.
#pragma once
#include <xxhash.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "hash_index.hpp"
#include "manifest_file.hpp"
#include "receiver.hpp"

namespace xmesh::ws {

inline std::string sys_error(const std::string& what, int e) { return what + ": " + std::strerror(e); }

// One plan part's objects (the content its files need), held until all of their data came.
struct SyncReceiver::Part {
  struct Object {
    Hash128 hash;
    uint64_t size = 0, written = 0;
    std::string path;  // a path of the incoming manifest that has it (for messages)
    uint32_t mode = 0600;  // that path's permission bits, given to the staged file
    unique_fd fd;
    XXH3_state_t* state = nullptr;
    bool done = false;
  };
  std::vector<Object> objects;
  size_t left = 0;  // not complete yet
  Part() = default;
  Part(const Part&) = delete;
  Part& operator=(const Part&) = delete;
  ~Part() {
    for (auto& o : objects)
      if (o.state) XXH3_freeState(o.state);
  }
};

// A plan while its parts come: the host manifest merged with them through a cursor, the
// incoming manifest written aside (its digest and checks made as it goes).
struct SyncReceiver::Plan {
  bool delta = false;
  std::string want_digest;  // a delta's: what the result must be
  uint64_t next_part = 0;
  ManifestCursor host;
  CacheWriter out;
  DigestBuilder digest;
  ManifestChecker check;
  Plan(std::shared_ptr<const MappedManifest> host_m, const std::string& path)
      : host(std::move(host_m)), out(path, 0) {}
};

struct SyncReceiver::Session {
  std::string sid, dest, stage_dir;
  int64_t last_ms = 0;
  unique_fd stage;
  std::shared_ptr<const MappedManifest> host;  // what the host holds (its saved manifest)
  std::string host_digest;                     // hex
  std::unique_ptr<HashIndex> host_index;       // the host's files by content, made when first needed
  std::unique_ptr<Plan> plan;                  // while the plan's parts come
  std::shared_ptr<const MappedManifest> incoming;  // the manifest planned, once whole
  std::string incoming_digest;                     // hex
  std::map<uint64_t, std::unique_ptr<Part>> open_parts;  // parts whose data has not all come
  Part* filling = nullptr;                                // the part being planned
  std::unordered_set<Hash128, Hash128Hasher> asked;       // objects of open parts not complete yet
  uint64_t bytes = 0;
  std::string incoming_path() const { return stage_dir + "/incoming"; }
};

}  // namespace xmesh::ws
