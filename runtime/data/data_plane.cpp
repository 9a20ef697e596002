#include "data_plane.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "bodies.hpp"
#include "data_bodies.hpp"
#include "buffer_stream.hpp"
#include "data_node.hpp"
#include "node.hpp"
#include "process_memory.hpp"
#include "unique_fd.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
using Clock = std::chrono::steady_clock;

// A copy moves this much between looks at its deadline (and at the queue's): a timeout is
// answered within one step, whatever the transfer's size.
constexpr size_t kCopyStep = size_t(64) << 20;

std::string describe_owner(const DataOp& op) { return "the buffer's owner at " + op.owner; }
}  // namespace

// One submission: its ops, the Call it answers, and how many of its ops are still being worked.
struct DataPlane::Batch {
  std::vector<DataOp> ops;
  std::shared_ptr<Call> call;
  Clock::time_point deadline = Clock::time_point::max();
  std::function<void()> on_finished;
  std::atomic<size_t> unfinished{0};
  std::atomic<bool> answered{false};

  bool expired() const { return Clock::now() >= deadline; }
  int ms_left() const {
    if (deadline == Clock::time_point::max()) return -1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return static_cast<int>(std::max<int64_t>(0, left));
  }
  // The first answer wins: a failure of one op fails the batch, the others stop at their next step.
  void answer(bool ok, json body) {
    if (answered.exchange(true)) return;
    CallResult r;
    r.index = 0;
    r.ok = ok;
    r.body = std::move(body);
    call->deliver(std::move(r));
  }
  void fail(ErrorKind kind, const std::string& text) { answer(false, error_body(kind, text)); }
  void time_out() {
    fail(ErrorKind::Timeout, "the transfer did not finish within its timeout (" + std::to_string(ops.size()) +
                                 " operation" + (ops.size() == 1 ? "" : "s") + ")");
  }
  // An op is over (done, failed or skipped): the last one lets the memory go, then answers ok
  // if nothing failed (in that order: whoever the answer wakes finds the memory let go).
  void op_over() {
    if (unfinished.fetch_sub(1) != 1) return;
    if (on_finished) on_finished();
    answer(true, json());
  }
};

DataPlane::DataPlane(Node& node, size_t threads)
    : node_(node),
      data_(DataNode::of(node)),
      step_pause_ms_(static_cast<int>(env_int("XMESH_DATA_STEP_PAUSE_MS", 0))),
      force_stream_(env_str("XMESH_DATA_TRANSPORT") == "stream"),
      force_remote_(env_str("XMESH_DATA_TRANSPORT") == "remote"),
      max_streams_(static_cast<uint64_t>(std::max<int64_t>(1, env_int("XMESH_DATA_STREAMS", 4)))) {
  if (threads == 0) threads = static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_DATA_THREADS", 2)));
  for (size_t i = 0; i < threads; ++i)
    threads_.push_back(runtime_thread([this] {
      pthread_setname_np(pthread_self(), "xmesh-data");
      run();
    }));
}

DataPlane::~DataPlane() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  for (auto& job : queue_) {
    job.batch->fail(ErrorKind::Cancelled, "the data plane stopped (the process is shutting down)");
    job.batch->op_over();
  }
}

std::shared_ptr<Call> DataPlane::submit(std::vector<DataOp> ops, int timeout_ms, std::function<void()> on_finished) {
  if (ops.empty()) throw std::invalid_argument("a transfer needs at least one operation");
  for (auto& op : ops)
    if (op.size == 0 || !op.local || op.owner.empty())
      throw std::invalid_argument("a transfer operation needs an owner, a size > 0 and local memory");
  auto b = std::make_shared<Batch>();
  b->call = node_.local_call({ops.front().owner});
  if (timeout_ms >= 0) b->deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  b->on_finished = std::move(on_finished);
  b->ops = std::move(ops);
  b->unfinished = b->ops.size();
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_) throw std::runtime_error("the data plane is stopped (the process is shutting down)");
    for (size_t i = 0; i < b->ops.size(); ++i) queue_.push_back({b, i});
  }
  cv_.notify_all();
  return b->call;
}

DataPlane::Stats DataPlane::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

