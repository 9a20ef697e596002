// SyncReceiver: the host agent's side of a workspace sync (DESIGN §8). It owns the host's
// workspace root ($XMESH_WORKSPACE of every proc it starts). One sync is a session driven by the
// controller through `Sync` messages:
//   begin  {sid, space, dest, digest}
//                                -> {same: true} when the host copy already equals it (only the
//                                   digest travelled), else the session opens: {have: the
//                                   digest of the host's manifest}. dest is relative to the
//                                   space, a top-level directory of the root that the host
//                                   agent chose (one per allocation owner)
//   plan   {sid} + manifest      -> the content hashes the host lacks (renamed or copied files
//                                   are found on the host by hash and do not travel)
//   plan   {sid, base, digest} + upserts + deleted
//                                -> the same, from a delta against the host manifest `base`;
//                                   {full: true} when it does not fit (send the manifest whole)
//   data   {sid, pieces} + bytes -> staged aside under <root>/.xmesh-sync/stage/<sid>/, each
//                                   object's XXH3-128 checked when complete
//   commit {sid}                 -> every staged file renamed into place in one batch, deletions
//                                   applied, the host manifest saved; counts and paths returned
//   abort  {sid}                 -> staging removed, nothing changed
// The host manifest is checked against the disk at each begin (stat, with the racy-file rule)
// unless an inotify watch on the copy has seen nothing since it was last checked or written, so
// an interrupted commit or a hand edit on the host is seen and repaired by the next sync.
#pragma once
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bodies.hpp"
#include "manifest.hpp"
#include "watch.hpp"

namespace xmesh::ws {

struct SyncRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class SyncReceiver {
 public:
  SyncReceiver(std::string root, int64_t session_timeout_ms);
  ~SyncReceiver();
  struct Reply {
    nlohmann::json body;
    std::vector<std::string> frames;
  };
  // One step (its typed body: runtime/bodies.hpp; step.space set by the agent). Throws
  // SyncRefused (or std::runtime_error) with a message for the controller.
  Reply handle_step(const SyncStepBody& step, const std::vector<std::string_view>& frames, int64_t now_ms);
  // The same from the body as it came off the wire (a malformed one is refused, naming the field).
  Reply handle(const nlohmann::json& body, const std::vector<std::string_view>& frames, int64_t now_ms);
  void expire_idle(int64_t now_ms);
  // Drops a session (its sender is gone) and what it staged; nothing if it ended already.
  void abandon(const std::string& sid) { drop(sid); }
  // Removes a space (a top-level directory of the root: one allocation owner's workspace),
  // its manifests and its unfinished sessions.
  void forget_space(const std::string& space);
  const std::string& root() const { return root_; }
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }  // any thread
  // From any thread: the step under way stops at its next file and fails ("the host agent is
  // stopping"); a commit cut short leaves each file old or new, which the next sync's check
  // finds and completes. Later steps fail at once.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  // The host manifest of dest as it is on disk now (for tests and `status`).
  Manifest verified_manifest(const std::string& dest);

  // A destination's copy: its digest (hex), its entry count and, when read, its manifest.
  struct HostCopy {
    std::shared_ptr<const Manifest> manifest;  // null when only the digest was needed
    std::string digest;
    size_t entries = 0;
  };

 private:
  struct Session;
  Reply begin(const SyncStepBody& step, int64_t now_ms);
  Reply plan(Session& s, const SyncStepBody& step, const std::vector<std::string_view>& frames);
  Reply data(Session& s, const SyncStepBody& step, const std::vector<std::string_view>& frames);
  Reply commit(Session& s);  // prepare, switch_in, commit_reply, save
  struct Commit;
  void prepare(Commit& c);
  void fix_staged(Commit& c, const Entry& e, const Entry* old, const std::string& name);
  void switch_in(Commit& c);
  SyncReply commit_reply(const Commit& c) const;
  static std::vector<std::string> commit_paths(const Commit& c);  // the changes' paths, as frames
  void save(Commit& c);
  void drop(const std::string& sid);
  std::string manifest_path(const std::string& dest) const;
  HostCopy load_and_verify(const std::string& dest, bool want_manifest = false);
  HostCopy with_manifest(const std::string& dest, HostCopy copy);  // reads the saved manifest
  HostCopy check_on_disk(const std::string& dest, bool keep);
  void check_overlap(const std::string& dest, const std::string& space) const;

  void check_cancelled() const;  // throws SyncRefused once cancel() was called

  std::string root_, state_dir_;
  int64_t timeout_ms_;
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<bool> cancelled_{false};
  std::map<std::string, std::unique_ptr<Session>> sessions_;
  // Per destination: the digest of its manifest as last verified or written, trusted while an
  // inotify watch set up before that moment reports nothing (a no-op sync then costs this host
  // no stat calls). The manifest itself stays on disk (a million entries are ~150 MiB in
  // memory): a session reads it back, checking it against this digest.
  struct Known {
    std::string digest;
    size_t entries = 0;
    std::unique_ptr<TreeWatcher> watcher;
  };
  std::map<std::string, Known> known_;
  void remember(const std::string& dest, const HostCopy& copy, std::unique_ptr<TreeWatcher> watcher);
  std::unique_ptr<TreeWatcher> watch(const std::string& dest) const;
};

}  // namespace xmesh::ws
