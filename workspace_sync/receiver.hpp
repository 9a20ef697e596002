// SyncReceiver: the host agent's side of a workspace sync (DESIGN §8). It owns the host's
// workspace root ($XMESH_WORKSPACE of every proc it starts). One sync is a session driven by the
// controller through `Sync` messages:
//   begin  {sid, space, dest, digest}
//                                -> {same: true} when the host copy already equals it (only the
//                                   digest travelled), else the session opens: {have: the
//                                   digest of the host's manifest}. dest is relative to the
//                                   space, a top-level directory of the root that the host
//                                   agent chose (one per allocation owner)
//   plan   {sid, part, last} + a part of the manifest
//                                -> the content hashes the host lacks among that part's files
//                                   (renamed or copied files are found on the host by hash and
//                                   do not travel). Parts come in path order, at most
//                                   kMaxPartEntries entries each; `last` ends the manifest
//   plan   {sid, part, last, base, digest} + upserts + deleted (a part of a delta)
//                                -> the same, from a delta against the host manifest `base`;
//                                   {full: true} when it does not fit (the plan starts again
//                                   from part 0 with the manifest whole)
//   data   {sid, part, pieces} + bytes
//                                -> staged aside under <root>/.xmesh-sync/stage/<sid>/, each
//                                   object's XXH3-128 checked when complete; a part's data
//                                   comes before the plan is more than kMaxOpenParts ahead
//   commit {sid}                 -> every staged file renamed into place in one batch, deletions
//                                   applied, the host manifest saved; counts, the first
//                                   kReportPaths paths of each change and every .py path
//   abort  {sid}                 -> staging removed, nothing changed
// Memory does not grow with the tree: the incoming manifest is written to the staging area as
// it comes and merged with the saved one through cursors over mapped files (manifest_file.hpp),
// the host's content is found through a hash index on disk (hash_index.hpp), and only the
// objects of plan parts whose data has not all come are held.
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
#include "sync_bodies.hpp"
#include "manifest.hpp"
#include "hash_index.hpp"
#include "manifest_file.hpp"
#include "watch.hpp"

namespace xmesh::ws {

struct SyncRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class SyncReceiver {
 public:
  static constexpr uint64_t kMaxPartEntries = 65536;  // entries (upserts and deletions) in one plan part
  static constexpr size_t kMaxOpenParts = 8;          // plan parts whose data may be outstanding
  static constexpr size_t kReportPaths = 1000;        // paths of each change named in a commit's answer
  SyncReceiver(std::string root, int64_t session_timeout_ms);
  ~SyncReceiver();
  struct Reply {
    nlohmann::json body;
    std::vector<std::string> frames;
  };
  // One step (its typed body: runtime/protocol/bodies.hpp; step.space set by the agent). Throws
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

  // A destination's copy: the digest (hex) of its manifest and its entry count.
  struct HostCopy {
    std::string digest;
    size_t entries = 0;
  };

 private:
  struct Session;
  struct Plan;
  struct Part;
  Reply begin(const SyncStepBody& step, int64_t now_ms);
  Reply plan(Session& s, const SyncStepBody& step, const std::vector<std::string_view>& frames);
  Plan& plan_for(Session& s, const SyncStepBody& step, size_t frames);
  void merge_whole(Session& s, const Manifest& chunk, bool last, std::string& need);
  bool merge_delta(Session& s, const Manifest& upserts, const Manifest& deleted, bool last, std::string& need);
  void take_entry(Session& s, const Entry& e, const Entry* old, bool may_need, std::string& need);
  bool content_at_hand(Session& s, const Entry& e);
  const HashIndex& host_index(Session& s);  // made when first needed
  bool finish_plan(Session& s);  // false: a delta that did not fit
  void reset_plan(Session& s);
  Reply data(Session& s, const SyncStepBody& step, const std::vector<std::string_view>& frames);
  Reply commit(Session& s);  // prepare, switch_in, save
  struct Commit;
  void prepare(Commit& c);
  void stage_copy(Commit& c, const Entry& e, const std::string& first, const std::string& staged);
  void fix_staged(Commit& c, const Entry& e, const Entry* old, const std::string& name);
  void switch_in(Commit& c);
  void remove_old(Commit& c);
  void save(Commit& c);
  void drop(const std::string& sid);
  std::string manifest_path(const std::string& dest) const;
  HostCopy load_and_verify(const std::string& dest);
  // The saved manifest of dest, mapped, when its digest is copy's (else checked on disk again).
  std::shared_ptr<const MappedManifest> saved_manifest(const std::string& dest, HostCopy& copy);
  HostCopy check_on_disk(const std::string& dest);
  void check_overlap(const std::string& dest, const std::string& space) const;

  void check_cancelled() const;  // throws SyncRefused once cancel() was called

  std::string root_, state_dir_;
  int64_t timeout_ms_;
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<bool> cancelled_{false};
  std::map<std::string, std::unique_ptr<Session>> sessions_;
  // Per destination: the digest of its manifest as last verified or written, trusted while an
  // inotify watch set up before that moment reports nothing (a no-op sync then costs this host
  // no stat calls). The manifest itself stays on disk: a session maps it and reads it entry by
  // entry, checking it against this digest.
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
