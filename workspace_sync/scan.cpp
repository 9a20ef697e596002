#include "scan.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <system_error>
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "fs_ops.hpp"
#include "path_safety.hpp"

namespace xmesh::ws {

int64_t wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

bool read_small_file(int dirfd, const char* name, std::string& out) {
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0 && out.size() < (1 << 20)) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return true;
}

// A directory waiting to be listed, with the rule files that apply in it (its ancestors').
struct DirTask {
  int fd = -1;
  std::string rel;
  std::shared_ptr<const IgnoreRules> rules;
  bool walk = true;  // queue the subdirectories (else only those the previous manifest lacks)
};

// The walk runs on a few threads (stat calls dominate a no-change scan; hashing a new tree):
// directories are tasks in a shared queue, each thread collects its own entries.
class Scanner {
 public:
  Scanner(const ScanOptions& opts, const Manifest* previous) : opts_(opts) {
    if (previous) {
      previous_.reserve(previous->entries.size());
      for (auto& e : previous->entries) previous_.emplace(e.path, &e);
      previous_scan_ns_ = previous->scan_ns;
    }
    for (auto& p : opts.excludes) user_.add_line("", p);
    if (opts.default_excludes)
      for (const char* p : kDefaultExcludes) defaults_.add_line("", p);
  }

  ScanResult run(int rootfd) {
    std::vector<DirTask> start;
    start.push_back({rootfd, "", std::make_shared<IgnoreRules>()});
    return run(std::move(start));
  }

  // Walks from the given directories (their descriptors are closed, except the root's); a
  // listing that comes upon one of them leaves it to its own task.
  ScanResult run(std::vector<DirTask> start) {
    for (auto& t : start) {
      starts_.insert(t.rel);
      queue_.push_back(std::move(t));
    }
    unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
    std::vector<ScanResult> parts(n);
    std::vector<std::thread> threads;
    for (unsigned i = 1; i < n; ++i) threads.emplace_back([this, &parts, i] { work(parts[i]); });
    work(parts[0]);
    for (auto& t : threads) t.join();
    if (error_) std::rethrow_exception(error_);
    ScanResult out;
    size_t total = 0;
    for (auto& p : parts) total += p.manifest.entries.size();
    out.manifest.entries.reserve(total);  // exact: no slack of a growing vector on a million entries
    for (auto& p : parts) {
      auto& dst = out.manifest.entries;
      dst.insert(dst.end(), std::make_move_iterator(p.manifest.entries.begin()),
                 std::make_move_iterator(p.manifest.entries.end()));
      std::vector<Entry>().swap(p.manifest.entries);  // each thread's part goes once moved
      out.skipped.insert(out.skipped.end(), p.skipped.begin(), p.skipped.end());
      out.too_large.insert(out.too_large.end(), p.too_large.begin(), p.too_large.end());
      out.hashed_files += p.hashed_files;
      out.hashed_bytes += p.hashed_bytes;
      out.reused += p.reused;
    }
    std::sort(out.skipped.begin(), out.skipped.end());
    std::sort(out.too_large.begin(), out.too_large.end());
    return out;
  }

