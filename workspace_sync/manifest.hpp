// The manifest of a workspace tree: one entry per file, directory and symlink, with the content
// hash of every file (XXH3-128). The controller scans its local tree into one; each host agent
// keeps the manifest of what it holds. Comparing them says what must travel.
#pragma once
#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace xmesh::ws {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const Hash128& o) const { return !(*this == o); }
  bool operator<(const Hash128& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
  std::string hex() const;
  static bool from_hex(const std::string& s, Hash128& out);
};
struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ULL)); }
};

// The racy-file rule (git's): a file's recorded hash is trusted only while its stat matches AND
// its mtime is more than this much older than the look that recorded it (scan.hpp, receiver.hpp).
constexpr int64_t kRacyWindowNs = 1000000000;
inline int64_t timespec_ns(const timespec& t) { return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec; }

enum class EntryType : char { File = 'f', Dir = 'd', Symlink = 'l' };

struct Entry {
  std::string path;  // relative to the root, '/'-separated, no leading or trailing '/'
  EntryType type = EntryType::File;
  uint32_t mode = 0;   // permission bits (st_mode & 07777)
  uint64_t size = 0;   // files: bytes; symlinks: length of the target
  Hash128 hash;        // files: the content; otherwise zero
  std::string target;  // symlinks: what the link says
  // Local change detection only (never sent): the stat values the hash was taken with.
  int64_t mtime_ns = 0, ctime_ns = 0;
  uint64_t ino = 0;

  // Same content and metadata as far as a host cares (type, mode, hash, target).
  bool same_as(const Entry& o) const {
    return type == o.type && mode == o.mode && size == o.size && hash == o.hash && target == o.target;
  }
};

struct Manifest {
  std::vector<Entry> entries;  // sorted by path (byte order)
  int64_t scan_ns = 0;         // wall-clock start of the scan that produced it

  void sort();
  const Entry* find(const std::string& path) const;  // binary search
  uint64_t file_bytes() const;
  // XXH3-128 over what a host reproduces (paths, types, modes, sizes, hashes, targets): two
  // trees with equal digests need nothing moved.
  Hash128 digest() const;

  // The wire form (what a host receives): no stat values. decode_wire validates the framing,
  // not the paths (see path_safety.hpp); it throws std::runtime_error naming the problem.
  std::string encode_wire() const;
  static Manifest decode_wire(std::string_view bytes, uint64_t max_entries = 10000000);
  // The local cache form, with stat values and the scan time ("XMC2": the entry count a fixed
  // 8 bytes, so a form written entry by entry can set it at the end; "XMC1" files still read),
  // is written by CacheWriter (fs_ops.hpp) and read by MappedManifest (manifest_file.hpp).
};

// A manifest's digest built entry by entry, in path order (Manifest::digest() is this over its
// entries): no wire form of the whole tree in memory, and the count need not be known first.
class DigestBuilder {
 public:
  DigestBuilder();
  ~DigestBuilder();
  DigestBuilder(const DigestBuilder&) = delete;
  DigestBuilder& operator=(const DigestBuilder&) = delete;
  void add(const Entry& e);
  Hash128 finish();  // once

 private:
  void* state_;  // XXH3_state_t
  uint64_t count_ = 0;
  std::string buf_;
};

// The cache form written piece by piece: its header (the count set at the end where not known
// first: it is the last 8 bytes of the header) and each entry's bytes.
std::string cache_header(int64_t scan_ns, uint64_t entries);
constexpr size_t kCacheCountOffset = 12;  // where cache_header puts the count
void encode_cache_entry(std::string& out, const Entry& e);

// The cache form's pieces, for readers of a mapped file (manifest_file.hpp): the header (false
// when it does not read; pos is then where the entries start) and one entry at pos
// (std::runtime_error when it does not read).
bool parse_cache_header(std::string_view bytes, size_t& pos, int64_t& scan_ns, uint64_t& count);
Entry parse_cache_entry(std::string_view bytes, size_t& pos);

// Reads a cache-form manifest file entry by entry (mapped, pages dropped behind the cursor):
// fn gets each entry in order, after scan_ns(...) got the header's scan time. False when the file
// is missing or does not read as a manifest (what fn saw until then is to be thrown away).
bool for_each_cached_entry(const std::string& path, const std::function<void(int64_t)>& scan_ns,
                           const std::function<void(Entry&&)>& fn);

Hash128 hash_bytes(const void* data, size_t n);
// Hashes a file's content; also returns the fstat values of the opened file (so the recorded
// stat is that of what was read). Throws std::system_error naming the path.
Hash128 hash_file(int dirfd, const std::string& name, const std::string& display_path, uint64_t* size,
                  int64_t* mtime_ns, int64_t* ctime_ns, uint64_t* ino);

}  // namespace xmesh::ws
