#include "receiver.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "diff.hpp"
#include "fs_ops.hpp"
#include "path_safety.hpp"
#include "scan.hpp"

namespace xmesh::ws {

using json = nlohmann::json;

namespace {

constexpr int64_t kRacyWindowNs = 1000000000;

int64_t ns(const timespec& t) { return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec; }

std::string sys_error(const std::string& what, int e) { return what + ": " + std::strerror(e); }

std::string parent_of(const std::string& p) { return std::string(parent_dir(p)); }

std::string base_of(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// Directory descriptors by relative path, opened without following links, closed at the end.
class DirCache {
 public:
  explicit DirCache(int base) : base_(base) {}
  ~DirCache() {
    for (auto& kv : fds_) close(kv.second);
  }
  int get(const std::string& rel) {
    auto it = fds_.find(rel);
    if (it != fds_.end()) return it->second;
    int fd = open_dir_nofollow(base_, rel, false);
    fds_[rel] = fd;
    return fd;
  }
  void forget(const std::string& rel) {  // a directory that was removed
    for (auto it = fds_.begin(); it != fds_.end();) {
      if (it->first == rel || it->first.compare(0, rel.size() + 1, rel + "/") == 0) {
        close(it->second);
        it = fds_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  int base_;
  std::unordered_map<std::string, int> fds_;
};

// Removes the compiled caches of Python sources, so a proc never runs bytecode of an old text.
// Each directory's __pycache__ is listed once per commit (most have none).
class PycacheDropper {
 public:
  explicit PycacheDropper(DirCache& dirs) : dirs_(dirs) {}
  ~PycacheDropper() {
    for (auto& kv : caches_)
      if (kv.second.fd >= 0) close(kv.second.fd);
  }
  void drop(const std::string& path) {
    if (path.size() < 4 || path.compare(path.size() - 3, 3, ".py") != 0) return;
    Cache& c = cache_of(parent_of(path));
    if (c.fd < 0) return;
    std::string stem = base_of(path).substr(0, base_of(path).size() - 3) + ".";
    for (auto& name : c.names)
      if (name.compare(0, stem.size(), stem) == 0) unlinkat(c.fd, name.c_str(), 0);
  }

 private:
  struct Cache {
    int fd = -1;
    std::vector<std::string> names;
  };
  Cache& cache_of(const std::string& dir) {
    auto it = caches_.find(dir);
    if (it != caches_.end()) return it->second;
    Cache& c = caches_[dir];
    int parent;
    try {
      parent = dirs_.get(dir);
    } catch (const std::exception&) {
      return c;
    }
    c.fd = openat(parent, "__pycache__", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (c.fd < 0) return c;
    int fd2 = dup(c.fd);
    DIR* d = fd2 >= 0 ? fdopendir(fd2) : nullptr;
    if (!d) {
      if (fd2 >= 0) close(fd2);
      return c;
    }
    while (dirent* de = readdir(d))
      if (de->d_name[0] != '.') c.names.push_back(de->d_name);
    closedir(d);
    return c;
  }
  DirCache& dirs_;
  std::unordered_map<std::string, Cache> caches_;
};

// Content the host already has, copied aside for e: what was copied must be what the manifest
// says (a proc may have written to the host's file since the plan, or put a FIFO there).
void copy_checked(int srcdir, const std::string& src, int stagefd, const std::string& staged, const Entry& e) {
  Hash128 got;
  try {
    got = copy_file_at(srcdir, src, stagefd, staged);
  } catch (const std::exception& x) {
    throw SyncRefused("cannot stage " + e.path + " from the host's copy: " + x.what());
  }
  if (got != e.hash)
    throw SyncRefused("the host's copy of the content of " + e.path + " (" + src +
                      ") changed during the sync; sync again");
}

}  // namespace

struct SyncReceiver::Session {
  struct Object {
    Hash128 hash;
    uint64_t size = 0, written = 0;
    const Entry* entry = nullptr;  // an entry of `incoming` that has it (its path, for messages)
    const std::string& path() const { return entry->path; }
    uint32_t mode = 0600;  // that path's permission bits, given to the staged file
    int fd = -1;
    XXH3_state_t* state = nullptr;
    bool done = false;
    bool staged = false;  // the staged file still sits under its hash name
    int64_t move = -1;    // in a commit: the move that took it (later paths of it copy that)
  };
  std::string sid, dest, stage_dir;
  int64_t last_ms = 0;
  std::shared_ptr<const Manifest> host;  // what the host holds
  Manifest incoming;
  std::string host_digest, incoming_digest;  // hex
  bool planned = false;
  std::vector<Object> need;
  uint64_t bytes = 0;

  ~Session() {
    for (auto& o : need) {
      if (o.fd >= 0) close(o.fd);
      if (o.state) XXH3_freeState(o.state);
    }
  }
};

SyncReceiver::SyncReceiver(std::string root, int64_t session_timeout_ms)
    : root_(std::move(root)), state_dir_(root_ + "/" + kStateDirName), timeout_ms_(session_timeout_ms) {
  make_dirs_path(root_);
  make_dirs_path(state_dir_ + "/m");
  // Staging left by an agent that was killed mid-sync: nothing of it was switched in.
  remove_tree(state_dir_ + "/stage");
  make_dirs_path(state_dir_ + "/stage");
}

SyncReceiver::~SyncReceiver() {
  std::vector<std::string> sids;
  for (auto& kv : sessions_) sids.push_back(kv.first);
  for (auto& sid : sids) drop(sid);
}

void SyncReceiver::check_cancelled() const {
  if (cancelled_.load(std::memory_order_relaxed))
    throw SyncRefused("the host agent is stopping: the sync was cut short (the next sync completes it)");
}

void SyncReceiver::drop(const std::string& sid) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  std::string dir = it->second->stage_dir;
  sessions_.erase(it);
  remove_tree(dir);
  // A large sync's session (manifests, plans, diffs of every path) is freed here: hand what the
  // allocator keeps back to the system, so the agent does not stay at its high-water mark.
  malloc_trim(0);
}

void SyncReceiver::forget_space(const std::string& space) {
  auto under = [&](const std::string& d) { return d == space || d.compare(0, space.size() + 1, space + "/") == 0; };
  std::vector<std::string> sids;
  for (auto& kv : sessions_)
    if (under(kv.second->dest)) sids.push_back(kv.first);
  for (auto& sid : sids) drop(sid);
  for (auto it = known_.begin(); it != known_.end();) it = under(it->first) ? known_.erase(it) : std::next(it);
  DIR* d = opendir((state_dir_ + "/m").c_str());
  std::vector<std::string> gone;
  while (dirent* de = d ? readdir(d) : nullptr) {
    std::string n = de->d_name, dest;
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".dest") == 0 && read_whole_file(state_dir_ + "/m/" + n, dest) &&
        under(dest))
      gone.push_back(state_dir_ + "/m/" + n.substr(0, n.size() - 5));
  }
  if (d) closedir(d);
  for (auto& base : gone) {
    unlink((base + ".manifest").c_str());
    unlink((base + ".dest").c_str());
  }
  remove_tree(root_ + "/" + space);
}

void SyncReceiver::expire_idle(int64_t now_ms) {
  std::vector<std::string> idle;
  for (auto& kv : sessions_)
    if (now_ms - kv.second->last_ms > timeout_ms_) idle.push_back(kv.first);
  for (auto& sid : idle) drop(sid);
}

std::string SyncReceiver::manifest_path(const std::string& dest) const {
  XXH64_hash_t h = XXH64(dest.data(), dest.size(), 0);
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return state_dir_ + "/m/" + buf;
}

// Two destinations on one host must not nest: their manifests would fight over the same files.
// Messages name them as the user did (relative to the space).
void SyncReceiver::check_overlap(const std::string& dest, const std::string& space) const {
  DIR* d = opendir((state_dir_ + "/m").c_str());
  if (!d) return;
  std::vector<std::string> others;
  while (dirent* de = readdir(d)) {
    std::string n = de->d_name;
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".dest") == 0) {
      std::string other;
      if (read_whole_file(state_dir_ + "/m/" + n, other)) others.push_back(other);
    }
  }
  closedir(d);
  for (auto& other : others) {
    if (other == dest) continue;
    bool nested = other.empty() || dest.empty() || dest.compare(0, other.size() + 1, other + "/") == 0 ||
                  other.compare(0, dest.size() + 1, dest + "/") == 0;
    if (nested) {
      auto name = [&](const std::string& d) {
        if (d == space || d.empty()) return std::string("the workspace root");
        return "'" + (space.empty() ? d : d.substr(space.size() + 1)) + "'";
      };
      throw SyncRefused("destination " + name(dest) + " overlaps " + name(other) +
                        ", which another workspace was synced to on this host; choose a destination beside it");
    }
  }
}

// The manifest this host saved for dest, checked against the disk: entries whose stat changed
// (or whose mtime is racy) are re-hashed, vanished ones dropped. Saved again when it changed.
std::unique_ptr<TreeWatcher> SyncReceiver::watch(const std::string& dest) const {
  try {
    auto w = std::make_unique<TreeWatcher>(dest.empty() ? root_ : root_ + "/" + dest);
    // A copy not made yet (its first sync) has nothing to watch; a watch of nothing would vouch
    // for it forever after: the watch is set up once the commit made the directory.
    if (w->watched_dirs() == 0) return nullptr;
    return w;
  } catch (const std::exception&) {
    return nullptr;  // no inotify (or its limit): every sync checks the copy by stat instead
  }
}

void SyncReceiver::remember(const std::string& dest, const HostCopy& copy, std::unique_ptr<TreeWatcher> watcher) {
  if (!watcher) {
    known_.erase(dest);
    return;
  }
  known_[dest] = Known{copy.digest, copy.entries, std::move(watcher)};
}

SyncReceiver::HostCopy SyncReceiver::load_and_verify(const std::string& dest, bool want_manifest) {
  auto known = known_.find(dest);
  if (known != known_.end() && !known->second.watcher->wait(0, 0))
    return HostCopy{nullptr, known->second.digest, known->second.entries};
  known_.erase(dest);
  // Watch first, then look: a change made while we look shows up as an event next time.
  auto watcher = watch(dest);
  HostCopy copy = check_on_disk(dest, want_manifest);
  remember(dest, copy, std::move(watcher));
  return copy;
}

SyncReceiver::HostCopy SyncReceiver::with_manifest(const std::string& dest, HostCopy copy) {
  if (copy.manifest) return copy;
  auto m = std::make_shared<Manifest>();
  m->entries.reserve(copy.entries);
  if (for_each_cached_entry(manifest_path(dest) + ".manifest", [&](int64_t when) { m->scan_ns = when; },
                            [&](Entry&& e) { m->entries.push_back(std::move(e)); }) &&
      m->digest().hex() == copy.digest) {
    copy.manifest = std::move(m);
    return copy;
  }
  known_.erase(dest);  // the file is not what was remembered: look at the disk itself
  return load_and_verify(dest, true);
}

namespace {
// One entry of a saved manifest against the disk (relative to destfd): the entry as it is now
// (re-hashed unless its stat matches outside the racy window of scan_ns), or nothing when it
// is gone or is something else now. *changed is set when it differs from what was saved.
std::optional<Entry> check_entry(int destfd, const Entry& e, int64_t scan_ns, bool* changed) {
  struct stat st;
  if (fstatat(destfd, e.path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return std::nullopt;
  Entry v = e;
  if (e.type == EntryType::Dir) {
    if (!S_ISDIR(st.st_mode)) return std::nullopt;
    v.mode = st.st_mode & 07777;
  } else if (e.type == EntryType::Symlink) {
    char buf[4097];
    ssize_t n = S_ISLNK(st.st_mode) ? readlinkat(destfd, e.path.c_str(), buf, sizeof(buf) - 1) : -1;
    if (n < 0 || std::string(buf, static_cast<size_t>(n)) != e.target) return std::nullopt;
  } else {
    if (!S_ISREG(st.st_mode)) return std::nullopt;
    v.mode = st.st_mode & 07777;
    int64_t mtime = ns(st.st_mtim);
    bool fresh = e.size == uint64_t(st.st_size) && e.mtime_ns == mtime && e.ctime_ns == ns(st.st_ctim) &&
                 e.ino == st.st_ino && mtime < scan_ns - kRacyWindowNs;
    if (!fresh) {
      try {
        v.hash = hash_file(destfd, e.path, e.path, &v.size, &v.mtime_ns, &v.ctime_ns, &v.ino);
      } catch (const std::exception&) {
        return std::nullopt;
      }
      *changed = true;
    }
  }
  if (v.mode != e.mode) *changed = true;
  return v;
}
}  // namespace

// The saved manifest of dest checked against the disk, entry by entry as it is read: what is
// kept of it is written aside as it goes (saved when anything changed) and hashed into the
// digest, so a million entries are checked in constant memory unless `keep` asks for them.
SyncReceiver::HostCopy SyncReceiver::check_on_disk(const std::string& dest, bool keep) {
  const std::string path = manifest_path(dest) + ".manifest";
  const std::string dir = dest.empty() ? root_ : root_ + "/" + dest;
  const HostCopy none{keep ? std::make_shared<const Manifest>() : nullptr, DigestBuilder().finish().hex(), 0};
  Fd dirfd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dirfd.fd < 0) return none;  // no copy: a sync sends it whole
  auto kept = std::make_shared<Manifest>();
  kept->scan_ns = wall_ns();
  DigestBuilder digest;
  size_t count = 0;
  bool changed = false;
  int64_t stored_scan = 0;
  std::unique_ptr<CacheWriter> out;  // the checked manifest, written aside; saved only if it changed
  try {
    out = std::make_unique<CacheWriter>(path, kept->scan_ns);
  } catch (const std::exception&) {  // a full disk: the check goes on, unsaved (the next repeats it)
  }
  auto check = [&](Entry&& e) {
    check_cancelled();
    std::optional<Entry> v = check_entry(dirfd.fd, e, stored_scan, &changed);
    if (!v) {
      changed = true;
      return;
    }
    digest.add(*v);
    ++count;
    try {
      if (out) out->add(*v);
    } catch (const std::exception&) {
      out.reset();
    }
    if (keep) kept->entries.push_back(std::move(*v));
  };
  if (!for_each_cached_entry(path, [&](int64_t when) { stored_scan = when; }, check)) return none;
  if (changed && out) {
    try {
      out->commit();
    } catch (const std::exception&) {
    }
  }
  if (!changed) kept->scan_ns = stored_scan;  // nothing re-checked by content: the old racy window holds
  return HostCopy{keep ? std::shared_ptr<const Manifest>(std::move(kept)) : nullptr, digest.finish().hex(), count};
}

Manifest SyncReceiver::verified_manifest(const std::string& dest) {
  return *with_manifest(dest, load_and_verify(dest)).manifest;
}

SyncReceiver::Reply SyncReceiver::handle(const json& body, const std::vector<std::string_view>& frames, int64_t now_ms) {
  std::string why;
  auto step = read_as<SyncStepBody>(body, &why);
  if (!step) throw SyncRefused("malformed sync request: " + why);
  return handle_step(*step, frames, now_ms);
}

SyncReceiver::Reply SyncReceiver::handle_step(const SyncStepBody& step, const std::vector<std::string_view>& frames,
                                         int64_t now_ms) {
  for (auto& f : frames) bytes_received_.fetch_add(f.size(), std::memory_order_relaxed);
  check_cancelled();
  const std::string& op = step.op;
  if (op == "begin") return begin(step, now_ms);
  const std::string& sid = step.sid;
  auto it = sessions_.find(sid);
  if (it == sessions_.end())
    throw SyncRefused("no sync session '" + sid + "' on this host (it expired, was aborted, or a newer sync of the "
                      "same destination replaced it)");
  Session& s = *it->second;
  s.last_ms = now_ms;
  for (auto& f : frames) s.bytes += f.size();
  if (op == "abort") {
    drop(sid);
    SyncReply r;
    r.aborted = true;
    return {r, {}};
  }
  try {
    if (op == "plan") return plan(s, step, frames);
    if (op == "data") return data(s, step, frames);
    if (op == "commit") {
      Reply r = commit(s);
      drop(sid);
      return r;
    }
  } catch (...) {
    drop(sid);  // a failed step leaves the copy as it was; the next sync starts over
    throw;
  }
  throw SyncRefused("unknown sync step '" + op + "'");
}

SyncReceiver::Reply SyncReceiver::begin(const SyncStepBody& step, int64_t now_ms) {
  const std::string &sid = step.sid, &user_dest = step.dest, &space = step.space, &digest = step.digest;
  if (sid.empty() || sid.size() > 32 || sid.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw SyncRefused("sync session id must be 1-32 lowercase hex digits");
  std::string why;
  if (!valid_relative_path(user_dest, &why, true))
    throw SyncRefused("refused destination '" + user_dest + "': the path " + why);
  if (!space.empty() && !valid_relative_path(space, &why, false))
    throw SyncRefused("refused workspace space '" + space + "': the path " + why);
  // Within a space (one allocation owner's workspace) destinations must not nest; two spaces
  // never meet, so another program's tree never refuses this one.
  std::string dest = space.empty() ? user_dest : user_dest.empty() ? space : space + "/" + user_dest;
  check_overlap(dest, space);
  // A newer sync of the same destination replaces an unfinished one (its controller may be dead).
  std::vector<std::string> stale;
  for (auto& kv : sessions_)
    if (kv.second->dest == dest) stale.push_back(kv.first);
  for (auto& s : stale) drop(s);

  HostCopy host = load_and_verify(dest);
  std::string dir = dest.empty() ? root_ : root_ + "/" + dest;
  std::string have = host.digest;
  if (have == digest && access(dir.c_str(), F_OK) == 0)
  {
    SyncReply r;
    r.same = true;
    r.dir = dir;
    r.entries = host.entries;
    return {r, {}};
  }
  host = with_manifest(dest, std::move(host));
  have = host.digest;  // a saved manifest that was not what was remembered was checked again
  auto s = std::make_unique<Session>();
  s->sid = sid;
  s->dest = dest;
  s->last_ms = now_ms;
  s->host = std::move(host.manifest);
  s->host_digest = have;
  s->stage_dir = state_dir_ + "/stage/" + sid;
  remove_tree(s->stage_dir);
  if (mkdir(s->stage_dir.c_str(), 0700) != 0) throw SyncRefused(sys_error("cannot create " + s->stage_dir, errno));
  sessions_[sid] = std::move(s);
  // "have" lets the controller send the plan as a delta against a manifest it knows.
  SyncReply r;
  r.same = false;
  r.dir = dir;
  r.have = have;
  return {r, {}};
}

SyncReceiver::Reply SyncReceiver::plan(Session& s, const SyncStepBody& step, const std::vector<std::string_view>& frames) {
  SyncReply full;  // the answer when the delta does not fit: send the whole manifest
  full.full = true;
  if (s.planned) throw SyncRefused("sync session '" + s.sid + "' was already planned");
  if (frames.empty()) throw SyncRefused("sync plan without a manifest");
  ManifestDelta delta;
  const std::vector<Entry>* candidates = nullptr;  // the entries that may need content
  // Objects name an entry of s.incoming (kept until the commit): a delta's upserts go with it.
  bool in_incoming = false;
  if (step.base) {
    // A delta against the manifest the host holds: it must fit, and the result must be the
    // manifest the controller scanned (its digest), else the controller sends it whole.
    if (frames.size() < 2) throw SyncRefused("sync plan delta without its deleted paths");
    if (*step.base != s.host_digest) return {full, {}};
    delta.upserts = Manifest::decode_wire(frames[0]);
    delta.deleted = Manifest::decode_wire(frames[1]);
    try {
      s.incoming = apply_delta(*s.host, delta);
    } catch (const std::runtime_error&) {
      return {full, {}};
    }
    s.incoming_digest = s.incoming.digest().hex();
    if (s.incoming_digest != step.digest) return {full, {}};
    check_manifest_change(s.incoming, delta.upserts, delta.deleted);  // the rest was checked before
    candidates = &delta.upserts.entries;
  } else {
    s.incoming = Manifest::decode_wire(frames[0]);
    check_manifest(s.incoming);
    s.incoming_digest = s.incoming.digest().hex();
    candidates = &s.incoming.entries;
    in_incoming = true;
  }
  s.planned = true;
  // Content the host has already (unchanged, renamed or copied files) is not asked for.
  std::unordered_set<Hash128, Hash128Hasher> have;
  for (auto& e : s.host->entries)
    if (e.type == EntryType::File) have.insert(e.hash);
  std::unordered_set<Hash128, Hash128Hasher> asked;
  std::vector<Session::Object> empty;  // empty files: staged now, nothing to send
  std::string hashes;
  Fd stagefd(open(s.stage_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (stagefd.fd < 0) throw SyncRefused(sys_error("cannot open " + s.stage_dir, errno));
  for (auto& e : *candidates) {
    check_cancelled();
    if (e.type != EntryType::File || have.count(e.hash) || asked.count(e.hash)) continue;
    Session::Object o;
    o.hash = e.hash;
    o.size = e.size;
    o.entry = in_incoming ? &e : s.incoming.find(e.path);
    o.mode = e.mode & 0777;
    if (e.size == 0) {  // nothing to send: stage the empty file now
      int fd = openat(stagefd.fd, e.hash.hex().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0) throw SyncRefused(sys_error("cannot stage " + e.path, errno));
      fchmod(fd, o.mode);
      close(fd);
      o.done = o.staged = true;
      asked.insert(e.hash);
      empty.push_back(o);
      continue;
    }
    asked.insert(e.hash);
    hashes.append(reinterpret_cast<const char*>(&e.hash.lo), 8);
    hashes.append(reinterpret_cast<const char*>(&e.hash.hi), 8);
    s.need.push_back(std::move(o));
  }
  // The reply lists the non-empty objects in order; their position is the index pieces use.
  s.need.insert(s.need.end(), empty.begin(), empty.end());
  size_t sending = hashes.size() / 16;
  SyncReply r;
  r.need = sending;
  return {r, {hashes}};
}

SyncReceiver::Reply SyncReceiver::data(Session& s, const SyncStepBody& step, const std::vector<std::string_view>& frames) {
  if (!s.planned) throw SyncRefused("sync data before its plan");
  const auto& pieces = step.pieces;
  std::string_view payload = frames.empty() ? std::string_view() : frames[0];
  size_t at = 0;
  std::vector<char> raw;
  int stagefd = -1;
  auto stage = [&]() {
    if (stagefd < 0) stagefd = open(s.stage_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (stagefd < 0) throw SyncRefused(sys_error("cannot open " + s.stage_dir, errno));
    return stagefd;
  };
  struct Closer {
    int& fd;
    ~Closer() {
      if (fd >= 0) close(fd);
    }
  } closer{stagefd};
  for (auto& p : pieces) {
    check_cancelled();
    size_t idx = static_cast<size_t>(p[0]);
    uint64_t offset = p[1], raw_len = p[2], stored = p[3];
    bool z = p[4] != 0;
    if (idx >= s.need.size() || s.need[idx].done) throw SyncRefused("sync data names an object the host did not ask for");
    auto& o = s.need[idx];
    if (offset != o.written || raw_len > o.size - o.written || at + stored > payload.size() || (!z && stored != raw_len))
      throw SyncRefused("sync data for " + o.path() + " is out of order or malformed");
    const char* bytes = payload.data() + at;
    if (z) {
      raw.resize(raw_len);
      size_t n = ZSTD_decompress(raw.data(), raw.size(), bytes, stored);
      if (ZSTD_isError(n) || n != raw_len) throw SyncRefused("sync data for " + o.path() + " does not decompress");
      bytes = raw.data();
    }
    at += stored;
    if (o.fd < 0) {
      o.fd = openat(stage(), o.hash.hex().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (o.fd < 0) throw SyncRefused(sys_error("cannot stage " + o.path(), errno));
      fchmod(o.fd, o.mode);  // the mode of the first path that wants it (not subject to the umask)
      o.state = XXH3_createState();
      XXH3_128bits_reset(o.state);
    }
    for (uint64_t off = 0; off < raw_len;) {
      ssize_t w = write(o.fd, bytes + off, raw_len - off);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw SyncRefused(sys_error("cannot write " + o.path() + " on the host", errno));
      off += static_cast<uint64_t>(w);
    }
    XXH3_128bits_update(o.state, bytes, raw_len);
    o.written += raw_len;
    if (o.written == o.size) {
      XXH128_hash_t h = XXH3_128bits_digest(o.state);
      XXH3_freeState(o.state);
      o.state = nullptr;
      close(o.fd);
      o.fd = -1;
      if (Hash128{h.low64, h.high64} != o.hash)
        throw SyncRefused("the content of " + o.path() + " does not match its manifest (it changed while being sent); "
                          "sync again");
      o.done = o.staged = true;
    }
  }
  SyncReply r;
  r.received = s.bytes;
  return {r, {}};
}

// What a commit works with: the session, the diff, the directories it writes in, and what the
// prepare step left for the switch.
struct SyncReceiver::Commit {
  struct Move {  // no string per file: a million-file commit holds a million of these
    const Entry* e;
    uint64_t n;   // staged as "p<n>", or
    bool object;  // as the received object itself (its hash's name)
    std::string staged() const { return object ? e->hash.hex() : "p" + std::to_string(n); }
  };
  Session& s;
  const Manifest& host;
  Diff d;
  Fd root, dest, stage;
  std::unique_ptr<DirCache> dirs;
  std::unique_ptr<PycacheDropper> pycache;
  std::vector<const Entry*> touched;  // added and changed, by path
  std::vector<Move> moves;            // staged name -> its place
  std::vector<const Entry*> chmods;   // only the mode changed
  std::vector<std::string> kept;      // old directories that could not be removed

  Commit(Session& session, const std::string& root_dir)
      : s(session), host(*session.host), d(diff_manifests(*session.host, session.incoming)) {
    root.fd = open(root_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root.fd < 0) throw SyncRefused(sys_error("cannot open " + root_dir, errno));
    dest.fd = open_dir_nofollow(root.fd, s.dest, true);
    stage.fd = open(s.stage_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (stage.fd < 0) throw SyncRefused(sys_error("cannot open " + s.stage_dir, errno));
    dirs = std::make_unique<DirCache>(dest.fd);
    pycache = std::make_unique<PycacheDropper>(*dirs);
    for (auto* list : {&d.added, &d.changed})
      for (const Entry* e : *list) touched.push_back(e);
    std::sort(touched.begin(), touched.end(), [](const Entry* a, const Entry* b) { return a->path < b->path; });
  }
  ~Commit() {
    pycache.reset();  // before the directories it reads through
    dirs.reset();
  }
};

SyncReceiver::Reply SyncReceiver::commit(Session& s) {
  if (!s.planned) throw SyncRefused("sync commit before its plan");
  size_t missing = 0;
  for (auto& o : s.need) missing += !o.done;
  if (missing) throw SyncRefused(std::to_string(missing) + " files of this sync did not arrive (first: " +
                                 std::find_if(s.need.begin(), s.need.end(), [](auto& o) { return !o.done; })->path() + ")");
  Commit c(s, root_);
  prepare(c);     // every new or changed file aside; nothing visible changes
  switch_in(c);   // deletions, new directories, every staged file renamed in
  json reply = commit_reply(c);
  auto paths = commit_paths(c);
  save(c);        // the host manifest, with the stat values of what was written
  return {reply, std::move(paths)};
}

// 1. Every new or changed file and symlink staged aside under a name of its own, with its mode
//    (nothing visible changes yet). Content comes from the received objects, or from the host
//    when it already had it (renamed or copied files).
void SyncReceiver::prepare(Commit& c) {
  Session& s = c.s;
  // The received objects by hash (a sorted index: a million of them cost 24 MiB, not a map's 60).
  std::vector<std::pair<Hash128, size_t>> objects;
  objects.reserve(s.need.size());
  for (size_t i = 0; i < s.need.size(); ++i) objects.emplace_back(s.need[i].hash, i);
  std::sort(objects.begin(), objects.end(), [](auto& a, auto& b) { return a.first < b.first; });
  auto object_of = [&](const Hash128& h) -> Session::Object* {
    auto it = std::lower_bound(objects.begin(), objects.end(), h, [](auto& a, const Hash128& k) { return a.first < k; });
    return it != objects.end() && it->first == h ? &s.need[it->second] : nullptr;
  };
  std::unordered_map<Hash128, size_t, Hash128Hasher> from_host;  // content copied from the host: its move
  std::unordered_map<Hash128, const Entry*, Hash128Hasher> on_host;  // built when first needed
  size_t n = 0;
  for (const Entry* e : c.touched) {
    check_cancelled();
    const Entry* old = c.host.find(e->path);
    if (e->type == EntryType::Dir) continue;
    if (e->type == EntryType::File && old && old->type == EntryType::File && old->hash == e->hash && old->size == e->size) {
      c.chmods.push_back(e);
      continue;
    }
    Commit::Move move{e, n++, false};
    if (e->type == EntryType::Symlink) {
      if (symlinkat(e->target.c_str(), c.stage.fd, move.staged().c_str()) != 0)
        throw SyncRefused(sys_error("cannot stage " + e->path, errno));
      c.moves.push_back(move);
      continue;
    }
    // The content: staged already for an earlier path (copied), the received object itself
    // (moved into place under the name it arrived with), or the host's own copy (copied).
    Session::Object* o = object_of(e->hash);
    auto copied = from_host.find(e->hash);
    bool ready = false;  // the received object itself, already with this entry's mode
    if (o && o->move >= 0) {
      copy_checked(c.stage.fd, c.moves[static_cast<size_t>(o->move)].staged(), c.stage.fd, move.staged(), *e);
    } else if (o && o->staged) {
      move.object = true;
      o->staged = false;
      o->move = static_cast<int64_t>(c.moves.size());
      ready = o->mode == (e->mode & 0777);
    } else if (copied != from_host.end()) {
      copy_checked(c.stage.fd, c.moves[copied->second].staged(), c.stage.fd, move.staged(), *e);
    } else {
      if (on_host.empty())
        for (auto& h : c.host.entries)
          if (h.type == EntryType::File) on_host.emplace(h.hash, &h);
      auto src = on_host.find(e->hash);
      if (src == on_host.end()) throw SyncRefused("the content of " + e->path + " is neither staged nor on the host");
      copy_checked(c.dirs->get(parent_of(src->second->path)), base_of(src->second->path), c.stage.fd, move.staged(),
                   *e);
      from_host[e->hash] = c.moves.size();
    }
    if (!(ready && !old)) fix_staged(c, *e, old, move.staged());  // a new path that is ready needs nothing
    c.moves.push_back(move);
  }
}

// A staged file gets its entry's mode and, replacing an old text, an mtime outside the old
// text's second: Python trusts a .pyc while the source's size and whole-second mtime match.
void SyncReceiver::fix_staged(Commit& c, const Entry& e, const Entry* old, const std::string& name) {
  Fd fd(openat(c.stage.fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.fd < 0) throw SyncRefused(sys_error("cannot open staged " + e.path, errno));
  fchmod(fd.fd, e.mode & 0777);
  struct stat old_st, new_st;
  if (old && fstatat(c.dirs->get(parent_of(e.path)), base_of(e.path).c_str(), &old_st, AT_SYMLINK_NOFOLLOW) == 0 &&
      fstat(fd.fd, &new_st) == 0 && old_st.st_mtim.tv_sec == new_st.st_mtim.tv_sec) {
    timespec t[2] = {{0, UTIME_OMIT}, {old_st.st_mtim.tv_sec + 1, 0}};
    futimens(fd.fd, t);
  }
}

// 2. The switch. Deletions deepest first (and old entries whose type changes to or from a
//    directory), then new directories parents first, then every staged file renamed in.
void SyncReceiver::switch_in(Commit& c) {
  std::vector<std::pair<std::string, EntryType>> removals;
  for (const Entry* e : c.d.deleted) removals.emplace_back(e->path, e->type);
  for (const Entry* e : c.d.changed) {
    const Entry* old = c.host.find(e->path);
    if (old && old->type != e->type && (old->type == EntryType::Dir || e->type == EntryType::Dir))
      removals.emplace_back(old->path, old->type);
  }
  std::sort(removals.begin(), removals.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (auto& [path, type] : removals) {
    int parent;
    try {
      parent = c.dirs->get(parent_of(path));
    } catch (const std::exception&) {
      continue;  // its directory is gone already
    }
    if (type == EntryType::Dir) {
      c.dirs->forget(path);
      if (unlinkat(parent, base_of(path).c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        if (c.s.incoming.find(path)) throw SyncRefused(sys_error("cannot replace directory " + path + " on the host", errno));
        c.kept.push_back(path + " (" + std::strerror(errno) + ")");
      }
    } else {
      if (type == EntryType::File) c.pycache->drop(path);
      unlinkat(parent, base_of(path).c_str(), 0);
    }
  }
  for (const Entry* e : c.touched) {
    if (e->type != EntryType::Dir) continue;
    int parent = c.dirs->get(parent_of(e->path));
    if (mkdirat(parent, base_of(e->path).c_str(), e->mode & 0777) != 0 && errno != EEXIST)
      throw SyncRefused(sys_error("cannot create directory " + e->path + " on the host", errno));
    fchmodat(parent, base_of(e->path).c_str(), e->mode & 0777, 0);
  }
  for (auto& m : c.moves) {
    check_cancelled();
    int parent = c.dirs->get(parent_of(m.e->path));
    if (renameat(c.stage.fd, m.staged().c_str(), parent, base_of(m.e->path).c_str()) != 0)
      throw SyncRefused(sys_error("cannot move " + m.e->path + " into place", errno));
    if (m.e->type == EntryType::File) c.pycache->drop(m.e->path);
  }
  for (const Entry* e : c.chmods)
    fchmodat(c.dirs->get(parent_of(e->path)), base_of(e->path).c_str(), e->mode & 0777, 0);
}

// What the controller hears: counts (files and symlinks) and the paths of each change.
SyncReply SyncReceiver::commit_reply(const Commit& c) const {
  auto count = [](const std::vector<const Entry*>& list) {
    size_t n = 0;
    for (const Entry* e : list) n += e->type != EntryType::Dir;
    return n;
  };
  size_t added = count(c.d.added), changed = count(c.d.changed), deleted = count(c.d.deleted);
  size_t unchanged = 0;
  for (auto& e : c.s.incoming.entries) unchanged += e.type != EntryType::Dir;
  unchanged -= added + changed;
  SyncReply r;
  r.dir = c.s.dest.empty() ? root_ : root_ + "/" + c.s.dest;
  r.added = added;
  r.changed = changed;
  r.deleted = deleted;
  r.unchanged = unchanged;
  r.bytes_received = c.s.bytes;
  r.kept = c.kept;
  return r;
}

// The paths of each change travel as frames (added, changed, deleted; each NUL-separated, a
// byte no path holds), not in the reply's body: a sync of 100,000 files would make the body
// larger than any message header may be.
std::vector<std::string> SyncReceiver::commit_paths(const Commit& c) {
  auto joined = [](const std::vector<const Entry*>& list) {
    std::string out;
    for (const Entry* e : list)
      if (e->type != EntryType::Dir) out.append(e->path).push_back('\0');
    return out;
  };
  return {joined(c.d.added), joined(c.d.changed), joined(c.d.deleted)};
}

// 3. The host manifest: the new entries with the stat values of the files as written (entries
//    this sync did not touch keep theirs), saved and remembered.
void SyncReceiver::save(Commit& c) {
  Session& s = c.s;
  auto saved = std::make_shared<Manifest>(std::move(s.incoming));
  size_t i = 0;
  for (auto& e : saved->entries) {  // both sorted by path: one walk
    if (e.type != EntryType::File) continue;
    while (i < c.host.entries.size() && c.host.entries[i].path < e.path) ++i;
    const Entry* before = i < c.host.entries.size() && c.host.entries[i].path == e.path ? &c.host.entries[i] : nullptr;
    if (before && before->same_as(e)) {
      e.mtime_ns = before->mtime_ns;
      e.ctime_ns = before->ctime_ns;
      e.ino = before->ino;
      continue;
    }
    struct stat st;
    int parent = -1;
    try {
      parent = c.dirs->get(parent_of(e.path));
    } catch (const std::exception&) {
    }
    if (parent >= 0 && fstatat(parent, base_of(e.path).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      e.mtime_ns = ns(st.st_mtim);
      e.ctime_ns = ns(st.st_ctim);
      e.ino = st.st_ino;
    }
  }
  saved->scan_ns = wall_ns();
  save_manifest_cache(manifest_path(s.dest) + ".manifest", *saved);
  write_file_replacing(manifest_path(s.dest) + ".dest", s.dest);
  HostCopy copy{nullptr, s.incoming_digest, saved->entries.size()};
  auto known = known_.find(s.dest);
  if (known != known_.end()) {
    known->second.watcher->wait(0, 0);  // the events of this commit (new directories get watched)
    known->second.digest = copy.digest;
    known->second.entries = copy.entries;
  } else {
    remember(s.dest, copy, watch(s.dest));
  }
}

}  // namespace xmesh::ws