void DataPlane::run() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait_for(g, std::chrono::seconds(1), [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      if (queue_.empty()) {
        g.unlock();
        release_late_leases();
        continue;
      }
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Batch& b = *job.batch;
    if (b.answered) {
      // Failed or timed out already: the rest of it is not started.
    } else if (b.expired()) {
      b.time_out();
    } else {
      run_op(b, b.ops[job.index]);
    }
    b.op_over();
    release_late_leases();
  }
}

namespace {
// The lease's answer (and its frames: the bytes of a small read from another host), or why
// there is none (*kind, *why).
bool take_lease(Call& c, BufferLeaseReply* out, std::vector<zmq::message_t>* frames, ErrorKind* kind,
                std::string* why) {
  auto got = c.take();
  if (got.empty()) {
    *why = "the owner gave no answer to the lease";
    return false;
  }
  auto& r = got.front();
  if (r.ok) {
    std::string bad;
    auto reply = read_as<BufferLeaseReply>(r.body, &bad);
    if (reply) {
      *out = *reply;
      if (frames) *frames = std::move(r.frames);
      return true;
    }
    *kind = ErrorKind::Buffer;
    *why = "the owner's answer to a lease is malformed: " + bad;
    return false;
  }
  *kind = error_kind_of(r.body).value_or(ErrorKind::Buffer);
  *why = r.body.value("text", std::string("the owner refused the lease"));
  return false;
}
}  // namespace

void DataPlane::run_op(Batch& b, const DataOp& op) { run_op(b, op, force_stream_ || force_remote_); }

DataPlane::Copy DataPlane::through_host(Batch& b, const DataOp& op, const std::function<Copy(const DataOp&)>& copy) {
  if (!op.device) return copy(op);
  std::string why;
  auto staging = op.device->host_staging(op.size, &why);
  if (staging && op.write) why = op.device->to_host(staging.get(), op.local, op.size);
  if (!staging || !why.empty()) {
    b.fail(ErrorKind::Buffer, "this process's device memory could not be staged for the transfer: " + why);
    return Copy::failed;
  }
  DataOp host = op;
  host.local = staging.get();
  host.device = nullptr;
  const Copy how = copy(host);  // returns once nothing touches the staging
  if (op.write || !moved(how)) return how;
  if (why = op.device->to_device(op.local, staging.get(), op.size); !why.empty()) {
    b.fail(ErrorKind::Buffer, "the bytes read could not be copied to this process's device memory: " + why);
    return Copy::failed;
  }
  return how;
}

bool DataPlane::await_owner(Batch& b, Call& c) {
  while (!c.wait_done(b.ms_left() < 0 ? 100 : std::min(100, b.ms_left())))
    if (batch_ended(b)) return false;
  return true;
}

bool DataPlane::batch_ended(Batch& b) {
  if (b.answered) return true;  // another op of the batch failed, or it timed out
  if (b.expired()) {
    b.time_out();
    return true;
  }
  if (stopping()) {
    b.fail(ErrorKind::Cancelled, "the data plane stopped (the process is shutting down)");
    return true;
  }
  return false;
}

bool DataPlane::land_device_write(Batch& b, const DataOp& op, uint64_t lease) {
  Header h;
  h.kind = Kind::BufferRelease;
  h.body = BufferReleaseBody{op.buffer, lease, true};
  std::shared_ptr<Call> c;
  try {
    c = node_.call({Target{op.owner, ""}}, h, {}, true);
  } catch (const std::exception& e) {
    b.fail(ErrorKind::Send, "could not tell " + describe_owner(op) + " that the write is complete: " + e.what());
    return false;
  }
  if (!await_owner(b, *c)) return false;  // the owner ends the lease when the release arrives
  auto got = c->take();
  if (!got.empty() && got.front().ok) return true;
  const json body = got.empty() ? json() : got.front().body;
  const ErrorKind kind = error_kind_of(body).value_or(ErrorKind::Buffer);
  b.fail(kind, (kind == ErrorKind::Supervision ? describe_owner(op) + " is gone: " : std::string()) +
                   body.value("text", std::string("the owner gave no answer to the write's end")));
  return false;
}

