// A sync's receiving side (receiver.hpp): sessions, the host's saved manifest checked against
// the disk, and the begin, plan and data steps; the commit is receiver_commit.cpp's.
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
#include "receiver_session.hpp"
#include "sync_bodies.hpp"

namespace xmesh::ws {

using json = nlohmann::json;

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

}  // namespace xmesh::ws
