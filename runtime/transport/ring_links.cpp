#include "ring_links.hpp"

#include "message_layout.hpp"
#include "unique_fd.hpp"
#include "link_bodies.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

namespace xmesh {

namespace {
constexpr int kBatch = 32;            // messages read from one ring before the next is looked at

size_t record_space(size_t length) { return (4 + length + 7) & ~size_t(7); }

}  // namespace

int open_peer_fd(int64_t pid, int64_t fd) {
  if (pid <= 0 || fd < 0) {
    errno = EINVAL;
    return -1;
  }
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  return ::open(path.c_str(), O_RDWR | O_CLOEXEC);
}

// ---- the writer ------------------------------------------------------------------------------
RingWriter::RingWriter(size_t capacity) : ring_(ShmRing::create(capacity, "xmesh-link")) {}

RingOfferBody RingWriter::offer() const { return RingOfferBody{getpid(), ring_.fd(), ring_.token()}; }

void RingWriter::answered(const RingAcceptBody& answer, std::string* why) {
  if (state_ != State::offered || answer.token != ring_.token()) return;  // not this ring's answer
  state_ = State::declined;
  if (!answer.ok) {
    *why = "declined: " + answer.reason;
    return;
  }
  unique_fd fd(open_peer_fd(answer.pid, answer.bell_fd));
  if (!fd) {
    *why = "its doorbell (/proc/" + std::to_string(answer.pid) + "/fd/" + std::to_string(answer.bell_fd) +
           ") cannot be opened: " + std::strerror(errno);
    return;
  }
  try {
    Doorbell bell = Doorbell::attach(fd.get());
    fd.reset();
    if (bell.token() != answer.bell_token) {
      *why = "the doorbell opened is not the one it named";
      return;
    }
    bell.drop_fd();
    bell_ = std::move(bell);
  } catch (const std::exception& e) {
    *why = e.what();
    return;
  }
  ring_.drop_fd();  // the reader has its own mapping now: no fd per link stays open
  state_ = State::switch_due;
}

void RingWriter::switched() {
  if (state_ == State::switch_due) state_ = State::active;
}

ShmRing::Result RingWriter::write(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames,
                                  bool blocking, int timeout_ms, uint32_t wake) {
  LaidOut e(header, frames);
  const size_t max = ring_.max_message();
  ShmRing::Result r;
  if (e.total <= max) {
    r = blocking ? ring_.write_parts(e.parts.data(), e.parts.size(), timeout_ms)
                 : ring_.try_write_parts(e.parts.data(), e.parts.size());
    if (r == ShmRing::Result::ok) ring_bell(wake);
    return r;
  }
  size_t records = (e.total + max - 1) / max;
  if (!blocking && ring_.capacity() - ring_.used() < records * record_space(max)) return ShmRing::Result::full;
  std::vector<std::string_view> piece;
  for (size_t offset = 0, n = 0; offset < e.total; offset += max, ++n) {
    slice_parts(e.parts, offset, std::min(max, e.total - offset), piece);
    // The first record may time out (nothing written yet); a later one waits while the reader
    // reads: a message is never left half-written (a closed ring ends the wait).
    r = ring_.write_parts(piece.data(), piece.size(), n == 0 ? (blocking ? timeout_ms : 0) : -1);
    if (r != ShmRing::Result::ok) return r;
    ring_bell(wake);
  }
  return ShmRing::Result::ok;
}

void RingWriter::close() {
  ring_.close();
  ring_bell();
}

void RingWriter::ring_bell(uint32_t wake) {
  if (bell_) bell_.ring(wake);  // none before the reader answered (nothing is written then but in tests)
}

// ---- the readers -----------------------------------------------------------------------------
struct RingReaders::In {
  std::string addr;
  ShmRing ring;
  bool reading = false;   // under mu_: its switch came (it is in reading_)
  std::string record;     // the reading thread's: the last record read
  std::string partial;    // a message of several records, as far as it came
  uint64_t expected = 0;  // its total
  std::optional<Message> held;  // read, declined by deliver for now: offered again first
  std::atomic<bool> holding{false};  // held is set (read by unread() on other threads)
  uint64_t skipping = 0;        // bytes still to skip of a message over the limit
  uint64_t sender_limit = 0;    // the writer's XMESH_MAX_MESSAGE_BYTES, from its offer
};

RingReaders::RingReaders(size_t max_message_bytes) : max_message_bytes_(max_message_bytes) {}

RingReaders::~RingReaders() { close_all(); }

void RingReaders::enable() {
  std::lock_guard<std::mutex> g(mu_);
  if (enabled_) return;
  bell_ = Doorbell::create("xmesh-bell");
  enabled_ = true;
}

RingAcceptBody RingReaders::take_offer(const std::string& addr, const RingOfferBody& offer) {
  RingAcceptBody answer;
  answer.token = offer.token;
  if (!enabled_) {
    answer.reason = "this node takes no rings";
    return answer;
  }
  unique_fd fd(open_peer_fd(offer.pid, offer.fd));
  if (!fd) {
    answer.reason = "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd) +
                    " cannot be opened: " + std::strerror(errno);
    return answer;
  }
  std::shared_ptr<In> in;
  try {
    ShmRing ring = ShmRing::attach(fd.get());
    fd.reset();
    if (ring.token() != offer.token) {
      answer.reason = "the ring at /proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd) +
                      " is not the one offered";
      return answer;
    }
    ring.drop_fd();
    in = std::make_shared<In>();
    in->addr = addr;
    in->ring = std::move(ring);
    in->sender_limit = offer.max_message_bytes;
  } catch (const std::exception& e) {
    answer.reason = e.what();
    return answer;
  }
  std::lock_guard<std::mutex> g(mu_);
  auto& slot = rings_[addr];
  if (slot) slot->ring.close();  // an earlier link from addr: read to its end, then forgotten
  slot = in;
  answer.ok = true;
  answer.pid = getpid();
  answer.bell_fd = bell_.fd();
  answer.bell_token = bell_.token();
  return answer;
}

void RingReaders::start_reading(const std::string& addr) {
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = rings_.find(addr);
    if (it == rings_.end() || it->second->reading) return;
    it->second->reading = true;
    reading_.push_back(it->second);
    ++version_;
  }
  bell_.ring();  // the reading thread takes the new set
}