std::shared_ptr<Call> DataPlane::ask_lease(Batch& b, const DataOp& op, bool stream,
                                           std::shared_ptr<RdmaNic::Link>* link) {
  // Small and (as far as this process has seen) on another host: the bytes go in the messages.
  const bool in_messages = op.size <= kInlineBytes && (stream || owner_elsewhere(op.owner));
  Header h;
  h.kind = Kind::BufferLease;
  BufferLeaseBody body{op.buffer, op.offset, op.size, op.write, host_key(), stream, false, ""};
  body.inline_ = in_messages;
  // An owner not known to be on this host is offered this process's RDMA address: it answers
  // with its own where it has a NIC too (and the reader is elsewhere).
  if (!in_messages && !force_stream_ && (force_remote_ || !owner_here(op.owner)) && (*link = link_to(op.owner)))
    body.rdma = (*link)->address().to_string();
  h.body = body;
  std::vector<zmq::message_t> frames;
  if (in_messages && op.write) {
    frames.emplace_back(op.size);
    if (!op.device) {
      std::memcpy(frames.back().data(), op.local, op.size);
    } else if (std::string bad = op.device->to_host(static_cast<char*>(frames.back().data()), op.local, op.size);
               !bad.empty()) {
      b.fail(ErrorKind::Buffer, "this process's device memory could not be read for the transfer: " + bad);
      return nullptr;
    }
  }
  std::shared_ptr<Call> ask;
  try {
    ask = node_.call({Target{op.owner, ""}}, h, std::move(frames), true);
  } catch (const std::exception& e) {
    b.fail(ErrorKind::Send, "could not ask " + describe_owner(op) + " for a lease: " + e.what());
    return nullptr;
  }
  if (await_owner(b, *ask)) return ask;
  std::lock_guard<std::mutex> g(mu_);
  late_.push_back({op.owner, op.buffer, ask});  // a lease granted late is ended at once
  return nullptr;
}

void DataPlane::run_op(Batch& b, const DataOp& op, bool stream, int attempt) {
  std::shared_ptr<RdmaNic::Link> link;
  auto ask = ask_lease(b, op, stream, &link);
  if (!ask) return;
  BufferLeaseReply lease;
  std::vector<zmq::message_t> frames;
  ErrorKind kind = ErrorKind::Buffer;
  std::string why;
  if (!take_lease(*ask, &lease, &frames, &kind, &why)) {
    if (kind == ErrorKind::Supervision) {
      why = describe_owner(op) + " is gone: " + why;
      forget_link(op.owner, link);
    }
    b.fail(kind, why);
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.failed;
    return;
  }
  remember_owner(op.owner, lease.host);
  Copy how;
  if (lease.inline_) {
    how = take_inline(b, op, frames);
  } else {
    how = copy_leased(b, op, lease, link);
    if (lease.device && op.write && moved(how)) {
      if (!land_device_write(b, op, lease.lease)) how = Copy::failed;
    } else {
      end_lease(op.owner, op.buffer, lease.lease);
    }
  }
  if (how == Copy::refused_here || how == Copy::again) {  // not this way: the stream path instead
    if (attempt < 2) {
      run_op(b, op, true, attempt + 1);
      return;
    }
    b.fail(ErrorKind::Buffer, describe_owner(op) + " granted three leases in a row that could not be used");
    how = Copy::failed;
  }
  std::lock_guard<std::mutex> g(mu_);
  ++stats_.ops;
  if (how == Copy::failed) {
    ++stats_.failed;
    return;
  }
  ++(how == Copy::same_host     ? stats_.same_host
     : how == Copy::in_messages ? stats_.in_messages
     : how == Copy::rdma        ? stats_.rdma
                                : stats_.streamed);
  stats_.bytes += op.size;
}

DataPlane::Copy DataPlane::take_inline(Batch& b, const DataOp& op, std::vector<zmq::message_t>& frames) {
  if (op.write) return Copy::in_messages;  // the owner wrote them before it answered
  if (frames.size() != 1 || frames[0].size() != op.size) {
    b.fail(ErrorKind::Buffer, describe_owner(op) + " answered a small read without its " + std::to_string(op.size) +
                                  " bytes");
    return Copy::failed;
  }
  const char* bytes = static_cast<const char*>(frames[0].data());
  if (!op.device) {
    std::memcpy(op.local, bytes, op.size);
  } else if (std::string bad = op.device->to_device(op.local, bytes, op.size); !bad.empty()) {
    b.fail(ErrorKind::Buffer, "the bytes read could not be copied to this process's device memory: " + bad);
    return Copy::failed;
  }
  return Copy::in_messages;
}

