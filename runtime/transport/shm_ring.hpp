// ShmRing: a single-producer single-consumer ring of messages in shared memory (issue 23's
// same-host call path; its design in docs/architecture/03-transport-and-links.md, "Links: rings on one host").
//
// One ring carries one direction between two processes (a caller and a proc): it lives in a
// memfd, made by one side and handed to the other once (SCM_RIGHTS), so a message costs two
// copies (into the ring, out of it) and no system call while the reader is awake. A reader that
// finds the ring empty spins a little, then sleeps on a futex in the ring; the writer wakes it
// only when it said it sleeps. A writer that finds it full waits the same way for space: a slow
// reader holds its writer back (bounded memory) and never loses or reorders a message.
//
// Records are a 4-byte length and the bytes, 8-byte aligned, written across the end of the
// buffer where they must be (two copies), so every size up to `max_message()` fits whatever the
// positions. Either side can close it (a peer known dead is closed from outside, by whoever
// learned it): the other side's waits end at once, reading what was written before first.
//
// The peer is not trusted with this process's memory: its native code may scribble on the
// mapping. Each side keeps its own position and the ring's capacity in its own memory (never
// re-read from the shared header); the peer's position is read from shared memory and checked
// against them, and positions that do not add up answer `corrupt` (the ring is closed), never
// a copy outside the mapping.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "unique_fd.hpp"

namespace xmesh {

// SharedMemory: one sealed memfd mapped shared (a ring, a doorbell): owns the fd and the
// mapping, moves, and unmaps and closes once. Sealed at its size, so a peer cannot shrink it
// under the other (which would fault on access).
class SharedMemory {
 public:
  // A new memfd of `size` bytes, zeroed. Throws naming what failed.
  static SharedMemory create(const std::string& name, size_t size);
  // The other side's, its size between min and max bytes (fd is duplicated: the caller keeps
  // its own). Throws naming `what` it is not.
  static SharedMemory attach(int fd, size_t min, size_t max, const char* what);
  SharedMemory() = default;
  SharedMemory(SharedMemory&& other) noexcept { *this = std::move(other); }
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  int fd() const { return fd_.get(); }
  // Closes the fd, keeping the mapping (once the other side has its own: no fd per link).
  void drop_fd();
  void* addr() const { return addr_; }
  size_t size() const { return size_; }

 private:
  unique_fd fd_;
  void* addr_ = nullptr;
  size_t size_ = 0;
};

class ShmRing {
 public:
  // corrupt: the shared positions do not add up (the peer, or something in its process, wrote
  // over them): the ring is closed, nothing more is read or written.
  enum class Result { ok, full, empty, closed, timed_out, too_large, corrupt };

  // A new ring with `capacity` bytes of buffer (a power of two, at least 4 KiB); its memfd is
  // fd(), for the other side's attach(). Throws naming the reason.
  static ShmRing create(size_t capacity, const std::string& name = "xmesh-ring");
  // The ring in a memfd made by create() (the fd is duplicated: the caller keeps its own).
  // Throws when the fd is not such a ring.
  static ShmRing attach(int fd);

  ShmRing() = default;  // no ring yet (assigned one later)

  int fd() const { return mem_.fd(); }
  void drop_fd() { mem_.drop_fd(); }  // see SharedMemory
  // Random per ring, in its header: an offer names it, so the side that attaches knows it
  // mapped the ring it was offered (not another file at the same /proc path).
  uint64_t token() const { return token_; }
  size_t capacity() const { return capacity_; }
  size_t max_message() const { return capacity() / 2; }  // larger messages take another path

  // Writer side. try_write never waits; write waits up to timeout_ms (-1: forever) for space.
  Result try_write(std::string_view message);
  Result write(std::string_view message, int timeout_ms);
  // One message made of `count` parts, copied in one after the other (no joined copy first).
  Result try_write_parts(const std::string_view* parts, size_t count);
  Result write_parts(const std::string_view* parts, size_t count, int timeout_ms);
  // Reader side. try_read never waits; read waits up to timeout_ms (-1: forever) for a message.
  // A closed ring is read to its end before `closed` is answered.
  Result try_read(std::string& out);
  Result read(std::string& out, int timeout_ms);