void RingReaders::drop(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = rings_.find(addr);
  if (it == rings_.end()) return;
  it->second->ring.close();  // one being read is read to its end, then leaves reading_
  rings_.erase(it);
}

bool RingReaders::forget_broken(const std::string& addr, uint64_t token) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto e = ended_.begin(); e != ended_.end(); ++e)
    if (e->first == addr && e->second == token) {
      ended_.erase(e);
      return true;
    }
  auto it = rings_.find(addr);
  if (it == rings_.end() || it->second->ring.token() != token) return false;
  std::shared_ptr<In> in = it->second;
  in->ring.close();
  rings_.erase(it);
  reading_.erase(std::remove(reading_.begin(), reading_.end(), in), reading_.end());
  ++version_;
  return true;
}

void RingReaders::close_all() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& kv : rings_) kv.second->ring.close();
  rings_.clear();
  reading_.clear();
  ++version_;
}

std::vector<std::shared_ptr<RingReaders::In>>& RingReaders::reading_snapshot() {
  uint64_t v = version_.load();
  if (v != snapshot_version_) {
    std::lock_guard<std::mutex> g(mu_);
    snapshot_ = reading_;
    snapshot_version_ = version_.load();
  }
  return snapshot_;
}

void RingReaders::forget(const std::shared_ptr<In>& in, bool closed_by_writer) {
  std::lock_guard<std::mutex> g(mu_);
  if (closed_by_writer) {  // its writer's RingBroken, if it broke, may come after this
    ended_.emplace_back(in->addr, in->ring.token());
    if (ended_.size() > kEndedKept) ended_.pop_front();
  }
  reading_.erase(std::remove(reading_.begin(), reading_.end(), in), reading_.end());
  auto it = rings_.find(in->addr);
  if (it != rings_.end() && it->second == in) rings_.erase(it);
  ++version_;
}

