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

struct Scanner {
  const ScanOptions& opts;
  std::unordered_map<std::string, const Entry*> previous;
  int64_t previous_scan_ns = 0;
  IgnoreStack ignore;
  ScanResult result;

  bool read_small_file(int dirfd, const char* name, std::string& out) {
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return false;
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0 && out.size() < (1 << 20)) out.append(buf, static_cast<size_t>(n));
    close(fd);
    return true;
  }

  static int64_t ns(const timespec& t) { return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec; }

  void add_file(int dirfd, const char* name, const std::string& rel, const struct stat& st) {
    if (opts.max_file_size && uint64_t(st.st_size) > opts.max_file_size) {
      result.too_large.emplace_back(rel, uint64_t(st.st_size));
      return;
    }
    Entry e;
    e.path = rel;
    e.type = EntryType::File;
    e.mode = st.st_mode & 07777;
    auto it = previous.find(rel);
    const Entry* old = it == previous.end() ? nullptr : it->second;
    int64_t mtime = ns(st.st_mtim), ctime = ns(st.st_ctim);
    if (old && old->type == EntryType::File && old->size == uint64_t(st.st_size) && old->mtime_ns == mtime &&
        old->ctime_ns == ctime && old->ino == st.st_ino && mtime < previous_scan_ns - kRacyWindowNs) {
      e.size = old->size;
      e.hash = old->hash;
      e.mtime_ns = mtime;
      e.ctime_ns = ctime;
      e.ino = st.st_ino;
      ++result.reused;
    } else {
      e.hash = hash_file(dirfd, name, rel, &e.size, &e.mtime_ns, &e.ctime_ns, &e.ino);
      ++result.hashed_files;
      result.hashed_bytes += e.size;
    }
    result.manifest.entries.push_back(std::move(e));
  }

  void add_symlink(int dirfd, const char* name, const std::string& rel, const struct stat& st) {
    std::string target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    ssize_t n = readlinkat(dirfd, name, target.data(), target.size());
    if (n < 0) {
      result.skipped.emplace_back(rel, std::string("cannot read the link: ") + std::strerror(errno));
      return;
    }
    target.resize(static_cast<size_t>(n));
    std::string why;
    if (!symlink_stays_inside(rel, target, &why)) {
      result.skipped.emplace_back(rel, "symlink to " + target + " " + why);
      return;
    }
    Entry e;
    e.path = rel;
    e.type = EntryType::Symlink;
    e.mode = 0777;
    e.size = target.size();
    e.target = target;
    result.manifest.entries.push_back(std::move(e));
  }

  void walk(int dirfd, const std::string& prefix) {
    size_t rules_before = ignore.files.size();
    if (opts.use_ignore_files) {
      for (const char* f : {".gitignore", ".xmeshignore"}) {
        std::string text;
        if (read_small_file(dirfd, f, text)) ignore.files.add_text(prefix, text);
      }
    }
    int fd2 = dup(dirfd);
    DIR* d = fd2 >= 0 ? fdopendir(fd2) : nullptr;
    if (!d) {
      if (fd2 >= 0) close(fd2);
      result.skipped.emplace_back(prefix.empty() ? "." : prefix, std::string("cannot list: ") + std::strerror(errno));
      return;
    }
    std::vector<std::string> subdirs;
    while (dirent* de = readdir(d)) {
      const char* name = de->d_name;
      if (!std::strcmp(name, ".") || !std::strcmp(name, "..")) continue;
      std::string rel = prefix.empty() ? std::string(name) : prefix + "/" + name;
      if (prefix.empty() && !std::strcmp(name, kStateDirName)) continue;  // a host copy's own state
      struct stat st;
      if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // vanished meanwhile
      bool is_dir = S_ISDIR(st.st_mode);
      if (ignore.ignored(rel, is_dir)) continue;
      if (is_dir) {
        Entry e;
        e.path = rel;
        e.type = EntryType::Dir;
        e.mode = st.st_mode & 07777;
        result.manifest.entries.push_back(std::move(e));
        subdirs.push_back(name);
      } else if (S_ISREG(st.st_mode)) {
        try {
          add_file(dirfd, name, rel, st);
        } catch (const std::system_error& ex) {
          if (ex.code().value() != ENOENT) throw;  // deleted while we looked: not part of this state
        }
      } else if (S_ISLNK(st.st_mode)) {
        add_symlink(dirfd, name, rel, st);
      } else {
        const char* kind = S_ISFIFO(st.st_mode) ? "a named pipe" : S_ISSOCK(st.st_mode) ? "a socket" : "a device file";
        result.skipped.emplace_back(rel, std::string("is ") + kind);
      }
    }
    closedir(d);
    for (auto& name : subdirs) {
      int sub = openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      std::string rel = prefix.empty() ? name : prefix + "/" + name;
      if (sub < 0) {
        result.skipped.emplace_back(rel, std::string("cannot open: ") + std::strerror(errno));
        continue;
      }
      walk(sub, rel);
      close(sub);
    }
    ignore.files.truncate(rules_before);
  }
};

}  // namespace

ScanResult scan_tree(const std::string& root, const ScanOptions& opts, const Manifest* previous) {
  Scanner s{opts, {}, 0, {}, {}};
  if (previous) {
    s.previous.reserve(previous->entries.size());
    for (auto& e : previous->entries) s.previous.emplace(e.path, &e);
    s.previous_scan_ns = previous->scan_ns;
  }
  for (auto& p : opts.excludes) s.ignore.user.add_line("", p);
  if (opts.default_excludes) {
    s.ignore.defaults.add_line("", "__pycache__/");
    s.ignore.defaults.add_line("", "*.py[co]");
  }
  s.result.manifest.scan_ns = wall_ns();
  int fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open workspace " + root + ": " + std::strerror(errno));
  try {
    s.walk(fd, "");
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  s.result.manifest.sort();
  return std::move(s.result);
}

}  // namespace xmesh::ws
