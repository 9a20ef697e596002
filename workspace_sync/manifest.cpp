#include "manifest.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <optional>
#include <system_error>

#include "fs_ops.hpp"
#include "manifest_file.hpp"

namespace xmesh::ws {

std::string Hash128::hex() const {
  char buf[33];
  snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(hi), static_cast<unsigned long long>(lo));
  return buf;
}

bool Hash128::from_hex(const std::string& s, Hash128& out) {
  if (s.size() != 32 || s.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  out.hi = std::stoull(s.substr(0, 16), nullptr, 16);
  out.lo = std::stoull(s.substr(16), nullptr, 16);
  return true;
}

Hash128 hash_bytes(const void* data, size_t n) {
  XXH128_hash_t h = XXH3_128bits(data, n);
  return {h.low64, h.high64};
}

Hash128 hash_file(int dirfd, const std::string& name, const std::string& display_path, uint64_t* size,
                  int64_t* mtime_ns, int64_t* ctime_ns, uint64_t* ino) {
  unique_fd fd(open_regular_at(dirfd, name, display_path));
  struct stat st;
  fstat(fd.get(), &st);  // it succeeded in open_regular_at
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  static thread_local std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  while (true) {
    ssize_t n = read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      XXH3_freeState(state);
      throw std::system_error(e, std::generic_category(), "cannot read " + display_path);
    }
    if (n == 0) break;
    XXH3_128bits_update(state, buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  *size = total;
  *mtime_ns = timespec_ns(st.st_mtim);
  *ctime_ns = timespec_ns(st.st_ctim);
  *ino = st.st_ino;
  return {h.low64, h.high64};
}

void Manifest::sort() {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.path < b.path; });
}

const Entry* Manifest::find(const std::string& path) const {
  auto it = std::lower_bound(entries.begin(), entries.end(), path,
                             [](const Entry& e, const std::string& p) { return e.path < p; });
  return it != entries.end() && it->path == path ? &*it : nullptr;
}

uint64_t Manifest::file_bytes() const {
  uint64_t n = 0;
  for (auto& e : entries)
    if (e.type == EntryType::File) n += e.size;
  return n;
}

namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

void put_str(std::string& out, const std::string& s) {
  put_varint(out, s.size());
  out += s;
}

struct Reader {
  std::string_view s;
  size_t pos = 0;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= s.size()) throw std::runtime_error("manifest is truncated");
      uint8_t b = static_cast<uint8_t>(s[pos++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("manifest has a malformed number");
  }
  uint64_t u64() {
    if (pos + 8 > s.size()) throw std::runtime_error("manifest is truncated");
    uint64_t v;
    std::memcpy(&v, s.data() + pos, 8);
    pos += 8;
    return v;
  }
  std::string str(size_t max) {
    uint64_t n = varint();
    if (n > max) throw std::runtime_error("manifest has a string of " + std::to_string(n) + " bytes (at most " +
                                          std::to_string(max) + ")");
    if (pos + n > s.size()) throw std::runtime_error("manifest is truncated");
    std::string out(s.substr(pos, n));
    pos += n;
    return out;
  }
  char byte() {
    if (pos >= s.size()) throw std::runtime_error("manifest is truncated");
    return s[pos++];
  }
};

constexpr char kWireMagic[] = "XMW1";
constexpr char kCacheMagicV1[] = "XMC1";  // count as a varint: read, never written
constexpr char kCacheMagic[] = "XMC2";
constexpr size_t kMaxPath = 4096;
constexpr uint64_t kMaxEntries = 10000000;

void put_wire_entry(std::string& out, const Entry& e) {
  put_str(out, e.path);
  out.push_back(static_cast<char>(e.type));
  put_varint(out, e.mode);
  put_varint(out, e.size);
  put_u64(out, e.hash.lo);
  put_u64(out, e.hash.hi);
  put_str(out, e.target);
}

Entry read_wire_entry(Reader& r) {
  Entry e;
  e.path = r.str(kMaxPath);
  char t = r.byte();
  if (t != 'f' && t != 'd' && t != 'l')
    throw std::runtime_error("manifest entry '" + e.path + "' has unknown type '" + std::string(1, t) + "'");
  e.type = static_cast<EntryType>(t);
  e.mode = static_cast<uint32_t>(r.varint());
  e.size = r.varint();
  e.hash.lo = r.u64();
  e.hash.hi = r.u64();
  e.target = r.str(kMaxPath);
  return e;
}

void put_cache_entry(std::string& out, const Entry& e) {
  put_wire_entry(out, e);
  put_u64(out, static_cast<uint64_t>(e.mtime_ns));
  put_u64(out, static_cast<uint64_t>(e.ctime_ns));
  put_u64(out, e.ino);
}