bool DataPlane::owner_elsewhere(const std::string& owner) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = owner_hosts_.find(owner);
  return it != owner_hosts_.end() && it->second != host_key();
}

void DataPlane::remember_owner(const std::string& owner, const std::string& host) {
  if (host.empty()) return;
  std::lock_guard<std::mutex> g(mu_);
  if (owner_hosts_.size() > 10000) owner_hosts_.clear();  // bounded: a cache, not a record
  owner_hosts_[owner] = host;
}

DataPlane::Copy DataPlane::copy_streamed(Batch& b, const DataOp& op, const BufferLeaseReply& lease) {
  StreamGrant grant;
  grant.address = lease.stream;
  if (!from_hex(lease.token, &grant.token) || grant.token.size() != 16 || !from_hex(lease.key, &grant.key) ||
      grant.key.size() != kRecordKeyBytes || !parse_record_cipher(lease.cipher, &grant.cipher)) {
    b.fail(ErrorKind::Buffer, describe_owner(op) + " answered with a malformed stream grant");
    return Copy::failed;
  }
  // Several streams for a large range (each on its own thread and connection), a part of at
  // least kStreamPart each.
  const int streams = static_cast<int>(std::clamp<uint64_t>(op.size / kStreamPart, 1, max_streams_));
  StreamWays ways;
  ways.gateway = node_.transport().gateway();
  ways.take_back = [this](const std::string& owner) { return node_.transport().take_back_connection(owner, 5000); };
  auto outcome = stream_transfer(grant, op.local, op.size, op.write, streams, [&] {
    return !b.answered && !b.expired() && !stopping();
  }, step_pause_ms_, ways);
  if (outcome) return Copy::streamed;
  if (batch_ended(b)) return Copy::failed;
  // A broken stream: the owner died (its death is known here within moments), or the network.
  // A refusal is the owner's word (its lease ended under the stream): said as it is.
  if (outcome.status == StreamOutcome::Status::broken && owner_died(b, op)) return Copy::failed;
  b.fail(ErrorKind::Buffer, outcome.why);
  return Copy::failed;
}

