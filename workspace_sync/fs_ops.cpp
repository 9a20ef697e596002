#include "fs_ops.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>
#include <system_error>
#include <vector>

#include <xxhash.h>

namespace xmesh::ws {

namespace {
std::string err(const std::string& what) { return what + ": " + std::strerror(errno); }
}  // namespace

int open_regular_at(int dirfd, const std::string& name, const std::string& display_path) {
  // O_NONBLOCK: a FIFO put where a file was must not hold the reader until someone writes.
  unique_fd fd(openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) throw std::system_error(errno, std::generic_category(), "cannot read " + display_path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) throw std::system_error(errno, std::generic_category(), "cannot stat " + display_path);
  if (!S_ISREG(st.st_mode)) throw std::runtime_error("cannot read " + display_path + ": it is not a regular file");
  return fd.release();
}

int open_dir_nofollow(int dirfd, const std::string& rel, bool create) {
  unique_fd cur(dup(dirfd));
  if (!cur) throw std::runtime_error(err("dup"));
  size_t pos = 0;
  while (pos < rel.size()) {
    size_t slash = rel.find('/', pos);
    std::string part = rel.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    pos = slash == std::string::npos ? rel.size() : slash + 1;
    int next = openat(cur.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT && create) {
      if (mkdirat(cur.get(), part.c_str(), 0755) != 0 && errno != EEXIST)
        throw std::runtime_error(err("cannot create directory " + rel.substr(0, pos)));
      next = openat(cur.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (next < 0) {
      if (errno == ELOOP || errno == ENOTDIR)
        throw std::runtime_error("refused: " + rel.substr(0, pos) + " on the host is a symlink or a file, not a directory");
      throw std::runtime_error(err("cannot open directory " + rel.substr(0, pos)));
    }
    cur.reset(next);
  }
  return cur.release();
}

Hash128 copy_file_at(int srcdir, const std::string& src, int dstdir, const std::string& dst) {
  unique_fd in(open_regular_at(srcdir, src, src));
  unique_fd out(openat(dstdir, dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (out.get() < 0) throw std::runtime_error(err("cannot create " + dst));
  XXH3_state_t* state = XXH3_createState();
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> owned(state, XXH3_freeState);
  XXH3_128bits_reset(state);
  std::vector<char> buf(1 << 20);
  while (true) {
    ssize_t n = read(in.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(err("cannot read " + src));
    if (n == 0) break;
    XXH3_128bits_update(state, buf.data(), static_cast<size_t>(n));
    if (!write_all(out.get(), buf.data(), static_cast<size_t>(n))) throw std::runtime_error(err("cannot write " + dst));
  }
  XXH128_hash_t h = XXH3_128bits_digest(state);
  return Hash128{h.low64, h.high64};
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool pwrite_all(int fd, const void* data, size_t n, uint64_t at) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    at += static_cast<uint64_t>(w);
  }
  return true;
}

bool pread_all(int fd, void* data, size_t n, uint64_t at) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
    at += static_cast<uint64_t>(r);
  }
  return true;
}

void remove_tree(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (!d) {
    unlink(path.c_str());
    return;
  }
  std::vector<std::string> names;
  while (dirent* de = readdir(d))
    if (std::strcmp(de->d_name, ".") && std::strcmp(de->d_name, "..")) names.push_back(de->d_name);
  closedir(d);
  for (auto& n : names) {
    std::string p = path + "/" + n;
    struct stat st;
    if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      remove_tree(p);
    else
      unlink(p.c_str());
  }
  rmdir(path.c_str());
}

void make_dirs_path(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') {
      std::string part = path.substr(0, pos);
      if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) throw std::runtime_error(err("cannot create " + part));
    }
  }
}

bool read_whole_file(const std::string& path, std::string& out) {
  unique_fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;
  out.clear();
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(fd.get(), buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return n == 0;
}

ReplacingFile::ReplacingFile(std::string path) : path_(std::move(path)) {
  // A name of its own: two processes (or threads) replacing one file never write into each other's.
  static std::atomic<uint64_t> serial{0};
  tmp_ = path_ + ".tmp." + std::to_string(getpid()) + "." + std::to_string(serial++);
  fd_ = open(tmp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0) throw std::runtime_error(err("cannot write " + tmp_));
}

ReplacingFile::~ReplacingFile() {
  if (fd_ < 0) return;
  close(fd_);
  unlink(tmp_.c_str());
}

void ReplacingFile::write(std::string_view data) {
  if (!write_all(fd_, data.data(), data.size())) throw std::runtime_error(err("cannot write " + tmp_));
}

void ReplacingFile::write_at(uint64_t offset, std::string_view data) {
  if (!pwrite_all(fd_, data.data(), data.size(), offset)) throw std::runtime_error(err("cannot write " + tmp_));
}

void ReplacingFile::commit() {
  const int fd = std::exchange(fd_, -1);
  if (close(fd) != 0) {
    const std::string why = err("cannot write " + tmp_);
    unlink(tmp_.c_str());
    throw std::runtime_error(why);
  }
  if (rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = err("cannot replace " + path_);
    unlink(tmp_.c_str());
    throw std::runtime_error(why);
  }
}

void write_file_replacing(const std::string& path, std::string_view data) {
  ReplacingFile f(path);
  f.write(data);
  f.commit();
}

CacheWriter::CacheWriter(const std::string& path, int64_t scan_ns)
    : file_(path), piece_(cache_header(scan_ns, 0)) {}  // the count is set by commit()

void CacheWriter::add(const Entry& e) {
  encode_cache_entry(piece_, e);
  ++count_;
  if (piece_.size() < (1u << 20)) return;
  file_.write(piece_);
  piece_.clear();
}

void CacheWriter::finish_writing() {
  file_.write(piece_);
  piece_.clear();
  file_.write_at(kCacheCountOffset, std::string_view(reinterpret_cast<const char*>(&count_), sizeof(count_)));
}

void CacheWriter::commit() {
  finish_writing();
  file_.commit();
}

std::shared_ptr<const MappedManifest> CacheWriter::commit_mapped() {
  finish_writing();
  auto mapped = MappedManifest::open_fd(file_.fd());
  if (!mapped) throw std::runtime_error("cannot map the manifest just written");
  file_.commit();
  return mapped;
}

void save_manifest_cache(const std::string& path, const Manifest& m) {
  CacheWriter w(path, m.scan_ns);
  for (auto& e : m.entries) w.add(e);
  w.commit();
}

std::string make_scratch_file(const std::string& stem) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/" + stem + "-XXXXXX";
  unique_fd fd(mkstemp(path.data()));
  if (!fd) throw std::runtime_error(err("cannot create a scratch file " + path));
  return path;
}

std::shared_ptr<const MappedManifest> mapped_copy(const Manifest& m) {
  const std::string path = make_scratch_file("xmesh-manifest");
  try {
    CacheWriter w(path, m.scan_ns);
    for (auto& e : m.entries) w.add(e);
    auto mapped = w.commit_mapped();
    unlink(path.c_str());
    return mapped;
  } catch (...) {
    unlink(path.c_str());
    throw;
  }
}

}  // namespace xmesh::ws