// One record of `in`: a whole message in *out (message), the start or middle of one (more), the
// start of one over this node's limit (too_large: its header in *out, *payload its size; the
// rest is skipped), or records that do not read (garbage, *error says how).
RingReaders::Got RingReaders::take_record(In& in, Message* out, std::string* error, uint64_t* payload) {
  // The writer cuts a message into records of the ring's largest size, the last one shorter.
  const uint64_t largest = in.ring.max_message();
  if (in.skipping) {
    if (in.record.size() != std::min(in.skipping, largest)) return *error = "a record of the wrong size", Got::garbage;
    in.skipping -= in.record.size();
    return Got::more;
  }
  std::string* whole = &in.record;
  if (in.expected == 0) {
    LayoutPrefix prefix;
    if (!read_layout_prefix(in.record.data(), in.record.size(), &prefix) ||
        in.record.size() != std::min<uint64_t>(prefix.total, largest))
      return *error = "a record that does not start a message", Got::garbage;
    // What it claims besides its frames is bounded: the reserve below is not the peer's to size.
    if (prefix.overhead() > kMaxLayoutOverhead)
      return *error = "a message whose header and frame list take " + std::to_string(prefix.overhead()) +
                      " bytes (at most " + std::to_string(kMaxLayoutOverhead) + ")",
             Got::garbage;
    const uint64_t total = prefix.total;
    if (prefix.payload() > max_message_bytes_) {
      *payload = prefix.payload();
      in.skipping = total - in.record.size();
      if (!decode_laid_out_header(in.record, out)) out->header = Header{};
      return Got::too_large;
    }
    if (total > in.record.size()) {
      in.expected = total;
      in.partial = std::move(in.record);
      in.partial.reserve(total);
      return Got::more;
    }
  } else {
    if (in.record.size() != std::min<uint64_t>(in.expected - in.partial.size(), largest))
      return *error = "a record of the wrong size", Got::garbage;
    in.partial.append(in.record);
    if (in.partial.size() < in.expected) return Got::more;
    whole = &in.partial;
    in.expected = 0;
  }
  bool ok = decode_laid_out(*whole, out, error);
  in.partial.clear();
  in.partial.shrink_to_fit();
  return ok ? Got::message : Got::garbage;
}

size_t RingReaders::poll(const Deliver& deliver, Report& report) {
  // Waiting for the lock (not skipping the read): a thread woken for a message must read it,
  // even when another thread is reading now and may have passed that ring already.
  std::lock_guard<std::mutex> reading(poll_mu_);
  size_t delivered = 0;
  report.held = false;
  auto snapshot = reading_snapshot();  // a copy: forget() may change the set while this reads
  for (auto& in : snapshot) {
    if (in->held) {
      if (!deliver(*in->held)) {
        report.held = true;
        continue;
      }
      in->held.reset();
      in->holding = false;
      ++delivered;
    }
    bool draining = in->ring.closed();  // read a closed ring to its end now: nothing comes after
    for (int n = 0; draining || n < kBatch; ++n) {
      auto r = in->ring.try_read(in->record);
      if (r == ShmRing::Result::empty) break;
      if (r == ShmRing::Result::corrupt) {
        forget(in);
        report.broken.push_back({in->addr, in->ring.token(), "its positions in shared memory do not add up"});
        break;
      }
      if (r != ShmRing::Result::ok) {  // closed by its writer (or for it), read to its end
        forget(in, /*closed_by_writer=*/true);
        break;
      }
      Message m;
      std::string error;
      uint64_t payload = 0;
      Got got = take_record(*in, &m, &error, &payload);
      if (got == Got::more) continue;
      m.sender_addr = in->addr;
      if (got == Got::too_large) {
        report.too_large.push_back({std::move(m), payload, in->sender_limit});
        continue;
      }
      if (got == Got::garbage) {
        in->ring.close();
        forget(in);
        report.broken.push_back({in->addr, in->ring.token(), error});
        break;
      }
      ++received_;
      if (!deliver(m)) {
        in->held = std::move(m);
        in->holding = true;
        report.held = true;
        break;
      }
      ++delivered;
    }
  }
  return delivered;
}

bool RingReaders::unread() const {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& in : reading_)
    if ((in->ring.used() > 0 && !in->holding) || in->ring.closed()) return true;
  return false;
}

size_t RingReaders::reading() const {
  std::lock_guard<std::mutex> g(mu_);
  return reading_.size();
}

void RingReaders::wake() {
  if (bell_) bell_.wake(Doorbell::kReaderBit);
}

void RingReaders::wait(int timeout_ms) {
  if (!bell_) {  // not enabled: nothing will come
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return;
  }
  uint32_t seen = bell_.seq();
  if (unread()) return;
  const auto start = SpinGauge::Clock::now();
  if (!gauge_.spin([&] { return bell_.seq() != seen; }))
    bell_.sleep(Doorbell::kReaderBit, seen, timeout_ms, [this] { return !unread(); });
  gauge_.waited(SpinGauge::Clock::now() - start);
}

void RingReaders::sleep_idle(uint32_t bit, uint32_t seen, int timeout_ms, const std::function<bool()>& still_idle) {
  if (bell_) bell_.sleep(bit, seen, timeout_ms, [&] { return still_idle() && !unread(); });
}

void RingReaders::wake(uint32_t bit) {
  if (bell_) bell_.wake(bit);
}

void RingReaders::awake(bool on) {
  if (bell_) bell_.awake(on);
}

}  // namespace xmesh
