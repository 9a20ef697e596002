// The data plane's moving side (issue 24; docs/architecture/06-data-plane.md): the process
// that reads a peer's RDMA buffer into its own memory, or writes its memory into one, moves the
// bytes itself on its data threads, never on a caller's or an actor's thread. One submission (a
// read_into, a write_from, an RDMAAction) is a batch of operations; each takes a lease from the
// buffer's owner (a BufferLease message), copies, and ends the lease (BufferRelease). The batch
// completes a Call of this process's own, which a Future waits on like any other.
//
// Transports, chosen per operation from the lease's answer: the same host (the owner's host
// key is this process's) copies by cross-memory attach (process_memory.hpp), one copy; another
// host, by RDMA where both processes have a working NIC (rdma_nic.hpp: a link per owner, set up
// through the lease messages), else by the owner's sealed streams (buffer_stream.hpp); small
// transfers between hosts travel in the lease's messages.
#pragma once
#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "call.hpp"
#include "device_memory.hpp"
#include "rdma_nic.hpp"
#include "data_bodies.hpp"

namespace xmesh {

class Node;
class DataNode;
struct BufferLeaseReply;

struct DataOp {
  std::string owner;     // the owner's node address
  uint64_t buffer = 0;   // the buffer's id there
  uint64_t offset = 0;   // where in the buffer
  uint64_t size = 0;     // bytes to move (> 0)
  char* local = nullptr; // this process's memory: the destination of a read, the source of a write
  bool write = false;    // true: local -> the buffer
  // local is device memory of this driver (device_memory.hpp): moved through host staging.
  std::shared_ptr<DeviceMemory> device;
};

class DataPlane {
 public:
  // node: sends the leases (and owns nothing of this); its DataNode (attached: else
  // std::logic_error) gives the RDMA NIC. threads: copies that may run at once
  // (XMESH_DATA_THREADS, default 2).
  explicit DataPlane(Node& node, size_t threads = 0);
  ~DataPlane();  // stops the threads; batches not done fail
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // Runs ops (at least one); the returned Call (one target: the first op's owner) is answered
  // ok once every op is done, or with the first failure: a Buffer error (the owner refused the
  // lease), Supervision (the owner died), Timeout (not done within timeout_ms; -1: no limit).
  // on_finished runs on a data thread once no op touches its memory any more (before a Call
  // that succeeded is answered; after one that failed or timed out was): what kept the memory
  // alive may go.
  std::shared_ptr<Call> submit(std::vector<DataOp> ops, int timeout_ms, std::function<void()> on_finished);

  struct Stats {
    uint64_t ops = 0, bytes = 0, same_host = 0, streamed = 0, in_messages = 0, rdma = 0, failed = 0, late_leases = 0;
  };
  Stats stats() const;

