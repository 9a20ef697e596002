#include "output_marker.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace xmesh {

namespace {

constexpr char kPrefix[] = "\x1b]xm;";
constexpr size_t kPrefixLen = sizeof(kPrefix) - 1;
constexpr char kEnd = '\x07';
constexpr size_t kFieldMax = 120;

void append_field(std::string& out, const std::string& field) {
  size_t n = std::min(field.size(), kFieldMax);
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(field[i]);
    out.push_back(c < 0x20 || c == ';' || c == 0x7f ? '_' : static_cast<char>(c));
  }
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

std::atomic<uint64_t> g_marker_seq{0};

}  // namespace

std::string encode_marker(uint64_t seq, const OutputContext& ctx) {
  std::string m(kPrefix, kPrefixLen);
  m += std::to_string(seq);
  m.push_back(';');
  append_field(m, ctx.cell);
  m.push_back(';');
  append_field(m, ctx.actor);
  m.push_back(kEnd);
  return m;
}

uint64_t write_output_marker(const OutputContext& ctx) {
  fflush(nullptr);
  uint64_t seq = ++g_marker_seq;
  std::string m = encode_marker(seq, ctx);
  write_all(1, m.data(), m.size());
  write_all(2, m.data(), m.size());
  return seq;
}

bool output_pending() {
  for (int fd : {1, 2}) {
    int n = 0;
    if (ioctl(fd, FIONREAD, &n) == 0 && n > 0) return true;
  }
  return false;
}

uint64_t written_bytes() {
  static int fd = open("/proc/self/io", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[512];
  ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* w = strstr(buf, "wchar:");
  return w ? strtoull(w + 6, nullptr, 10) : 0;
}

OutputTracker& output_tracker() {
  static OutputTracker t;
  return t;
}

uint64_t OutputTracker::mark_locked() {
  written_ = effective();
  return write_output_marker(written_);
}

uint64_t OutputTracker::begin(const OutputContext& ctx) {
  if (!enabled_) return 0;
  std::lock_guard<std::mutex> g(mu_);
  uint64_t token = ++next_token_;
  active_.push_back({token, ctx, written_seen_});
  if (effective() != written_) {
    mark_locked();
    active_.back().written_at_begin = written_seen_ = written_bytes();  // after its own marker
  }
  return token;
}

uint64_t OutputTracker::end(uint64_t token, bool python_wrote) {
  if (!token) return 0;
  std::lock_guard<std::mutex> g(mu_);
  uint64_t at_begin = UINT64_MAX;
  for (auto it = active_.begin(); it != active_.end(); ++it)
    if (it->token == token) {
      at_begin = it->written_at_begin;
      active_.erase(it);
      break;
    }
  const uint64_t now = written_bytes();
  written_seen_ = now;
  if (python_wrote || effective() != written_ || now != at_begin || output_pending()) {
    uint64_t seq = mark_locked();
    written_seen_ = written_bytes();  // its own marker is no output of the next call
    return seq;
  }
  return 0;
}

uint64_t OutputTracker::mark_now() {
  if (!enabled_) return 0;
  std::lock_guard<std::mutex> g(mu_);
  return mark_locked();
}

void MarkerScanner::emit_text(const char* p, size_t n, std::vector<Piece>& out) {
  if (n == 0) return;
  if (!out.empty() && !out.back().is_marker) {
    out.back().text.append(p, n);
    return;
  }
  Piece piece;
  piece.text.assign(p, n);
  out.push_back(std::move(piece));
}

// Parses "<seq>;<cell>;<actor>" (the bytes between the prefix and BEL).
static bool parse_fields(const char* p, size_t n, MarkerScanner::Piece& piece) {
  const char* end = p + n;
  const char* semi = static_cast<const char*>(memchr(p, ';', n));
  if (!semi || semi == p) return false;
  uint64_t seq = 0;
  for (const char* q = p; q < semi; ++q) {
    if (*q < '0' || *q > '9') return false;
    seq = seq * 10 + static_cast<uint64_t>(*q - '0');
  }
  const char* semi2 = static_cast<const char*>(memchr(semi + 1, ';', static_cast<size_t>(end - semi - 1)));
  if (!semi2) return false;
  piece.is_marker = true;
  piece.seq = seq;
  piece.ctx.cell.assign(semi + 1, semi2);
  piece.ctx.actor.assign(semi2 + 1, end);
  return true;
}

void MarkerScanner::feed(const char* data, size_t n, std::vector<Piece>& out) {
  std::string joined;
  if (!held_.empty()) {
    joined.swap(held_);
    joined.append(data, n);
    data = joined.data();
    n = joined.size();
  }
  size_t pos = 0, text_start = 0;
  while (pos < n) {
    const char* esc = static_cast<const char*>(memchr(data + pos, '\x1b', n - pos));
    if (!esc) break;
    size_t at = static_cast<size_t>(esc - data);
    size_t avail = n - at;
    size_t cmp = std::min(avail, kPrefixLen);
    if (memcmp(esc, kPrefix, cmp) != 0) {  // an ordinary escape sequence (colours...)
      pos = at + 1;
      continue;
    }
    if (avail < kPrefixLen) {  // cut by the read boundary: decide with the next read
      emit_text(data + text_start, at - text_start, out);
      held_.assign(esc, avail);
      return;
    }
    size_t limit = std::min(avail, kMaxMarkerBytes);
    const char* bel = static_cast<const char*>(memchr(esc + kPrefixLen, kEnd, limit - kPrefixLen));
    if (!bel) {
      if (avail < kMaxMarkerBytes) {  // may still complete
        emit_text(data + text_start, at - text_start, out);
        held_.assign(esc, avail);
        return;
      }
      pos = at + 1;  // too long to be ours: text
      continue;
    }
    Piece piece;
    if (!parse_fields(esc + kPrefixLen, static_cast<size_t>(bel - esc) - kPrefixLen, piece)) {
      pos = at + 1;
      continue;
    }
    emit_text(data + text_start, at - text_start, out);
    out.push_back(std::move(piece));
    pos = text_start = static_cast<size_t>(bel - data) + 1;
  }
  emit_text(data + text_start, n - text_start, out);
}

void MarkerScanner::finish(std::vector<Piece>& out) {
  std::string rest;
  rest.swap(held_);
  emit_text(rest.data(), rest.size(), out);
}

}  // namespace xmesh
