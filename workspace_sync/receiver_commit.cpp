// A sync's commit on the receiving side (receiver.hpp): what changes at each path, staged files
// put in place (old entries removed first where they must be), stale bytecode dropped, the new
// manifest saved, what changed reported.
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
#include "receiver_session.hpp"

namespace xmesh::ws {

using json = nlohmann::json;

namespace {
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