 private:
  struct Batch;
  struct Job {
    std::shared_ptr<Batch> batch;
    size_t index;
  };
  void run();
  void run_op(Batch& b, const DataOp& op);
  // stream: ask as from another host. attempt: how many leases of this op were given up on
  // (cross-memory attach refused, a direct lease whose RDMA failed) before this one.
  void run_op(Batch& b, const DataOp& op, bool stream, int attempt = 0);
  // This process's device memory registered with the NIC through a dma-buf (nullptr, *why).
  RdmaNic::RegionPtr register_device(const DataOp& op, std::string* why);
  // Waits for the owner's answer to c in slices (a stopping data plane must not wait out a long
  // timeout): false when the batch was answered meanwhile (failed, timed out, or stopping,
  // answered so here).
  bool await_owner(Batch& b, Call& c);
  // Whether the batch is over for a reason that is not an op's transport: answered already
  // (another op failed), past its deadline (answered now: timeout), the plane stopping
  // (answered now: cancelled). The one place a stopped copy is classified so.
  bool batch_ended(Batch& b);
  // A write into a device buffer's staged range ends with a release that says it is complete,
  // waited for: the owner copies the bytes to its device first. false: the batch is answered.
  bool land_device_write(Batch& b, const DataOp& op, uint64_t lease);
  // Asks the owner for a lease (offering *link's RDMA address when there is one to offer) and
  // waits for its answer (nullptr: the batch is answered already).
  std::shared_ptr<Call> ask_lease(Batch& b, const DataOp& op, bool stream, std::shared_ptr<RdmaNic::Link>* link);
  // refused_here: cross-memory attach not permitted; again: a direct (RDMA-only) lease whose
  // RDMA failed: both end the lease and ask again for a stream. rdma_refused: see copy_rdma.
  enum class Copy { same_host, streamed, in_messages, rdma, failed, refused_here, again, rdma_refused };
  static bool moved(Copy how) {  // the bytes went, by one transport or another
    return how == Copy::same_host || how == Copy::streamed || how == Copy::in_messages || how == Copy::rdma;
  }
  // step(at, n) over op's range in kCopyStep pieces while it answers `done`, looking at the
  // batch between pieces (another op's failure, its deadline, queued batches past theirs, the
  // tests' pause); the first other answer ends it.
  Copy in_steps(Batch& b, const DataOp& op, Copy done, const std::function<Copy(uint64_t at, size_t n)>& step);
  // copy(op) on host memory: op itself, or (its local memory a device's) host staging of this
  // process's, copied out before a write and in after a read that moved.
  Copy through_host(Batch& b, const DataOp& op, const std::function<Copy(const DataOp&)>& copy);
  // The leased range moved by the transport the answer names (a failed RDMA path streams).
  Copy copy_leased(Batch& b, const DataOp& op, const BufferLeaseReply& lease, std::shared_ptr<RdmaNic::Link>& link);
  // A small transfer done in the lease's messages: a read's bytes from the answer's frame.
  Copy take_inline(Batch& b, const DataOp& op, std::vector<zmq::message_t>& frames);
  // Owners' host keys as their lease answers said (a write sends small bytes with its request
  // only to an owner known to be elsewhere).
  bool owner_elsewhere(const std::string& owner) const;
  void remember_owner(const std::string& owner, const std::string& host);
  // One copy on this host from the leased range (into it: a write), in steps that look at the
  // batch's deadline. failed: the batch is answered so; refused_here: this process may not
  // attach to the owner's memory (take the stream way).
  Copy copy_same_host(Batch& b, const DataOp& op, const BufferLeaseReply& lease);
  // The leased range over the owner's stream listener (buffer_stream.hpp).
  Copy copy_streamed(Batch& b, const DataOp& op, const BufferLeaseReply& lease);
  // The leased range by RDMA over the link to its owner, in steps under the deadline.
  // rdma_refused: this pair cannot (the owner's link changed, memory not registrable, the
  // NIC failed while the owner lives): the caller streams.
  Copy copy_rdma(Batch& b, const DataOp& op, const BufferLeaseReply& lease, const std::shared_ptr<RdmaNic::Link>& link);
  // Why an RDMA step stopped, as the batch's answer (or rdma_refused).
  Copy rdma_stopped(Batch& b, const DataOp& op, const RdmaResult& r, const std::shared_ptr<RdmaNic::Link>& link);
  // The link to `owner` (a new one, unconnected, when there is none): nullptr when RDMA is not
  // for this owner (this process has no NIC, the owner is on this host or said no before).
  std::shared_ptr<RdmaNic::Link> link_to(const std::string& owner);
  // This pair streams from now on (the owner has no NIC, or RDMA failed between them), said once.
  void give_up_rdma(const std::string& owner, const std::string& why);
  void forget_link(const std::string& owner, const std::shared_ptr<RdmaNic::Link>& link);  // if still its
  void note_rdma_refused(const std::string& why);
  // The owner died (its death is known here within moments of a broken transfer): the batch
  // is answered so. Waits up to 1 s for the word.
  bool owner_died(Batch& b, const DataOp& op);
  bool owner_here(const std::string& owner) const;  // known to be on this host
  void note_refused_attach(const std::string& why);
  bool stopping() const;
  // Times out the queued batches whose deadline passed (their Futures must not wait for a
  // data thread to come free).
  void fail_expired_batches();
  void end_lease(const std::string& owner, uint64_t buffer, uint64_t lease);
  // Lease requests that outlived their op's timeout: a lease granted late is ended at once.
  struct LateLease {
    std::string owner;
    uint64_t buffer;
    std::shared_ptr<Call> ask;
  };
  void release_late_leases();
  Node& node_;
  DataNode& data_;
  // XMESH_DATA_STEP_PAUSE_MS: a pause between copy steps, so that tests can act while a
  // transfer is under way (kill its owner); 0 outside tests.
  const int step_pause_ms_;
  // XMESH_DATA_TRANSPORT=stream: streams even on this host (tests, benchmarks); =remote: as if
  // every owner were on another host (RDMA where both have a NIC, else streams); else what the
  // owner's answer says. XMESH_DATA_STREAMS: parallel streams a large transfer may use (4).
  const bool force_stream_, force_remote_;
  const uint64_t max_streams_;
  static constexpr uint64_t kStreamPart = uint64_t(8) << 20;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<LateLease> late_;
  std::unordered_map<std::string, std::string> owner_hosts_;
  std::mutex links_mu_;  // links_, no_rdma_, nic_ (a link's connect runs under it)
  bool nic_asked_ = false;
  std::shared_ptr<RdmaNic> nic_;
  std::unordered_map<std::string, std::shared_ptr<RdmaNic::Link>> links_;  // by owner
  std::unordered_map<std::string, std::string> no_rdma_;  // owner -> why RDMA is not for it
  bool stopping_ = false;
  Stats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace xmesh
