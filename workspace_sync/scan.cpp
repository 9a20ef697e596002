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
#include <string_view>
#include <unordered_map>

#include "path_safety.hpp"

namespace xmesh::ws {

int64_t wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

constexpr int64_t kRacyWindowNs = 1000000000;

int64_t ns(const timespec& t) { return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec; }

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
    if (opts.default_excludes) {
      defaults_.add_line("", "__pycache__/");
      defaults_.add_line("", "*.py[co]");
    }
  }

  ScanResult run(int rootfd) {
    queue_.push_back({rootfd, "", std::make_shared<IgnoreRules>()});
    unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
    std::vector<ScanResult> parts(n);
    std::vector<std::thread> threads;
    for (unsigned i = 1; i < n; ++i) threads.emplace_back([this, &parts, i] { work(parts[i]); });
    work(parts[0]);
    for (auto& t : threads) t.join();
    if (error_) std::rethrow_exception(error_);
    ScanResult out;
    for (auto& p : parts) {
      auto& dst = out.manifest.entries;
      dst.insert(dst.end(), std::make_move_iterator(p.manifest.entries.begin()),
                 std::make_move_iterator(p.manifest.entries.end()));
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
        subdirs.push_back({sub, rel, rules});
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
    int64_t mtime = ns(st.st_mtim), ctime = ns(st.st_ctim);
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

  const ScanOptions& opts_;
  std::unordered_map<std::string_view, const Entry*> previous_;
  int64_t previous_scan_ns_ = 0;
  IgnoreRules user_, defaults_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DirTask> queue_;
  int busy_ = 0;
  std::exception_ptr error_;
};

}  // namespace

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
  return r;
}

}  // namespace xmesh::ws