  // No more messages: the peer's waits end. Either side, or whoever learned the peer died.
  void close();
  bool closed() const;
  // Bytes written and not read yet (records included), from the shared positions: at most the
  // capacity (a figure, for stats and a writer's look at its room; never a bound for memory).
  size_t used() const;
  // Writer side: bytes this side wrote (its own position) and, of the last `capacity` of them,
  // how many the reader has not taken yet by the shared tail (a figure a scribbled tail can
  // only make wrong within 0..capacity).
  uint64_t written() const { return head_; }
  size_t unread_by_reader() const;

 private:
  struct Header;
  ShmRing(SharedMemory mem, size_t capacity, uint64_t token, uint64_t head, uint64_t tail)
      : mem_(std::move(mem)), capacity_(capacity), token_(token), head_(head), tail_(tail) {}
  Header* h() const { return static_cast<Header*>(mem_.addr()); }
  char* data() const;
  Result wait_for(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleeping, uint32_t seen, int64_t deadline_ms);
  template <class Attempt>
  Result keep_trying(Attempt attempt, Result not_ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleeping,
                     int timeout_ms);
  void copy_in(uint64_t pos, const void* data, size_t n);
  void copy_out(uint64_t pos, void* data, size_t n) const;
  Result corrupted();  // closes the ring and answers corrupt

  SharedMemory mem_;
  // This side's own copies: what bounds every copy (capacity_) and this side's position (head_
  // for the writer, tail_ for the reader; a ring used from one object in tests keeps both).
  size_t capacity_ = 0;
  uint64_t token_ = 0;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
};

// Doorbell: one node's wake-up word in shared memory, rung by every writer of the rings the node
// reads. Its sleepers wait with a bit each: the node's reading thread (kReaderBit) and idle
// threads that read the rings themselves when woken (an actor thread waiting on its inbox, any
// other bit). Ringing wakes one idle sleeper if there is one, else the reading thread: an
// atomic increment, and a futex wake only while someone sleeps. A writer that knows which kind
// of thread its message is for names their bits (`prefer`): a reply wakes a waiting caller
// rather than an idle actor thread of the same process, which would only read it and wake the
// caller in turn (two wake-ups instead of one).
class Doorbell {
 public:
  static constexpr uint32_t kReaderBit = 1;
  static constexpr uint32_t kAnyIdle = ~kReaderBit;
  static Doorbell create(const std::string& name = "xmesh-bell");
  static Doorbell attach(int fd);  // duplicates fd; throws when it is not a doorbell
  Doorbell() = default;

  int fd() const { return mem_.fd(); }
  void drop_fd() { mem_.drop_fd(); }  // see SharedMemory
  uint64_t token() const;
  explicit operator bool() const { return mem_.addr() != nullptr; }
  // Writer: after a message is in the ring. prefer: the bits of the sleepers to wake first.
  // Nobody is woken while the reading thread or a thread reading for itself is awake.
  void ring(uint32_t prefer = kAnyIdle);
  // A thread that reads the rings for itself (a caller waiting on its call) is awake and will
  // look again before it sleeps or leaves (on: counted; off: no longer). A thread that says off
  // must then read once more if seq() changed since its last read: a writer that found it
  // awake woke nobody.
  void awake(bool on);
  // Wakes the sleepers of `bit` (something came for that one thread), whatever else sleeps.
  void wake(uint32_t bit);
  // Sleeper: seq() before looking at what it waits for; sleep(bit, seen, ...) when nothing was
  // there: returns when rung or woken since `seen`, after timeout_ms, or at once when
  // still_idle() (asked again once the sleeper is counted) answers false.
  uint32_t seq() const;
  void sleep(uint32_t bit, uint32_t seen, int timeout_ms, const std::function<bool()>& still_idle);

 private:
  struct Shared;
  explicit Doorbell(SharedMemory mem) : mem_(std::move(mem)) {}
  Shared* s() const { return static_cast<Shared*>(mem_.addr()); }
  SharedMemory mem_;
};

}  // namespace xmesh