Entry read_cache_entry(Reader& r) {
  Entry e = read_wire_entry(r);
  e.mtime_ns = static_cast<int64_t>(r.u64());
  e.ctime_ns = static_cast<int64_t>(r.u64());
  e.ino = r.u64();
  return e;
}

// The entry count; throws std::runtime_error when the header does not read.
uint64_t read_cache_header(Reader& r, int64_t& scan_ns) {
  const bool v1 = r.s.compare(0, 4, kCacheMagicV1) == 0;
  if (!v1 && r.s.compare(0, 4, kCacheMagic) != 0) throw std::runtime_error("not a manifest cache");
  r.pos = 4;
  scan_ns = static_cast<int64_t>(r.u64());
  const uint64_t n = v1 ? r.varint() : r.u64();
  if (n > kMaxEntries) throw std::runtime_error("manifest claims too many entries");
  return n;
}

}  // namespace

std::string cache_header(int64_t scan_ns, uint64_t entries) {
  std::string out(kCacheMagic, 4);
  put_u64(out, static_cast<uint64_t>(scan_ns));
  put_u64(out, entries);
  return out;
}

void encode_cache_entry(std::string& out, const Entry& e) { put_cache_entry(out, e); }

bool parse_cache_header(std::string_view bytes, size_t& pos, int64_t& scan_ns, uint64_t& count) {
  Reader r{bytes, 0};
  try {
    count = read_cache_header(r, scan_ns);
  } catch (const std::runtime_error&) {
    return false;
  }
  pos = r.pos;
  return true;
}

Entry parse_cache_entry(std::string_view bytes, size_t& pos) {
  Reader r{bytes, pos};
  Entry e = read_cache_entry(r);
  pos = r.pos;
  return e;
}

std::string Manifest::encode_wire() const {
  std::string out(kWireMagic, 4);
  out.reserve(entries.size() * 64);
  put_varint(out, entries.size());
  for (auto& e : entries) put_wire_entry(out, e);
  return out;
}

DigestBuilder::DigestBuilder() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), kWireMagic, 4);
}

DigestBuilder::~DigestBuilder() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void DigestBuilder::add(const Entry& e) {
  buf_.clear();
  put_wire_entry(buf_, e);
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), buf_.data(), buf_.size());
  ++count_;
}

Hash128 DigestBuilder::finish() {
  auto* st = static_cast<XXH3_state_t*>(state_);
  XXH3_128bits_update(st, &count_, sizeof(count_));  // last: the entries are hashed as they come
  XXH128_hash_t h = XXH3_128bits_digest(st);
  return {h.low64, h.high64};
}

// What a host reproduces (paths, types, modes, sizes, hashes, targets), entry by entry.
Hash128 Manifest::digest() const {
  DigestBuilder d;
  for (auto& e : entries) d.add(e);
  return d.finish();
}

Manifest Manifest::decode_wire(std::string_view bytes, uint64_t max_entries) {
  if (bytes.compare(0, 4, kWireMagic) != 0) throw std::runtime_error("not an xmesh workspace manifest");
  Reader r{bytes, 4};
  uint64_t n = r.varint();
  if (n > std::min(max_entries, kMaxEntries))
    throw std::runtime_error("manifest claims " + std::to_string(n) + " entries (at most " +
                             std::to_string(std::min(max_entries, kMaxEntries)) + ")");
  if (n > bytes.size() / 20)  // an entry is at least 20 bytes: no reservation for what is not there
    throw std::runtime_error("manifest claims " + std::to_string(n) + " entries in " + std::to_string(bytes.size()) +
                             " bytes");
  Manifest m;
  m.entries.reserve(n);
  for (uint64_t i = 0; i < n; ++i) m.entries.push_back(read_wire_entry(r));
  if (r.pos != bytes.size()) throw std::runtime_error("manifest has trailing bytes");
  for (size_t i = 1; i < m.entries.size(); ++i)
    if (!(m.entries[i - 1].path < m.entries[i].path))
      throw std::runtime_error("manifest paths are not sorted and unique (at '" + m.entries[i].path + "')");
  return m;
}

bool for_each_cached_entry(const std::string& path, const std::function<void(int64_t)>& scan_ns,
                           const std::function<void(Entry&&)>& fn) {
  auto m = MappedManifest::open(path);
  if (!m) return false;
  scan_ns(m->scan_ns());
  std::optional<ManifestCursor> at;
  try {
    at.emplace(m);
  } catch (const std::runtime_error&) {  // only the file's own faults mean "does not read"
    return false;
  }
  while (!at->at_end()) {
    Entry e = at->entry();
    fn(std::move(e));  // its exceptions are the caller's
    try {
      at->next();
    } catch (const std::runtime_error&) {
      return false;
    }
  }
  return true;
}

}  // namespace xmesh::ws