 private:
  void work(ScanResult& out) {
    while (true) {
      DirTask task;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return !queue_.empty() || busy_ == 0 || error_; });
        if (error_ || queue_.empty()) {
          cv_.notify_all();
          return;
        }
        task = std::move(queue_.front());
        queue_.pop_front();
        ++busy_;
      }
      try {
        list(task, out);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      if (!task.rel.empty()) close(task.fd);
      {
        std::lock_guard<std::mutex> g(mu_);
        --busy_;
      }
      cv_.notify_all();
    }
  }

  void list(DirTask& task, ScanResult& out) {
    const std::string& prefix = task.rel;
    std::shared_ptr<const IgnoreRules> rules = task.rules;
    if (opts_.use_ignore_files) {
      std::shared_ptr<IgnoreRules> mine;
      for (const char* f : {".gitignore", ".xmeshignore"}) {
        std::string text;
        if (!read_small_file(task.fd, f, text)) continue;
        if (!mine) mine = std::make_shared<IgnoreRules>(*rules);
        mine->add_text(prefix, text);
      }
      if (mine) rules = mine;
    }
    IgnoreStack ignore{&user_, rules.get(), &defaults_};
    int fd2 = dup(task.fd);
    DIR* d = fd2 >= 0 ? fdopendir(fd2) : nullptr;
    if (!d) {
      if (fd2 >= 0) close(fd2);
      out.skipped.emplace_back(prefix.empty() ? "." : prefix, std::string("cannot list: ") + std::strerror(errno));
      return;
    }
    std::vector<DirTask> subdirs;
    while (dirent* de = readdir(d)) {
      const char* name = de->d_name;
      if (!std::strcmp(name, ".") || !std::strcmp(name, "..")) continue;
      if (prefix.empty() && !std::strcmp(name, kStateDirName)) continue;  // a host copy's own state
      std::string rel = prefix.empty() ? std::string(name) : prefix + "/" + name;
      struct stat st;
      if (fstatat(task.fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // vanished meanwhile
      bool is_dir = S_ISDIR(st.st_mode);
      if (ignore.ignored(rel, is_dir)) continue;
      if (is_dir) {
        int sub = openat(task.fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
          out.skipped.emplace_back(rel, std::string("cannot open: ") + std::strerror(errno));
          continue;
        }
        Entry e;
        e.path = rel;
        e.type = EntryType::Dir;
        e.mode = st.st_mode & 07777;
        out.manifest.entries.push_back(std::move(e));
        if ((task.walk || !was_dir(rel)) && !starts_.count(rel)) {
          subdirs.push_back({sub, rel, rules, true});
        } else {
          close(sub);  // unchanged below: the caller keeps what the previous scan found there
        }
      } else if (S_ISREG(st.st_mode)) {
        try {
          add_file(task.fd, name, rel, st, out);
        } catch (const std::system_error& ex) {
          if (ex.code().value() != ENOENT) throw;  // deleted while we looked: not part of this state
        }
      } else if (S_ISLNK(st.st_mode)) {
        add_symlink(task.fd, name, rel, st, out);
      } else {
        const char* kind = S_ISFIFO(st.st_mode) ? "a named pipe" : S_ISSOCK(st.st_mode) ? "a socket" : "a device file";
        out.skipped.emplace_back(rel, std::string("is ") + kind);
      }
    }
    closedir(d);
    if (!subdirs.empty()) {
      std::lock_guard<std::mutex> g(mu_);
      for (auto& t : subdirs) queue_.push_back(std::move(t));
    }
  }

  void add_file(int dirfd, const char* name, const std::string& rel, const struct stat& st, ScanResult& out) {
    if (opts_.max_file_size && uint64_t(st.st_size) > opts_.max_file_size) {
      out.too_large.emplace_back(rel, uint64_t(st.st_size));
      return;
    }
    Entry e;
    e.path = rel;
    e.type = EntryType::File;
    e.mode = st.st_mode & 07777;
    auto it = previous_.find(rel);
    const Entry* old = it == previous_.end() ? nullptr : it->second;
    int64_t mtime = timespec_ns(st.st_mtim), ctime = timespec_ns(st.st_ctim);
    if (old && old->type == EntryType::File && old->size == uint64_t(st.st_size) && old->mtime_ns == mtime &&
        old->ctime_ns == ctime && old->ino == st.st_ino && mtime < previous_scan_ns_ - kRacyWindowNs) {
      e.size = old->size;
      e.hash = old->hash;
      e.mtime_ns = mtime;
      e.ctime_ns = ctime;
      e.ino = st.st_ino;
      ++out.reused;
    } else {
      e.hash = hash_file(dirfd, name, rel, &e.size, &e.mtime_ns, &e.ctime_ns, &e.ino);
      ++out.hashed_files;
      out.hashed_bytes += e.size;
    }
    out.manifest.entries.push_back(std::move(e));
  }

  void add_symlink(int dirfd, const char* name, const std::string& rel, const struct stat& st, ScanResult& out) {
    std::string target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    ssize_t n = readlinkat(dirfd, name, target.data(), target.size());
    if (n < 0) {
      out.skipped.emplace_back(rel, std::string("cannot read the link: ") + std::strerror(errno));
      return;
    }
    target.resize(static_cast<size_t>(n));
    std::string why;
    if (!symlink_stays_inside(rel, target, &why)) {
      out.skipped.emplace_back(rel, "symlink to " + target + " " + why);
      return;
    }
    Entry e;
    e.path = rel;
    e.type = EntryType::Symlink;
    e.mode = 0777;
    e.size = target.size();
    e.target = target;
    out.manifest.entries.push_back(std::move(e));
  }

  bool was_dir(const std::string& rel) const {
    auto it = previous_.find(rel);
    return it != previous_.end() && it->second->type == EntryType::Dir;
  }

 public:
  // The rules of the ignore files above directory rel (not its own) and whether rel or one of
  // its ancestors is ignored, read as a walk from the root would.
  std::shared_ptr<const IgnoreRules> rules_above(int rootfd, const std::string& rel, bool* ignored) {
    auto rules = std::make_shared<IgnoreRules>();
    *ignored = false;
    if (rel.empty()) return rules;
    size_t from = 0;
    std::string at;  // the directory whose ignore files apply next
    while (true) {
      if (opts_.use_ignore_files) {
        int fd = -1;
        try {
          fd = open_dir_nofollow(rootfd, at, false);  // "" gives the root, duplicated
        } catch (const std::exception&) {
        }
        if (fd >= 0) {
          for (const char* f : {".gitignore", ".xmeshignore"}) {
            std::string text;
            if (read_small_file(fd, f, text)) rules->add_text(at, text);
          }
          close(fd);
        }
      }
      size_t slash = rel.find('/', from);
      std::string next = rel.substr(0, slash);
      IgnoreStack ignore{&user_, rules.get(), &defaults_};
      if ((at.empty() && next == kStateDirName) || ignore.ignored(next, true)) {
        *ignored = true;
        return rules;
      }
      if (slash == std::string::npos) return rules;
      at = next;
      from = slash + 1;
    }
  }

 private:
  const ScanOptions& opts_;
  std::unordered_map<std::string_view, const Entry*> previous_;
  std::set<std::string> starts_;
  int64_t previous_scan_ns_ = 0;
  IgnoreRules user_, defaults_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DirTask> queue_;
  int busy_ = 0;
  std::exception_ptr error_;
};

// path lies strictly under one of roots (a set of directories, never "").
bool strictly_under(std::string_view path, const std::set<std::string, std::less<>>& roots) {
  if (roots.empty()) return false;
  for (size_t slash = path.find('/'); slash != std::string_view::npos; slash = path.find('/', slash + 1))
    if (roots.count(path.substr(0, slash))) return true;
  return false;
}

}  // namespace