bool DataPlane::owner_died(Batch& b, const DataOp& op) {
  json dead;
  for (int i = 0; i < 20; ++i) {
    if (node_.supervision().is_dead(op.owner, &dead)) {
      b.fail(ErrorKind::Supervision, describe_owner(op) + " died during the transfer: " + dead.value("text", std::string()));
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

DataPlane::Copy DataPlane::copy_leased(Batch& b, const DataOp& op, const BufferLeaseReply& lease,
                                       std::shared_ptr<RdmaNic::Link>& link) {
  if (lease.direct) {  // device memory its owner's NIC reaches itself: RDMA, or ask again without
    if (link && !lease.rdma.empty()) {
      const Copy how = copy_rdma(b, op, lease, link);
      return how == Copy::rdma_refused ? Copy::again : how;
    }
    give_up_rdma(op.owner, describe_owner(op) + " granted RDMA alone without an RDMA address");
    return Copy::again;
  }
  if (lease.stream.empty()) {  // the owner is on this host: its pid and address
    forget_link(op.owner, link);  // offered before this process knew: not needed
    return through_host(b, op, [&](const DataOp& h) { return copy_same_host(b, h, lease); });
  }
  if (link && !lease.rdma.empty()) {
    const Copy how = copy_rdma(b, op, lease, link);
    if (how != Copy::rdma_refused) return how;
  } else if (link) {
    give_up_rdma(op.owner, lease.rdma_why.empty() ? describe_owner(op) + " answered without an RDMA address"
                                                  : lease.rdma_why);
  }
  return through_host(b, op, [&](const DataOp& h) { return copy_streamed(b, h, lease); });
}

DataPlane::Copy DataPlane::copy_rdma(Batch& b, const DataOp& op, const BufferLeaseReply& lease,
                                     const std::shared_ptr<RdmaNic::Link>& link) {
  RdmaAddress peer;
  std::string why;
  if (!RdmaAddress::parse(lease.rdma, &peer, &why) || lease.rkey > 0xffffffffULL) {
    give_up_rdma(op.owner, describe_owner(op) + " answered with a malformed RDMA grant: " +
                               (why.empty() ? "an rkey past 32 bits" : why));
    return Copy::rdma_refused;
  }
  {
    std::lock_guard<std::mutex> g(links_mu_);
    if (!link->connected()) {
      why = link->connect(peer);
    } else if (link->peer_qpn() != peer.qpn) {
      // The owner answers from a link other than the one this is connected to (it was
      // restarted at its address): this op streams, the next gets a new link.
      if (auto it = links_.find(op.owner); it != links_.end() && it->second == link) links_.erase(it);
      return Copy::rdma_refused;
    }
  }
  if (!why.empty()) {
    give_up_rdma(op.owner, "connecting to " + describe_owner(op) + ": " + why);
    return Copy::rdma_refused;
  }
  RdmaNic::RegionPtr region;
  if (op.device) {  // this process's device memory: registered through a dma-buf, else staged
    region = register_device(op, &why);
    if (!region) return through_host(b, op, [&](const DataOp& h) { return copy_rdma(b, h, lease, link); });
  } else if (!(region = nic_->register_memory(op.local, op.size, false, false, &why))) {
    give_up_rdma(op.owner, "this process's memory could not be registered: " + why);
    return Copy::rdma_refused;
  }
  return in_steps(b, op, Copy::rdma, [&](uint64_t at, size_t n) {
    auto r = link->transfer(op.write, op.local + at, *region, lease.addr + at, static_cast<uint32_t>(lease.rkey), n,
                            [&] { return !b.answered && !b.expired() && !stopping() && !node_.supervision().is_dead(op.owner); });
    return r ? Copy::rdma : rdma_stopped(b, op, r, link);
  });
}

DataPlane::Copy DataPlane::rdma_stopped(Batch& b, const DataOp& op, const RdmaResult& r,
                                        const std::shared_ptr<RdmaNic::Link>& link) {
  forget_link(op.owner, link);  // it is broken: the next transfer to this owner opens another
  if (batch_ended(b)) return Copy::failed;
  if (owner_died(b, op)) return Copy::failed;
  // The NIC failed while the owner lives (unreachable over the fabric, a remote access error):
  // this pair streams from now on.
  give_up_rdma(op.owner, "RDMA with " + describe_owner(op) + " failed: " + r.why);
  return Copy::rdma_refused;
}

RdmaNic::RegionPtr DataPlane::register_device(const DataOp& op, std::string* why) {
  uint64_t offset = 0;
  unique_fd fd(op.device->dmabuf(op.local, op.size, &offset, why));
  if (!fd) return nullptr;
  return nic_->register_dmabuf(fd.get(), offset, op.size, reinterpret_cast<uint64_t>(op.local), false, false, why);
}

std::shared_ptr<RdmaNic::Link> DataPlane::link_to(const std::string& owner) {
  std::lock_guard<std::mutex> g(links_mu_);
  if (!nic_asked_) {
    nic_asked_ = true;
    nic_ = data_.rdma_nic();
  }
  if (!nic_ || no_rdma_.count(owner)) return nullptr;
  auto& link = links_[owner];
  if (link) return link;
  std::string why;
  if (std::shared_ptr<RdmaNic::Link> fresh = nic_->open_link(&why)) return link = fresh;
  links_.erase(owner);
  if (no_rdma_.size() > 10000) no_rdma_.clear();  // bounded: a cache, not a record
  no_rdma_[owner] = why;
  note_rdma_refused("this process could not open an RDMA link: " + why);
  return nullptr;
}

void DataPlane::forget_link(const std::string& owner, const std::shared_ptr<RdmaNic::Link>& link) {
  if (!link) return;
  std::lock_guard<std::mutex> g(links_mu_);
  auto it = links_.find(owner);
  if (it != links_.end() && it->second == link) links_.erase(it);
}

void DataPlane::give_up_rdma(const std::string& owner, const std::string& why) {
  {
    std::lock_guard<std::mutex> g(links_mu_);
    links_.erase(owner);
    if (no_rdma_.size() > 10000) no_rdma_.clear();
    no_rdma_[owner] = why;
  }
  note_rdma_refused(why);
}

void DataPlane::note_rdma_refused(const std::string& why) {
  // Said once a process (one owner's reason stands for the rest): its transfers still move.
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "[xmesh] RDMA buffers: %s; transfers between these processes go through streams instead\n",
                 why.c_str());
  });
}

