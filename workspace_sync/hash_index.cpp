#include "hash_index.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xmesh::ws {

namespace {
constexpr size_t kBuckets = 65536;
constexpr size_t kRegions = 256;             // buckets >> 8
constexpr size_t kRegionBuffer = 256;        // records buffered per region before a write
constexpr uint64_t kMaxIndexed = 0xffffffffu;  // bucket starts are 32-bit

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw std::runtime_error(what + " " + path + ": " + (errno ? std::strerror(errno) : "it is shorter than expected"));
}
}  // namespace

HashIndex::HashIndex(const std::shared_ptr<const MappedManifest>& m, const std::string& path)
    : path_(path), start_(kBuckets + 1, 0) {
  fd_.reset(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (fd_.get() < 0) fail("cannot create", path);
  std::vector<uint64_t> counts(kBuckets, 0);
  for (ManifestCursor at(m); !at.at_end(); at.next())
    if (at.entry().type == EntryType::File) ++counts[bucket(at.entry().hash)];
  for (size_t b = 0; b < kBuckets; ++b) total_ += counts[b];
  if (total_ > kMaxIndexed) throw std::runtime_error("a host copy of over 4 billion files cannot be indexed");
  for (size_t b = 0; b < kBuckets; ++b) start_[b + 1] = static_cast<uint32_t>(start_[b] + counts[b]);
  scatter(m);
  sort_regions();
}

// Every record into its region (the records of buckets r*256 .. r*256+255), in manifest order.
void HashIndex::scatter(const std::shared_ptr<const MappedManifest>& m) {
  std::vector<std::vector<Record>> pending(kRegions);
  std::vector<uint64_t> at(kRegions);
  for (size_t r = 0; r < kRegions; ++r) at[r] = start_[r * 256];
  auto flush = [&](size_t r) {
    if (!pwrite_all(fd_.get(), pending[r].data(), pending[r].size() * sizeof(Record), at[r] * sizeof(Record)))
      fail("cannot write", path_);
    at[r] += pending[r].size();
    pending[r].clear();
  };
  for (ManifestCursor c(m); !c.at_end(); c.next()) {
    const Entry& e = c.entry();
    if (e.type != EntryType::File) continue;
    size_t r = bucket(e.hash) >> 8;
    pending[r].push_back(Record{e.hash.hi, e.hash.lo, c.offset()});
    if (pending[r].size() == kRegionBuffer) flush(r);
  }
  for (size_t r = 0; r < kRegions; ++r)
    if (!pending[r].empty()) flush(r);
}

void HashIndex::sort_regions() {
  std::vector<Record> region;
  for (size_t r = 0; r < kRegions; ++r) {
    const uint64_t lo = start_[r * 256], hi = start_[(r + 1) * 256];
    if (hi - lo < 2) continue;
    region.resize(static_cast<size_t>(hi - lo));
    if (!pread_all(fd_.get(), region.data(), region.size() * sizeof(Record), lo * sizeof(Record))) fail("cannot read", path_);
    std::sort(region.begin(), region.end(),
              [](const Record& a, const Record& b) { return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo; });
    if (!pwrite_all(fd_.get(), region.data(), region.size() * sizeof(Record), lo * sizeof(Record)))
      fail("cannot write", path_);
  }
  std::vector<Record>().swap(region);
}

std::optional<uint64_t> HashIndex::find(const Hash128& h) const {
  const size_t b = bucket(h);
  const uint64_t lo = start_[b], hi = start_[b + 1];
  if (lo == hi) return std::nullopt;
  std::vector<Record> records(static_cast<size_t>(hi - lo));
  if (!pread_all(fd_.get(), records.data(), records.size() * sizeof(Record), lo * sizeof(Record))) fail("cannot read", path_);
  for (auto& r : records)
    if (r.hi == h.hi && r.lo == h.lo) return r.offset;
  return std::nullopt;
}

}  // namespace xmesh::ws
