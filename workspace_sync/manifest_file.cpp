#include "manifest_file.hpp"
#include "unique_fd.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>

namespace xmesh::ws {

namespace {
constexpr size_t kDropEvery = 1 << 20;  // a cursor gives back the pages it read, 1 MiB at a time
}

std::shared_ptr<const MappedManifest> MappedManifest::open(const std::string& path) {
  unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return nullptr;
  return open_fd(fd.get());
}

std::shared_ptr<const MappedManifest> MappedManifest::open_fd(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 20) return nullptr;
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) return nullptr;
  madvise(map, size, MADV_SEQUENTIAL);
  std::shared_ptr<MappedManifest> m(new MappedManifest());
  m->base_ = static_cast<const char*>(map);
  m->size_ = size;
  if (!parse_cache_header(std::string_view(m->base_, size), m->first_, m->scan_ns_, m->count_)) return nullptr;
  return m;
}

std::shared_ptr<const MappedManifest> MappedManifest::empty() {
  return std::shared_ptr<MappedManifest>(new MappedManifest());
}

MappedManifest::~MappedManifest() {
  if (base_) munmap(const_cast<char*>(base_), size_);
}

Entry MappedManifest::entry_at(uint64_t offset) const {
  if (offset < first_ || offset >= size_) throw std::runtime_error("no manifest entry at that offset");
  size_t pos = static_cast<size_t>(offset);
  return parse_cache_entry(std::string_view(base_, size_), pos);
}

Manifest MappedManifest::load() const {
  Manifest out;
  out.scan_ns = scan_ns_;
  out.entries.reserve(static_cast<size_t>(count_));
  size_t pos = first_;
  for (uint64_t i = 0; i < count_; ++i) out.entries.push_back(parse_cache_entry(std::string_view(base_, size_), pos));
  if (pos != size_) throw std::runtime_error("manifest file has trailing bytes");
  return out;
}

ManifestCursor::ManifestCursor(std::shared_ptr<const MappedManifest> m) : m_(std::move(m)) {
  pos_ = m_->first_;
  next();
}

ManifestCursor::~ManifestCursor() {
  if (!m_ || !m_->base_ || pos_ <= dropped_) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t from = dropped_ / page * page;
  madvise(const_cast<char*>(m_->base_) + from, pos_ - from, MADV_DONTNEED);
}

void ManifestCursor::next() {
  if (read_ == m_->count_) {
    if (!done_ && pos_ != m_->size_) throw std::runtime_error("manifest file has trailing bytes");
    done_ = true;
    return;
  }
  offset_ = pos_;
  entry_ = parse_cache_entry(std::string_view(m_->base_, m_->size_), pos_);
  ++read_;
  if (pos_ - dropped_ >= 2 * kDropEvery) {  // pages behind the cursor go back to the system
    madvise(const_cast<char*>(m_->base_) + dropped_, kDropEvery, MADV_DONTNEED);
    dropped_ += kDropEvery;
  }
}

ManifestMerge::ManifestMerge(std::shared_ptr<const MappedManifest> new_m, std::shared_ptr<const MappedManifest> old_m)
    : now_(std::move(new_m)), before_(std::move(old_m)) {
  settle();
}

void ManifestMerge::settle() {
  if (now_.at_end() || before_.at_end()) {
    now_here_ = !now_.at_end();
    before_here_ = !before_.at_end();
    return;
  }
  const int c = now_.entry().path.compare(before_.entry().path);
  now_here_ = c <= 0;
  before_here_ = c >= 0;
}

void ManifestMerge::next() {
  if (now_here_) now_.next();
  if (before_here_) before_.next();
  settle();
}

}  // namespace xmesh::ws