bool DataPlane::owner_here(const std::string& owner) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = owner_hosts_.find(owner);
  return it != owner_hosts_.end() && it->second == host_key();
}

bool DataPlane::stopping() const {
  std::lock_guard<std::mutex> g(mu_);
  return stopping_;
}

DataPlane::Copy DataPlane::copy_same_host(Batch& b, const DataOp& op, const BufferLeaseReply& lease) {
  const pid_t pid = static_cast<pid_t>(lease.pid);
  char* remote = reinterpret_cast<char*>(lease.addr);
  return in_steps(b, op, Copy::same_host, [&](uint64_t at, size_t n) {
    ProcessCopy r;
    if (pid == getpid()) {
      if (op.write)
        std::memmove(remote + at, op.local + at, n);
      else
        std::memmove(op.local + at, remote + at, n);
    } else {
      r = op.write ? write_process_memory(pid, remote + at, op.local + at, n)
                   : read_process_memory(pid, remote + at, op.local + at, n);
    }
    if (r) return Copy::same_host;
    if (r.status == ProcessCopy::Status::not_permitted && at == 0) {
      note_refused_attach(r.why);
      return Copy::refused_here;
    }
    if (r.status == ProcessCopy::Status::gone)
      b.fail(ErrorKind::Supervision, describe_owner(op) + " (pid " + std::to_string(pid) + ") died during the transfer");
    else
      b.fail(ErrorKind::Buffer, "copying " + std::string(op.write ? "into" : "from") + " " + describe_owner(op) + ": " + r.why);
    return Copy::failed;
  });
}

DataPlane::Copy DataPlane::in_steps(Batch& b, const DataOp& op, Copy done,
                                    const std::function<Copy(uint64_t at, size_t n)>& step) {
  for (uint64_t at = 0; at < op.size; at += kCopyStep) {
    if (batch_ended(b)) return Copy::failed;
    fail_expired_batches();
    if (step_pause_ms_ > 0 && at > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_pause_ms_));
    const Copy how = step(at, static_cast<size_t>(std::min<uint64_t>(kCopyStep, op.size - at)));
    if (how != done) return how;
  }
  return done;
}

void DataPlane::note_refused_attach(const std::string& why) {
  // Said once a process: every later transfer of this host goes the stream way without a word.
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "[xmesh] RDMA buffers: %s; transfers on this host go through streams instead\n", why.c_str());
  });
}

void DataPlane::fail_expired_batches() {
  std::vector<std::shared_ptr<Batch>> expired;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& job : queue_)
      if (!job.batch->answered && job.batch->expired()) expired.push_back(job.batch);
  }
  for (auto& b : expired) b->time_out();
}

void DataPlane::release_late_leases() {
  std::vector<LateLease> answered;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto keep = std::partition(late_.begin(), late_.end(), [](auto& l) { return !l.ask->done() && !l.ask->fatal(); });
    answered.assign(std::make_move_iterator(keep), std::make_move_iterator(late_.end()));
    late_.erase(keep, late_.end());
  }
  for (auto& late : answered) {
    BufferLeaseReply lease;
    ErrorKind kind;
    std::string why;
    if (!take_lease(*late.ask, &lease, nullptr, &kind, &why) || lease.inline_) continue;  // nothing to end  // refused: nothing to end
    end_lease(late.owner, late.buffer, lease.lease);
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.late_leases;
  }
}

void DataPlane::end_lease(const std::string& owner, uint64_t buffer, uint64_t lease) {
  Header release;
  release.kind = Kind::BufferRelease;
  release.body = BufferReleaseBody{buffer, lease};
  try {
    node_.call({Target{owner, ""}}, release, {}, false);
  } catch (const std::exception&) {
    // The owner is gone: its leases went with it.
  }
}

}  // namespace xmesh
