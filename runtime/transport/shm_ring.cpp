#include "shm_ring.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

#include "util.hpp"

namespace xmesh {

namespace {
constexpr uint64_t kMagic = 0x31304e49524d5858ull;  // "XXMRIN01"
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kMinCapacity = 4096;
constexpr size_t kMaxCapacity = size_t(1) << 30;
constexpr int kSpins = 64;  // tries before sleeping: a reply often comes within microseconds

size_t record_bytes(size_t length) { return (4 + length + 7) & ~size_t(7); }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The futex is shared between processes (no FUTEX_PRIVATE_FLAG): the word is in a memfd.
void futex_wait(std::atomic<uint32_t>& word, uint32_t seen, int timeout_ms) {
  timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, timeout_ms < 0 ? nullptr : &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// Bitset waits: a waker names which sleepers it wakes (a doorbell's reading thread, or the one
// actor thread an inbox push is for). FUTEX_WAIT_BITSET takes an absolute monotonic deadline.
void futex_wait_bits(std::atomic<uint32_t>& word, uint32_t seen, int timeout_ms, uint32_t bits) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_BITSET, seen, &ts, nullptr, bits);
}

long futex_wake_bits(std::atomic<uint32_t>& word, int count, uint32_t bits) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_BITSET, count, nullptr, nullptr, bits);
}

}  // namespace

SharedMemory SharedMemory::create(const std::string& name, size_t size) {
  SharedMemory m;
  m.fd_.reset(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!m.fd_) throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(m.fd_.get(), static_cast<off_t>(size)) != 0 ||
      fcntl(m.fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw std::runtime_error(std::string("sizing shared memory: ") + std::strerror(errno));
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd_.get(), 0);
  if (p == MAP_FAILED) throw std::runtime_error(std::string("mapping shared memory: ") + std::strerror(errno));
  m.addr_ = p;
  m.size_ = size;
  return m;
}

SharedMemory SharedMemory::attach(int fd, size_t min, size_t max, const char* what) {
  struct stat st;
  if (fstat(fd, &st) != 0) throw std::runtime_error(std::string("an ") + what + "'s fd: " + std::strerror(errno));
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    throw std::runtime_error(std::string("the fd is not a sealed ") + what + " (it could shrink under this process)");
  size_t size = static_cast<size_t>(st.st_size);
  if (size < min || size > max)
    throw std::runtime_error(std::string("the fd is not an ") + what + " (" + std::to_string(size) + " bytes)");
  SharedMemory m;
  m.fd_.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!m.fd_) throw std::runtime_error(std::string("dup: ") + std::strerror(errno));
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd_.get(), 0);
  if (p == MAP_FAILED) throw std::runtime_error(std::string("mapping an ") + what + ": " + std::strerror(errno));
  m.addr_ = p;
  m.size_ = size;
  return m;
}