namespace {
// Links whose targets pass through another link leave the manifest, said in skipped: only the
// whole tree's links tell (path_safety.hpp).
void skip_links_through_links(ScanResult& r) {
  auto dropped = drop_links_through_links(r.manifest);
  if (dropped.empty()) return;
  for (auto& d : dropped)
    if (std::find(r.skipped.begin(), r.skipped.end(), d) == r.skipped.end()) r.skipped.push_back(std::move(d));
  std::sort(r.skipped.begin(), r.skipped.end());
}
}  // namespace

ScanResult rescan_tree(const std::string& root, const ScanOptions& opts, const Manifest& previous,
                       const ScanResult& notes, const ChangedDirs& changes, int64_t started_ns) {
  if (changes.everything || changes.walked.count("")) return scan_tree(root, opts, &previous);
  Scanner s(opts, &previous);
  int rootfd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) throw std::runtime_error("cannot open workspace " + root + ": " + std::strerror(errno));
  std::set<std::string, std::less<>> walked, listed;  // what this rescan replaces
  std::vector<DirTask> tasks;
  auto start = [&](const std::string& rel, bool walk) {
    bool ignored = false;
    auto rules = s.rules_above(rootfd, rel, &ignored);
    (walk ? walked : listed).insert(rel);  // an ignored or vanished directory: its entries go too
    if (ignored) return;
    int fd = rel.empty() ? rootfd : -1;
    if (!rel.empty()) {
      try {
        fd = open_dir_nofollow(rootfd, rel, false);
      } catch (const std::exception&) {
        return;
      }
    }
    tasks.push_back({fd, rel, rules, walk});
  };
  for (auto& w : changes.walked)
    if (!strictly_under(w, walked)) start(w, true);  // sorted: an outer tree comes first
  for (auto& l : changes.listed) {
    if (walked.count(l) || strictly_under(l, walked)) continue;
    const Entry* before = l.empty() ? nullptr : previous.find(l);
    start(l, !l.empty() && !(before && before->type == EntryType::Dir));
  }
  ScanResult fresh;
  try {
    fresh = s.run(std::move(tasks));
  } catch (...) {
    close(rootfd);
    throw;
  }
  close(rootfd);
  fresh.manifest.sort();

  // What the fresh look replaces: the entries of listed directories and everything below walked
  // ones (a walked directory's own entry comes from its parent's listing, if that was listed).
  auto replaced = [&](std::string_view path) { return listed.count(parent_dir(path)) || strictly_under(path, walked); };
  ScanResult out;
  out.hashed_files = fresh.hashed_files;
  out.hashed_bytes = fresh.hashed_bytes;
  auto& merged = out.manifest.entries;
  std::vector<char> kept;  // per merged entry: taken over from previous
  merged.reserve(previous.entries.size() + fresh.manifest.entries.size());
  const auto& a = previous.entries;
  auto& b = fresh.manifest.entries;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (i < a.size() && replaced(a[i].path)) {
      ++i;
      continue;
    }
    if (j == b.size() || (i < a.size() && a[i].path < b[j].path)) {
      merged.push_back(a[i++]);
      kept.push_back(1);
    } else {
      if (i < a.size() && a[i].path == b[j].path) ++i;  // the fresh look wins
      merged.push_back(std::move(b[j++]));
      kept.push_back(0);
    }
  }
  // Entries whose parent directory is gone (removed, or now a file) go with it. Parents sort
  // before their children, so one pass sees each parent first.
  std::unordered_set<std::string_view> dirs;
  size_t n = 0;
  out.reused = fresh.reused;
  for (size_t k = 0; k < merged.size(); ++k) {
    std::string_view parent = parent_dir(merged[k].path);
    if (!parent.empty() && !dirs.count(parent)) {
      continue;
    }
    if (n != k) merged[n] = std::move(merged[k]);
    if (merged[n].type == EntryType::Dir) dirs.insert(merged[n].path);
    if (kept[k] && merged[n].type == EntryType::File) ++out.reused;
    ++n;
  }
  merged.resize(n);
  auto carry = [&](const auto& before, const auto& now, auto& into) {
    for (auto& item : before) {
      std::string_view parent = parent_dir(item.first);
      if (!replaced(item.first) && (parent.empty() || dirs.count(parent))) into.push_back(item);
    }
    into.insert(into.end(), now.begin(), now.end());
    std::sort(into.begin(), into.end());
  };
  carry(notes.skipped, fresh.skipped, out.skipped);
  carry(notes.too_large, fresh.too_large, out.too_large);
  out.incremental = true;
  out.manifest.scan_ns = started_ns;
  skip_links_through_links(out);
  return out;
}

ScanResult scan_tree(const std::string& root, const ScanOptions& opts, const Manifest* previous) {
  Scanner s(opts, previous);
  int64_t started = wall_ns();
  int fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open workspace " + root + ": " + std::strerror(errno));
  ScanResult r;
  try {
    r = s.run(fd);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  r.manifest.scan_ns = started;
  r.manifest.sort();
  skip_links_through_links(r);
  return r;
}

}  // namespace xmesh::ws
