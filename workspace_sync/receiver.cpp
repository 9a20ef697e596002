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
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "fs_ops.hpp"
#include "hash_index.hpp"
#include "manifest_file.hpp"
#include "path_safety.hpp"
#include "scan.hpp"
#include "sync_bodies.hpp"

namespace xmesh::ws {

using json = nlohmann::json;

namespace {

std::string sys_error(const std::string& what, int e) { return what + ": " + std::strerror(e); }

std::string parent_of(const std::string& p) { return std::string(parent_dir(p)); }

std::string base_of(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// Directory descriptors by relative path, opened without following links, closed at the end
// (at most kMaxOpen at a time: a commit in a hundred thousand directories holds no more). A
// descriptor from get() is valid until the next get() (which may close every one).
class DirCache {
 public:
  static constexpr size_t kMaxOpen = 256;
  explicit DirCache(int base) : base_(base) {}
  int get(const std::string& rel) {
    auto it = fds_.find(rel);
    if (it != fds_.end()) return it->second.get();
    // Walks go in path order: the directories near go on being used.
    if (fds_.size() >= kMaxOpen) fds_.clear();
    unique_fd fd(open_dir_nofollow(base_, rel, false));
    const int raw = fd.get();
    fds_[rel] = std::move(fd);
    return raw;
  }
  void forget(const std::string& rel) {  // a directory that was removed
    for (auto it = fds_.begin(); it != fds_.end();) {
      if (it->first == rel || it->first.compare(0, rel.size() + 1, rel + "/") == 0)
        it = fds_.erase(it);
      else
        ++it;
    }
  }

 private:
  int base_;
  std::unordered_map<std::string, unique_fd> fds_;
};

// Removes the compiled caches of Python sources, so a proc never runs bytecode of an old text.
// Each directory's __pycache__ is listed once per commit (most have none).
class PycacheDropper {
 public:
  explicit PycacheDropper(DirCache& dirs) : dirs_(dirs) {}

  void drop(const std::string& path) {
    if (path.size() < 4 || path.compare(path.size() - 3, 3, ".py") != 0) return;
    Cache& c = cache_of(parent_of(path));
    if (!c.fd) return;
    std::string stem = base_of(path).substr(0, base_of(path).size() - 3) + ".";
    for (auto& name : c.names)
      if (name.compare(0, stem.size(), stem) == 0) unlinkat(c.fd.get(), name.c_str(), 0);
  }

 private:
  struct Cache {
    unique_fd fd;
    std::vector<std::string> names;
  };
  Cache& cache_of(const std::string& dir) {
    auto it = caches_.find(dir);
    if (it != caches_.end()) return it->second;
    if (caches_.size() >= DirCache::kMaxOpen) caches_.clear();  // bounded like the directories it reads through
    Cache& c = caches_[dir];
    int parent;
    try {
      parent = dirs_.get(dir);
    } catch (const std::exception&) {
      return c;
    }
    c.fd.reset(openat(parent, "__pycache__", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!c.fd) return c;
    int fd2 = dup(c.fd.get());
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
  // Hand what the allocator keeps of a session back to the system.
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
    int64_t mtime = timespec_ns(st.st_mtim);
    bool fresh = e.size == uint64_t(st.st_size) && e.mtime_ns == mtime && e.ctime_ns == timespec_ns(st.st_ctim) &&
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

SyncReceiver::HostCopy SyncReceiver::load_and_verify(const std::string& dest) {
  auto known = known_.find(dest);
  if (known != known_.end() && !known->second.watcher->wait(0, 0))
    return HostCopy{known->second.digest, known->second.entries};
  known_.erase(dest);
  // Watch first, then look: a change made while we look shows up as an event next time.
  auto watcher = watch(dest);
  HostCopy copy = check_on_disk(dest);
  remember(dest, copy, std::move(watcher));
  return copy;
}

namespace {
// The digest of a mapped manifest, read through once; nothing when an entry does not read.
std::optional<std::string> digest_of(const std::shared_ptr<const MappedManifest>& m) {
  try {
    DigestBuilder d;
    for (ManifestCursor at(m); !at.at_end(); at.next()) d.add(at.entry());
    return d.finish().hex();
  } catch (const std::runtime_error&) {
    return std::nullopt;
  }
}
}  // namespace

std::shared_ptr<const MappedManifest> SyncReceiver::saved_manifest(const std::string& dest, HostCopy& copy) {
  const std::string path = manifest_path(dest) + ".manifest";
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto m = MappedManifest::open(path);
    if (!m && copy.entries == 0) return MappedManifest::empty();
    if (m && m->count() == copy.entries && digest_of(m) == copy.digest) return m;
    // The file is not what was remembered: look at the disk itself (which rewrites it).
    known_.erase(dest);
    copy = load_and_verify(dest);
  }
  throw SyncRefused("the host's manifest of " + (dest.empty() ? std::string("its workspace") : dest) +
                    " cannot be read back (" + path + "); is its disk full?");
}

// The saved manifest of dest checked against the disk, entry by entry as it is read: what is
// kept of it is written aside as it goes (saved when anything changed) and hashed into the
// digest, so a million entries are checked in constant memory.
SyncReceiver::HostCopy SyncReceiver::check_on_disk(const std::string& dest) {
  const std::string path = manifest_path(dest) + ".manifest";
  const std::string dir = dest.empty() ? root_ : root_ + "/" + dest;
  const HostCopy none{DigestBuilder().finish().hex(), 0};
  unique_fd dirfd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dirfd) return none;  // no copy: a sync sends it whole
  const int64_t checked_ns = wall_ns();
  DigestBuilder digest;
  size_t count = 0;
  bool changed = false;
  int64_t stored_scan = 0;
  std::unique_ptr<CacheWriter> out;  // the checked manifest, written aside; saved only if it changed
  try {
    out = std::make_unique<CacheWriter>(path, checked_ns);
  } catch (const std::exception&) {  // a full disk: the check goes on, unsaved (the next repeats it)
  }
  auto check = [&](Entry&& e) {
    check_cancelled();
    std::optional<Entry> v = check_entry(dirfd.get(), e, stored_scan, &changed);
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
  };
  if (!for_each_cached_entry(path, [&](int64_t when) { stored_scan = when; }, check)) {
    unlink(path.c_str());  // what does not read is no manifest: the next sync sends the copy whole
    return none;
  }
  if (changed && out) {
    try {
      out->commit();
    } catch (const std::exception&) {
    }
  }
  return HostCopy{digest.finish().hex(), count};
}

Manifest SyncReceiver::verified_manifest(const std::string& dest) {
  HostCopy copy = load_and_verify(dest);
  Manifest m;
  for (ManifestCursor at(saved_manifest(dest, copy)); !at.at_end(); at.next()) m.entries.push_back(at.entry());
  return m;
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
  if (host.digest == digest && access(dir.c_str(), F_OK) == 0) {
    SyncReply r;
    r.same = true;
    r.dir = dir;
    r.entries = host.entries;
    return {r, {}};
  }
  auto s = std::make_unique<Session>();
  s->host = saved_manifest(dest, host);  // a saved manifest that was not what was remembered is checked again
  s->sid = sid;
  s->dest = dest;
  s->last_ms = now_ms;
  s->host_digest = host.digest;
  s->stage_dir = state_dir_ + "/stage/" + sid;
  remove_tree(s->stage_dir);
  if (mkdir(s->stage_dir.c_str(), 0700) != 0) throw SyncRefused(sys_error("cannot create " + s->stage_dir, errno));
  s->stage.reset(open(s->stage_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (s->stage.get() < 0) throw SyncRefused(sys_error("cannot open " + s->stage_dir, errno));
  sessions_[sid] = std::move(s);
  // "have" lets the controller send the plan as a delta against a manifest it knows.
  SyncReply r;
  r.same = false;
  r.dir = dir;
  r.have = host.digest;
  return {r, {}};
}

// ---- plan ------------------------------------------------------------------------------------

SyncReceiver::Plan& SyncReceiver::plan_for(Session& s, const SyncStepBody& step, size_t frames) {
  if (s.incoming) throw SyncRefused("sync session '" + s.sid + "' was already planned");
  if (frames == 0 || (step.base && frames < 2))
    throw SyncRefused(step.base ? "sync plan delta without its deleted paths" : "sync plan without a manifest");
  if (!s.plan) {
    if (step.part != 0) throw SyncRefused("sync plan part " + std::to_string(step.part) + " came before part 0");
    s.plan = std::make_unique<Plan>(s.host, s.incoming_path());
    s.plan->delta = step.base.has_value();
    s.plan->want_digest = step.digest;
  }
  Plan& p = *s.plan;
  if (step.part != p.next_part)
    throw SyncRefused("sync plan part " + std::to_string(step.part) + " came where part " +
                      std::to_string(p.next_part) + " was due");
  if (p.delta != step.base.has_value())
    throw SyncRefused("sync plan part " + std::to_string(step.part) + " is not of the same kind (delta or whole) as "
                      "the parts before it");
  if (s.open_parts.size() >= kMaxOpenParts)
    throw SyncRefused("sync plan part " + std::to_string(step.part) + " came while " +
                      std::to_string(s.open_parts.size()) + " parts still wait for their data (at most " +
                      std::to_string(kMaxOpenParts) + ")");
  ++p.next_part;
  return p;
}

SyncReceiver::Reply SyncReceiver::plan(Session& s, const SyncStepBody& step, const std::vector<std::string_view>& frames) {
  SyncReply full;  // the answer when the delta does not fit: send the whole manifest
  full.full = true;
  if (step.base && *step.base != s.host_digest && !s.plan) return {full, {}};
  Plan& p = plan_for(s, step, frames.size());
  auto decode = [&](std::string_view bytes) { return Manifest::decode_wire(bytes, kMaxPartEntries); };
  std::string need;  // the hashes asked for, 16 bytes each: their order is the part's object numbers
  auto& filling = s.open_parts[step.part];
  filling = std::make_unique<Part>();
  s.filling = filling.get();
  if (p.delta) {
    Manifest upserts = decode(frames[0]), deleted = decode(frames[1]);
    if (upserts.entries.size() + deleted.entries.size() > kMaxPartEntries)
      throw SyncRefused("sync plan part " + std::to_string(step.part) + " holds more than " +
                        std::to_string(kMaxPartEntries) + " entries");
    if (!merge_delta(s, upserts, deleted, step.last, need)) {
      reset_plan(s);
      return {full, {}};
    }
  } else {
    merge_whole(s, decode(frames[0]), step.last, need);
  }
  s.filling->left = s.filling->objects.size();
  s.filling = nullptr;
  if (s.open_parts[step.part]->left == 0) s.open_parts.erase(step.part);
  if (step.last && !finish_plan(s)) return {full, {}};
  SyncReply r;
  r.need = need.size() / 16;
  return {r, {need}};
}

// One entry of the incoming manifest, in path order, with the host's entry at its path.
void SyncReceiver::take_entry(Session& s, const Entry& e, const Entry* old, bool may_need, std::string& need) {
  check_cancelled();
  Plan& p = *s.plan;
  p.check.add(e);
  p.digest.add(e);
  p.out.add(e);
  if (!may_need || e.type != EntryType::File) return;
  if (old && old->type == EntryType::File && old->hash == e.hash && old->size == e.size) return;
  if (content_at_hand(s, e)) return;
  s.asked.insert(e.hash);  // the next path with this content waits for it too
  Part::Object o;
  o.hash = e.hash;
  o.size = e.size;
  o.path = e.path;
  o.mode = e.mode & 0777;
  s.filling->objects.push_back(std::move(o));
  need.append(reinterpret_cast<const char*>(&e.hash.lo), 8);
  need.append(reinterpret_cast<const char*>(&e.hash.hi), 8);
}

// The content of e is asked for already, staged already (a file of the staging area named by
// its hash), empty (staged now) or on the host.
bool SyncReceiver::content_at_hand(Session& s, const Entry& e) {
  if (s.asked.count(e.hash)) return true;
  const std::string name = e.hash.hex();
  if (faccessat(s.stage.get(), name.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0) return true;
  if (e.size == 0) {  // nothing to send: staged now
    unique_fd fd(openat(s.stage.get(), name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd) throw SyncRefused(sys_error("cannot stage " + e.path, errno));
    return true;
  }
  return s.host->count() > 0 && host_index(s).find(e.hash).has_value();
}

void SyncReceiver::merge_whole(Session& s, const Manifest& chunk, bool last, std::string& need) {
  Plan& p = *s.plan;
  for (auto& e : chunk.entries) {
    while (!p.host.at_end() && p.host.entry().path < e.path) p.host.next();  // deleted: the commit sees to them
    const Entry* old = !p.host.at_end() && p.host.entry().path == e.path ? &p.host.entry() : nullptr;
    take_entry(s, e, old, true, need);
  }
  if (last)
    while (!p.host.at_end()) p.host.next();
}

// A delta part merged with the host manifest: host entries up to the part's last path are
// taken over unless deleted or replaced. False when the delta does not fit the host manifest.
bool SyncReceiver::merge_delta(Session& s, const Manifest& upserts, const Manifest& deleted, bool last,
                               std::string& need) {
  Plan& p = *s.plan;
  auto up = upserts.entries.begin(), del = deleted.entries.begin();
  auto copy_host_before = [&](const std::string* path) {
    while (!p.host.at_end() && (!path || p.host.entry().path < *path)) {
      take_entry(s, p.host.entry(), nullptr, false, need);
      p.host.next();
    }
  };
  while (up != upserts.entries.end() || del != deleted.entries.end()) {
    const bool take_up = del == deleted.entries.end() || (up != upserts.entries.end() && up->path < del->path);
    const std::string& path = take_up ? up->path : del->path;
    if (!take_up && up != upserts.entries.end() && up->path == del->path) return false;  // both: not a delta
    copy_host_before(&path);
    const bool on_host = !p.host.at_end() && p.host.entry().path == path;
    if (take_up) {
      take_entry(s, *up, on_host ? &p.host.entry() : nullptr, true, need);
      ++up;
    } else {
      if (!on_host) return false;  // deletes what the host lacks
      ++del;
    }
    if (on_host) p.host.next();
  }
  if (last) copy_host_before(nullptr);
  return true;
}

// The last part came: the incoming manifest is whole (checked, its digest known) and saved
// aside in the staging area for the commit.
bool SyncReceiver::finish_plan(Session& s) {
  Plan& p = *s.plan;
  const std::string digest = p.digest.finish().hex();
  if (p.delta && digest != p.want_digest) {
    reset_plan(s);
    return false;
  }
  p.check.finish();  // every symlink against the whole manifest's
  try {
    p.out.commit();
  } catch (const std::runtime_error& x) {
    throw SyncRefused(std::string("cannot stage the manifest: ") + x.what());
  }
  s.plan.reset();
  s.incoming = MappedManifest::open(s.incoming_path());
  if (!s.incoming) throw SyncRefused("cannot read back the staged manifest " + s.incoming_path());
  s.incoming_digest = digest;
  return true;
}

// A delta that did not fit: the plan starts over (from part 0, the manifest whole). Objects
// complete already stay staged (named by their hash: the new plan finds them); the others go.
void SyncReceiver::reset_plan(Session& s) {
  s.plan.reset();
  s.filling = nullptr;
  for (auto& [n, part] : s.open_parts)
    for (auto& o : part->objects)
      if (!o.done) unlinkat(s.stage.get(), o.hash.hex().c_str(), 0);
  s.open_parts.clear();
  s.asked.clear();
  unlinkat(s.stage.get(), "incoming", 0);
}

// ---- data ------------------------------------------------------------------------------------

SyncReceiver::Reply SyncReceiver::data(Session& s, const SyncStepBody& step, const std::vector<std::string_view>& frames) {
  auto part_it = s.open_parts.find(step.part);
  std::string_view payload = frames.empty() ? std::string_view() : frames[0];
  size_t at = 0;
  std::vector<char> raw;
  for (auto& p : step.pieces) {
    check_cancelled();
    if (part_it == s.open_parts.end())
      throw SyncRefused("sync data names plan part " + std::to_string(step.part) + ", which asked for nothing more");
    Part& part = *part_it->second;
    size_t idx = static_cast<size_t>(p[0]);
    uint64_t offset = p[1], raw_len = p[2], stored = p[3];
    bool z = p[4] != 0;
    if (idx >= part.objects.size() || part.objects[idx].done)
      throw SyncRefused("sync data names an object the host did not ask for");
    auto& o = part.objects[idx];
    if (offset != o.written || raw_len > o.size - o.written || at + stored > payload.size() || (!z && stored != raw_len))
      throw SyncRefused("sync data for " + o.path + " is out of order or malformed");
    const char* bytes = payload.data() + at;
    if (z) {
      raw.resize(raw_len);
      size_t n = ZSTD_decompress(raw.data(), raw.size(), bytes, stored);
      if (ZSTD_isError(n) || n != raw_len) throw SyncRefused("sync data for " + o.path + " does not decompress");
      bytes = raw.data();
    }
    at += stored;
    const std::string name = o.hash.hex();
    if (!o.fd) {
      o.fd.reset(openat(s.stage.get(), name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!o.fd) throw SyncRefused(sys_error("cannot stage " + o.path, errno));
      fchmod(o.fd.get(), o.mode);  // the mode of the first path that wants it (not subject to the umask)
      o.state = XXH3_createState();
      XXH3_128bits_reset(o.state);
    }
    if (!write_all(o.fd.get(), bytes, raw_len)) throw SyncRefused(sys_error("cannot write " + o.path + " on the host", errno));
    XXH3_128bits_update(o.state, bytes, raw_len);
    o.written += raw_len;
    if (o.written < o.size) continue;
    XXH128_hash_t h = XXH3_128bits_digest(o.state);
    XXH3_freeState(o.state);
    o.state = nullptr;
    o.fd.reset();
    if (Hash128{h.low64, h.high64} != o.hash)
      throw SyncRefused("the content of " + o.path + " does not match its manifest (it changed while being sent); "
                        "sync again");
    o.done = true;
    s.asked.erase(o.hash);
    if (--part.left == 0) {  // every object of the part is staged: it is forgotten
      s.open_parts.erase(part_it);
      part_it = s.open_parts.end();
    }
  }
  SyncReply r;
  r.received = s.bytes;
  return {r, {}};
}

// ---- commit ----------------------------------------------------------------------------------

namespace {
// What a commit does at one path, from the entries of the incoming and the host manifest there:
// nothing, remove the old entry (deleted), make a directory, change a file's mode only, or put a
// staged file or link in place. prepare and switch_in walk the same merge and agree on it.
enum class Change { none, deleted, dir, mode, staged };

Change change_at(const Entry* now, const Entry* before) {
  if (!now) return Change::deleted;
  if (before && now->same_as(*before)) return Change::none;
  if (now->type == EntryType::Dir) return Change::dir;
  if (now->type == EntryType::File && before && before->type == EntryType::File && before->hash == now->hash &&
      before->size == now->size)
    return Change::mode;
  return Change::staged;
}

// The old entry at a path goes before anything is put in place: when deleted, or when a
// directory becomes something else or something else a directory (a rename replaces the rest).
bool removed_first(const Entry* now, const Entry* before) {
  if (!before) return false;
  if (!now) return true;
  return now->type != before->type && (now->type == EntryType::Dir || before->type == EntryType::Dir);
}

// Calls fn with each NUL-terminated record of fd, the last first, reading 1 MiB at a time.
void for_each_record_backwards(int fd, const std::function<void(std::string_view)>& fn) {
  struct stat st;
  if (fstat(fd, &st) != 0) throw SyncRefused(sys_error("cannot read the commit's list of removals", errno));
  uint64_t end = static_cast<uint64_t>(st.st_size);
  std::string carry;  // the tail of a record that starts in the block before
  std::vector<size_t> starts;
  while (end > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(1u << 20, end));
    std::string buf(n, '\0');
    if (!pread_all(fd, buf.data(), n, end - n))
      throw SyncRefused(sys_error("cannot read the commit's list of removals", errno));
    end -= n;
    buf += carry;
    size_t from = 0;
    if (end > 0) {  // what precedes the first NUL belongs to a record that starts before
      const size_t nul = buf.find('\0');
      if (nul == std::string::npos) {
        carry = std::move(buf);
        continue;
      }
      from = nul + 1;
    }
    carry = buf.substr(0, from);
    starts.clear();
    for (size_t at = from; at < buf.size(); at = buf.find('\0', at) + 1) starts.push_back(at);
    for (size_t i = starts.size(); i-- > 0;) {
      const size_t stop = buf.find('\0', starts[i]);
      fn(std::string_view(buf).substr(starts[i], stop - starts[i]));
    }
  }
}

// What the controller hears of a commit: counts of files and links (directories are not
// counted), the first kReportPaths paths of each kind and every .py path.
class ChangeReport {
 public:
  enum Kind { added, changed, deleted };
  void count(const Entry* now, const Entry* before) {
    if (!now) {
      if (before->type != EntryType::Dir) note(deleted, before->path);
      return;
    }
    if (now->type == EntryType::Dir) return;
    if (!before)
      note(added, now->path);
    else if (!now->same_as(*before))
      note(changed, now->path);
    else
      ++unchanged_;
  }
  void reply(SyncReply& r) const {
    r.added = counts_[added];
    r.changed = counts_[changed];
    r.deleted = counts_[deleted];
    r.unchanged = unchanged_;
  }
  // added, changed, deleted (NUL-separated, at most kReportPaths each) and every .py path.
  std::vector<std::string> frames() const { return {paths_[added], paths_[changed], paths_[deleted], py_}; }

 private:
  void note(Kind k, const std::string& path) {
    if (counts_[k]++ < SyncReceiver::kReportPaths) paths_[k].append(path).push_back('\0');
    if (path.size() > 3 && path.compare(path.size() - 3, 3, ".py") == 0) py_.append(path).push_back('\0');
  }
  uint64_t counts_[3] = {0, 0, 0}, unchanged_ = 0;
  std::string paths_[3], py_;
};
}  // namespace

// What a commit works with: the session, the directories it writes in, what it reports.
struct SyncReceiver::Commit {
  Session& s;
  unique_fd root, dest;
  std::unique_ptr<DirCache> dirs;
  std::unique_ptr<PycacheDropper> pycache;
  ChangeReport report;
  std::vector<std::string> kept;  // old directories that could not be removed (the first kReportPaths)
  uint64_t kept_more = 0;

  Commit(Session& session, const std::string& root_dir) : s(session) {
    root.reset(open(root_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (root.get() < 0) throw SyncRefused(sys_error("cannot open " + root_dir, errno));
    dest.reset(open_dir_nofollow(root.get(), s.dest, true));
    dirs = std::make_unique<DirCache>(dest.get());
    pycache = std::make_unique<PycacheDropper>(*dirs);
  }
  ~Commit() {
    pycache.reset();  // before the directories it reads through
    dirs.reset();
  }
};

SyncReceiver::Reply SyncReceiver::commit(Session& s) {
  if (!s.incoming) throw SyncRefused(s.plan ? "sync commit before the plan's last part" : "sync commit before its plan");
  if (!s.open_parts.empty()) {
    size_t missing = 0;
    std::string first;
    for (auto& [n, part] : s.open_parts)
      for (auto& o : part->objects)
        if (!o.done && missing++ == 0) first = o.path;
    throw SyncRefused(std::to_string(missing) + " files of this sync did not arrive (first: " + first + ")");
  }
  Commit c(s, root_);
  prepare(c);     // every new or changed file aside; nothing visible changes
  switch_in(c);   // deletions, new directories, every staged file renamed in
  save(c);        // the host manifest, with the stat values of what was written
  SyncReply r;
  r.dir = s.dest.empty() ? root_ : root_ + "/" + s.dest;
  c.report.reply(r);
  r.bytes_received = s.bytes;
  if (c.kept_more) c.kept.push_back("and " + std::to_string(c.kept_more) + " more");
  r.kept = std::move(c.kept);
  return {r, c.report.frames()};
}

const HashIndex& SyncReceiver::host_index(Session& s) {
  if (!s.host_index) {
    try {
      s.host_index = std::make_unique<HashIndex>(s.host, s.stage_dir + "/host-index");
    } catch (const std::runtime_error& x) {
      throw SyncRefused(std::string("cannot index the host's copy: ") + x.what());
    }
  }
  return *s.host_index;
}

// 1. Every new or changed file and symlink staged aside with its mode (nothing visible changes
//    yet): the received object itself for the first path that has its content (renamed
//    "<hash>.f"), else as "p<n>" (the n-th such in path order): a link, a copy of that object,
//    or a copy of the host's own file with that content (a renamed or copied file).
void SyncReceiver::prepare(Commit& c) {
  const int stage = c.s.stage.get();
  uint64_t n = 0;
  for (ManifestMerge m(c.s.incoming, c.s.host); !m.at_end(); m.next()) {
    check_cancelled();
    const Entry* e = m.now();
    if (change_at(e, m.before()) != Change::staged) continue;
    std::string staged = e->hash.hex() + ".f";
    if (e->type == EntryType::Symlink) {
      staged = "p" + std::to_string(n++);
      if (symlinkat(e->target.c_str(), stage, staged.c_str()) != 0)
        throw SyncRefused(sys_error("cannot stage " + e->path, errno));
      continue;
    }
    if (renameat(stage, e->hash.hex().c_str(), stage, staged.c_str()) != 0) {
      const std::string first = staged;
      staged = "p" + std::to_string(n++);
      stage_copy(c, *e, first, staged);
    }
    if (m.before())
      fix_staged(c, *e, m.before(), staged);
    else
      fchmodat(stage, staged.c_str(), e->mode & 0777, 0);
  }
}

// A later path's copy of content staged for an earlier one (`first`), or of the host's own file
// with that content.
void SyncReceiver::stage_copy(Commit& c, const Entry& e, const std::string& first, const std::string& staged) {
  const int stage = c.s.stage.get();
  if (faccessat(stage, first.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
    copy_checked(stage, first, stage, staged, e);
    return;
  }
  std::optional<uint64_t> at = c.s.host->count() ? host_index(c.s).find(e.hash) : std::nullopt;
  if (!at) throw SyncRefused("the content of " + e.path + " is neither staged nor on the host");
  const Entry src = c.s.host->entry_at(*at);
  copy_checked(c.dirs->get(parent_of(src.path)), base_of(src.path), stage, staged, e);
}

// A staged file gets its entry's mode and, replacing an old text, an mtime outside the old
// text's second: Python trusts a .pyc while the source's size and whole-second mtime match.
void SyncReceiver::fix_staged(Commit& c, const Entry& e, const Entry* old, const std::string& name) {
  unique_fd fd(openat(c.s.stage.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) throw SyncRefused(sys_error("cannot open staged " + e.path, errno));
  fchmod(fd.get(), e.mode & 0777);
  struct stat old_st, new_st;
  if (old && fstatat(c.dirs->get(parent_of(e.path)), base_of(e.path).c_str(), &old_st, AT_SYMLINK_NOFOLLOW) == 0 &&
      fstat(fd.get(), &new_st) == 0 && old_st.st_mtim.tv_sec == new_st.st_mtim.tv_sec) {
    timespec t[2] = {{0, UTIME_OMIT}, {old_st.st_mtim.tv_sec + 1, 0}};
    futimens(fd.get(), t);
  }
}

// 2a. What goes first, deepest first: the paths are listed in a file of the staging area as the
//     merge finds them and removed in reverse order (children sort after their directory).
void SyncReceiver::remove_old(Commit& c) {
  unique_fd list(openat(c.s.stage.get(), "removals", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (list.get() < 0) throw SyncRefused(sys_error("cannot stage the commit's removals", errno));
  std::string piece;
  auto flush = [&] {
    if (!write_all(list.get(), piece.data(), piece.size()))
      throw SyncRefused(sys_error("cannot stage the commit's removals", errno));
    piece.clear();
  };
  for (ManifestMerge m(c.s.incoming, c.s.host); !m.at_end(); m.next()) {
    if (!removed_first(m.now(), m.before())) continue;
    // type, whether the new manifest has the path, the path
    piece.push_back(static_cast<char>(m.before()->type));
    piece.push_back(m.now() ? '1' : '0');
    piece.append(m.before()->path).push_back('\0');
    if (piece.size() >= (1u << 20)) flush();
  }
  flush();
  for_each_record_backwards(list.get(), [&](std::string_view rec) {
    check_cancelled();
    const EntryType type = static_cast<EntryType>(rec[0]);
    const bool needed = rec[1] == '1';
    const std::string path(rec.substr(2));
    int parent;
    try {
      parent = c.dirs->get(parent_of(path));
    } catch (const std::exception&) {
      return;  // its directory is gone already
    }
    if (type == EntryType::Dir) {
      c.dirs->forget(path);
      if (unlinkat(parent, base_of(path).c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        if (needed) throw SyncRefused(sys_error("cannot replace directory " + path + " on the host", errno));
        if (c.kept.size() < kReportPaths)
          c.kept.push_back(path + " (" + std::strerror(errno) + ")");
        else
          ++c.kept_more;
      }
    } else {
      unlinkat(parent, base_of(path).c_str(), 0);
      if (type == EntryType::File) c.pycache->drop(path);  // after: it may reopen directories (parent)
    }
  });
}

// 2b. The switch: removals, then in path order (a directory before what it holds) new
//     directories made, staged files and links renamed in, modes changed.
void SyncReceiver::switch_in(Commit& c) {
  remove_old(c);
  uint64_t n = 0;
  for (ManifestMerge m(c.s.incoming, c.s.host); !m.at_end(); m.next()) {
    check_cancelled();
    const Entry *e = m.now(), *old = m.before();
    c.report.count(e, old);
    switch (change_at(e, old)) {
      case Change::dir: {
        int parent = c.dirs->get(parent_of(e->path));
        if (mkdirat(parent, base_of(e->path).c_str(), e->mode & 0777) != 0 && errno != EEXIST)
          throw SyncRefused(sys_error("cannot create directory " + e->path + " on the host", errno));
        fchmodat(parent, base_of(e->path).c_str(), e->mode & 0777, 0);
        break;
      }
      case Change::staged: {  // the object itself where prepare kept it, else the n-th copy or link
        const int parent = c.dirs->get(parent_of(e->path));
        const std::string first = e->hash.hex() + ".f";
        if ((e->type != EntryType::File ||
             renameat(c.s.stage.get(), first.c_str(), parent, base_of(e->path).c_str()) != 0) &&
            renameat(c.s.stage.get(), ("p" + std::to_string(n++)).c_str(), parent, base_of(e->path).c_str()) != 0)
          throw SyncRefused(sys_error("cannot move " + e->path + " into place", errno));
        if (e->type == EntryType::File) c.pycache->drop(e->path);
        break;
      }
      case Change::mode:
        fchmodat(c.dirs->get(parent_of(e->path)), base_of(e->path).c_str(), e->mode & 0777, 0);
        break;
      default:
        break;
    }
  }
}

// 3. The host manifest: the new entries with the stat values of the files as written (entries
//    this sync did not touch keep theirs), written entry by entry and remembered.
void SyncReceiver::save(Commit& c) {
  Session& s = c.s;
  try {
    CacheWriter out(manifest_path(s.dest) + ".manifest", wall_ns());
    for (ManifestMerge m(s.incoming, s.host); !m.at_end(); m.next()) {
      if (!m.now()) continue;
      Entry e = *m.now();
      e.mtime_ns = e.ctime_ns = 0;
      e.ino = 0;
      const Entry* before = m.before();
      if (e.type == EntryType::File && before && before->same_as(e)) {
        e.mtime_ns = before->mtime_ns;
        e.ctime_ns = before->ctime_ns;
        e.ino = before->ino;
      } else if (e.type == EntryType::File) {
        struct stat st;
        int parent = -1;
        try {
          parent = c.dirs->get(parent_of(e.path));
        } catch (const std::exception&) {
        }
        if (parent >= 0 && fstatat(parent, base_of(e.path).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
          e.mtime_ns = timespec_ns(st.st_mtim);
          e.ctime_ns = timespec_ns(st.st_ctim);
          e.ino = st.st_ino;
        }
      }
      out.add(e);
    }
    out.commit();
    write_file_replacing(manifest_path(s.dest) + ".dest", s.dest);
  } catch (const std::runtime_error& x) {
    throw SyncRefused(std::string("the files are in place but the host's manifest could not be saved (the next "
                                  "sync checks the copy by content): ") + x.what());
  }
  HostCopy copy{s.incoming_digest, static_cast<size_t>(s.incoming->count())};
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