SharedMemory& SharedMemory::operator=(SharedMemory&& o) noexcept {
  if (this != &o) {
    this->~SharedMemory();
    fd_ = std::move(o.fd_);
    addr_ = std::exchange(o.addr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

SharedMemory::~SharedMemory() {
  if (addr_) munmap(addr_, size_);
  drop_fd();
  addr_ = nullptr;
}

void SharedMemory::drop_fd() { fd_.reset(); }

struct ShmRing::Header {
  uint64_t magic;
  uint64_t capacity;
  uint64_t token;  // random per ring: whoever attaches checks it against what the offer said
  alignas(64) std::atomic<uint64_t> head;       // bytes ever written (the writer's)
  alignas(64) std::atomic<uint64_t> tail;       // bytes ever read (the reader's)
  alignas(64) std::atomic<uint32_t> data_seq;   // bumped per message written: the reader's futex
  std::atomic<uint32_t> reader_sleeping;
  alignas(64) std::atomic<uint32_t> space_seq;  // bumped per message read: the writer's futex
  std::atomic<uint32_t> writer_sleeping;
  alignas(64) std::atomic<uint32_t> closed;
};


ShmRing ShmRing::create(size_t capacity, const std::string& name) {
  if (capacity < kMinCapacity || capacity > kMaxCapacity || (capacity & (capacity - 1)) != 0)
    throw std::invalid_argument("a ring's capacity is a power of two from 4 KiB to 1 GiB, not " + std::to_string(capacity));
  static_assert(sizeof(Header) <= kHeaderBytes, "the header fits its page");
  const uint64_t token = random_token();
  ShmRing ring(SharedMemory::create(name, kHeaderBytes + capacity), capacity, token, 0, 0);
  auto* h = new (ring.mem_.addr()) Header{};  // the memfd starts zeroed: atomics at 0
  h->capacity = capacity;
  h->token = token;
  h->magic = kMagic;
  return ring;
}

// The header is read once here, into this side's own memory; nothing later re-reads it.
ShmRing ShmRing::attach(int fd) {
  SharedMemory mem = SharedMemory::attach(fd, kHeaderBytes + kMinCapacity, kHeaderBytes + kMaxCapacity, "xmesh ring");
  const Header* h = static_cast<const Header*>(mem.addr());
  const uint64_t capacity = mem.size() - kHeaderBytes, head = h->head.load(), tail = h->tail.load();
  if (h->magic != kMagic || h->capacity != capacity || (capacity & (capacity - 1)) != 0)
    throw std::runtime_error("the fd is not an xmesh ring (its header does not match its size)");
  if (head < tail || head - tail > capacity)
    throw std::runtime_error("the fd is not a usable xmesh ring (its positions do not add up)");
  return ShmRing(std::move(mem), static_cast<size_t>(capacity), h->token, head, tail);
}

char* ShmRing::data() const { return static_cast<char*>(mem_.addr()) + kHeaderBytes; }

bool ShmRing::closed() const { return h()->closed.load() != 0; }
size_t ShmRing::used() const {
  const uint64_t head = h()->head.load(), tail = h()->tail.load();
  return head < tail ? 0 : static_cast<size_t>(std::min<uint64_t>(head - tail, capacity_));
}

size_t ShmRing::unread_by_reader() const {
  const uint64_t tail = h()->tail.load();
  return tail > head_ ? 0 : static_cast<size_t>(std::min<uint64_t>(head_ - tail, capacity_));
}

ShmRing::Result ShmRing::corrupted() {
  close();
  return Result::corrupt;
}

void ShmRing::copy_in(uint64_t pos, const void* data, size_t n) {
  size_t cap = capacity_, off = static_cast<size_t>(pos & (cap - 1)), first = std::min(n, cap - off);
  std::memcpy(this->data() + off, data, first);
  std::memcpy(this->data(), static_cast<const char*>(data) + first, n - first);
}

void ShmRing::copy_out(uint64_t pos, void* data, size_t n) const {
  size_t cap = capacity_, off = static_cast<size_t>(pos & (cap - 1)), first = std::min(n, cap - off);
  std::memcpy(data, this->data() + off, first);
  std::memcpy(static_cast<char*>(data) + first, this->data(), n - first);
}

ShmRing::Result ShmRing::try_write(std::string_view message) { return try_write_parts(&message, 1); }

ShmRing::Result ShmRing::try_write_parts(const std::string_view* parts, size_t count) {
  if (h()->closed.load()) return Result::closed;
  size_t length = 0;
  for (size_t i = 0; i < count; ++i) length += parts[i].size();
  if (length > max_message()) return Result::too_large;
  const uint64_t head = head_, tail = h()->tail.load();  // this side's own position, the peer's read
  if (tail > head || head - tail > capacity_) return corrupted();
  size_t need = record_bytes(length);
  if (capacity_ - static_cast<size_t>(head - tail) < need) return Result::full;
  uint32_t length32 = static_cast<uint32_t>(length);
  copy_in(head, &length32, sizeof length32);
  uint64_t pos = head + sizeof length32;
  for (size_t i = 0; i < count; ++i) {
    copy_in(pos, parts[i].data(), parts[i].size());
    pos += parts[i].size();
  }
  head_ = head + need;
  h()->head.store(head_);  // seq_cst, then the sleeping flag: see wait_for
  h()->data_seq.fetch_add(1);
  if (h()->reader_sleeping.load()) futex_wake_all(h()->data_seq);
  return Result::ok;
}

ShmRing::Result ShmRing::try_read(std::string& out) {
  const uint64_t tail = tail_, head = h()->head.load();  // this side's own position, the peer's read
  if (head == tail) return h()->closed.load() ? Result::closed : Result::empty;
  if (head < tail || head - tail > capacity_) return corrupted();
  uint32_t length = 0;  // read once: the peer may change the shared copy meanwhile
  copy_out(tail, &length, sizeof length);
  size_t need = record_bytes(length);
  if (length > max_message() || need > head - tail) return corrupted();  // garbage: nothing more is read
  out.resize(length);
  copy_out(tail + sizeof length, out.data(), length);
  tail_ = tail + need;
  h()->tail.store(tail_);
  h()->space_seq.fetch_add(1);
  if (h()->writer_sleeping.load()) futex_wake_all(h()->space_seq);
  return Result::ok;
}

// Sleeps on `word` (last seen as `seen`) with `sleeping` raised; the other side bumps the word
// after it changed the ring and wakes only a side that raised its flag. All of these are
// sequentially consistent, so either the other side sees the flag or this side's re-check
// (the caller's next try) sees its change: no wake-up is lost.
ShmRing::Result ShmRing::wait_for(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleeping, uint32_t seen,
                                  int64_t deadline_ms) {
  int left = -1;
  if (deadline_ms >= 0) {
    int64_t now = now_ms();
    if (now >= deadline_ms) return Result::timed_out;
    left = static_cast<int>(std::min<int64_t>(deadline_ms - now, 1000));
  }
  futex_wait(word, seen, left < 0 ? 1000 : left);  // a second at most: closed() is looked at again
  sleeping.store(0);
  return Result::ok;
}

// Tries `attempt` until it answers other than `not_ready`: spins a little, then sleeps on `word`
// with `sleeping` raised (re-trying once raised, so a change made meanwhile is not slept through).
template <class Attempt>
ShmRing::Result ShmRing::keep_trying(Attempt attempt, Result not_ready, std::atomic<uint32_t>& word,
                                     std::atomic<uint32_t>& sleeping, int timeout_ms) {
  int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
  for (int spin = 0;; ++spin) {
    uint32_t seen = word.load();
    Result r = attempt();
    if (r != not_ready) return r;
    if (spin < kSpins) {
      cpu_relax();
      continue;
    }
    sleeping.store(1);
    r = attempt();
    if (r != not_ready || wait_for(word, sleeping, seen, deadline) == Result::timed_out) {
      sleeping.store(0);
      return r != not_ready ? r : Result::timed_out;
    }
  }
}

ShmRing::Result ShmRing::write(std::string_view message, int timeout_ms) { return write_parts(&message, 1, timeout_ms); }

ShmRing::Result ShmRing::write_parts(const std::string_view* parts, size_t count, int timeout_ms) {
  return keep_trying([&] { return try_write_parts(parts, count); }, Result::full, h()->space_seq, h()->writer_sleeping,
                     timeout_ms);
}

ShmRing::Result ShmRing::read(std::string& out, int timeout_ms) {
  return keep_trying([&] { return try_read(out); }, Result::empty, h()->data_seq, h()->reader_sleeping, timeout_ms);
}

void ShmRing::close() {
  h()->closed.store(1);
  h()->data_seq.fetch_add(1);
  h()->space_seq.fetch_add(1);
  futex_wake_all(h()->data_seq);
  futex_wake_all(h()->space_seq);
}

// ---- Doorbell -------------------------------------------------------------------------------
struct Doorbell::Shared {
  uint64_t magic;
  uint64_t token;
  alignas(64) std::atomic<uint32_t> seq;  // bumped per ring: the futex every sleeper waits on
  std::atomic<uint32_t> sleeping;         // the reading thread sleeps (bit 0)
  std::atomic<uint32_t> idle_sleepers;    // idle threads that read when woken (other bits)
  std::atomic<uint32_t> awake;            // threads reading for themselves, awake (Doorbell::awake)
};

namespace {
constexpr uint64_t kBellMagic = 0x31304c4c45424d58ull;  // "XMBELL01"
constexpr size_t kBellBytes = 4096;
}  // namespace

Doorbell Doorbell::create(const std::string& name) {
  Doorbell bell(SharedMemory::create(name, kBellBytes));
  auto* s = new (bell.mem_.addr()) Shared{};
  s->token = random_token();
  s->magic = kBellMagic;
  return bell;
}

Doorbell Doorbell::attach(int fd) {
  Doorbell bell(SharedMemory::attach(fd, kBellBytes, kBellBytes, "xmesh doorbell"));
  if (bell.s()->magic != kBellMagic) throw std::runtime_error("the fd is not an xmesh doorbell (its header does not match)");
  return bell;
}

uint64_t Doorbell::token() const { return s()->token; }
uint32_t Doorbell::seq() const { return s()->seq.load(); }

// A reading thread that is awake (reading, or spinning on seq) takes the message: nobody is
// woken. Else one idle thread is woken rather than the reading thread: it reads the ring itself
// and finds its own call there (one wake-up instead of two). An idle sleeper that is just going
// to sleep when no wake finds it sees seq changed and does not sleep: the reading thread is
// woken only when no idle thread sleeps.
void Doorbell::ring(uint32_t prefer) {
  s()->seq.fetch_add(1);
  if (!s()->sleeping.load() || s()->awake.load() > 0) return;
  if (s()->idle_sleepers.load() > 0) {
    prefer &= kAnyIdle;
    if (prefer != kAnyIdle && prefer != 0 && futex_wake_bits(s()->seq, 1, prefer) > 0) return;
    if (futex_wake_bits(s()->seq, 1, kAnyIdle) > 0) return;
  }
  futex_wake_bits(s()->seq, 1, kReaderBit);
}

void Doorbell::awake(bool on) {
  if (on)
    s()->awake.fetch_add(1);
  else
    s()->awake.fetch_sub(1);
}

void Doorbell::wake(uint32_t bit) {
  s()->seq.fetch_add(1);  // a sleeper about to sleep sees it changed
  futex_wake_bits(s()->seq, INT32_MAX, bit);
}

// The sleeping flag (or count) is raised before `still_idle` looks again: a writer that rang
// after the look sees it and wakes this side; one that rang before changed seq (the futex returns).
void Doorbell::sleep(uint32_t bit, uint32_t seen, int timeout_ms, const std::function<bool()>& still_idle) {
  auto& flag = bit == kReaderBit ? s()->sleeping : s()->idle_sleepers;
  flag.fetch_add(1);
  if (still_idle()) futex_wait_bits(s()->seq, seen, timeout_ms, bit);
  flag.fetch_sub(1);
}

}  // namespace xmesh
