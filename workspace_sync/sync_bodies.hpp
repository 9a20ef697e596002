// The bodies of a workspace sync's messages (workspace_sync/): its steps to each host, their answers,
// the reload of synced modules in live procs.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bodies.hpp"
#include "wire.hpp"

namespace xmesh {

// Sync (controller -> agent): one step of a workspace sync (workspace_sync/README.md): begin,
// plan, data, commit or abort of the session sid.
struct SyncStepBody {
  static constexpr const char* what = "Sync";
  static constexpr Kind kind = Kind::Sync;  // the message it is the body of
  std::string op;      // "begin", "plan", "data", "commit", "abort"
  std::string sid;     // the session: 1-32 lowercase hex digits
  std::string dest;    // begin: where under the workspace (relative; "" the space itself)
  std::string digest;  // begin, delta plan: the digest of the controller's manifest
  std::string for_alloc;  // begin: a named allocation's workspace ("" the sender's own)
  std::string space;      // set by the agent (never taken from the wire): the space begin uses
  std::optional<std::string> base;  // plan: the host manifest the delta is against
  // plan: the manifest comes in parts in path order, numbered from 0, the last one saying so;
  // data: the plan part whose objects its pieces fill.
  uint64_t part = 0;
  bool last = true;
  // data: [object index within its part's need list, offset, raw length, stored length, zstd (1)
  // or raw (0)] per piece, their bytes back to back in the payload frame.
  std::vector<std::array<uint64_t, 5>> pieces;
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("op", &SyncStepBody::op, Need::Required);
    f("sid", &SyncStepBody::sid, Need::Required);
    f("dest", &SyncStepBody::dest, Need::Optional);
    f("digest", &SyncStepBody::digest, Need::Optional);
    f("for", &SyncStepBody::for_alloc, Need::Optional);
    f("base", &SyncStepBody::base, Need::Optional);
    f("part", &SyncStepBody::part, Need::Optional);
    f("last", &SyncStepBody::last, Need::Optional);
    f("pieces", &SyncStepBody::pieces, Need::Optional);
  }
};
XMESH_BODY_JSON(SyncStepBody)

// What a host answers to a Sync step (only the fields of that step are set).
struct SyncReply {
  static constexpr const char* what = "Sync reply";
  std::optional<bool> same;          // begin: the host's copy already has this digest
  std::optional<std::string> dir;    // begin, commit: the directory on the host
  std::optional<std::string> have;   // begin: the digest of the host's manifest
  std::optional<uint64_t> entries;   // begin (same): entries of the host's copy
  std::optional<bool> full;          // plan: send the whole manifest (the delta did not fit)
  std::optional<uint64_t> need;      // plan: objects asked for (their hashes: the reply frame)
  std::optional<uint64_t> received;  // data: bytes of this session so far
  std::optional<bool> aborted;
  // commit: what changed on the host (counts of files and links; the paths travel as frames).
  std::optional<uint64_t> added, changed, deleted, unchanged, bytes_received;
  std::optional<std::vector<std::string>> kept;  // old directories that could not be removed
  template <class F>
  static void fields(F&& f) {
    f("same", &SyncReply::same, Need::Optional);
    f("dir", &SyncReply::dir, Need::Optional);
    f("have", &SyncReply::have, Need::Optional);
    f("entries", &SyncReply::entries, Need::Optional);
    f("full", &SyncReply::full, Need::Optional);
    f("need", &SyncReply::need, Need::Optional);
    f("received", &SyncReply::received, Need::Optional);
    f("aborted", &SyncReply::aborted, Need::Optional);
    f("added", &SyncReply::added, Need::Optional);
    f("changed", &SyncReply::changed, Need::Optional);
    f("deleted", &SyncReply::deleted, Need::Optional);
    f("unchanged", &SyncReply::unchanged, Need::Optional);
    f("bytes_received", &SyncReply::bytes_received, Need::Optional);
    f("kept", &SyncReply::kept, Need::Optional);
  }
};
XMESH_BODY_JSON(SyncReply)

// Reload (controller -> actor host): reload the modules of these synced files.
struct ReloadBody {
  static constexpr const char* what = "Reload";
  static constexpr Kind kind = Kind::Reload;  // the message it is the body of
  std::vector<std::string> files;  // absolute paths on the proc's host
  template <class F>
  static void fields(F&& f) {
    f("files", &ReloadBody::files, Need::Required);
  }
};
XMESH_BODY_JSON(ReloadBody)

// What a Reload did in one process.
struct ReloadReply {
  static constexpr const char* what = "Reload reply";
  std::vector<std::string> reloaded;                  // module names
  std::vector<std::vector<std::string>> failed;       // [module, error text]
  int64_t classes = 0;                                // classes whose live instances now use the new code
  template <class F>
  static void fields(F&& f) {
    f("reloaded", &ReloadReply::reloaded, Need::Optional);
    f("failed", &ReloadReply::failed, Need::Optional);
    f("classes", &ReloadReply::classes, Need::Optional);
  }
};
XMESH_BODY_JSON(ReloadReply)

}  // namespace xmesh
