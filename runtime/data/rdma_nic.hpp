// The RDMA seam of the data plane (issue 24; docs/architecture/06-data-plane.md): what the
// data plane needs of an RDMA NIC, as an interface, so that the logic above it (memory
// registered per buffer, one connection per pair of processes set up through the lease
// messages, transfers under deadlines, aborts, fallbacks) runs the same over libibverbs on a
// machine with a device and over a simulated NIC in the tests of a machine without one.
//
// A Link is one reliable-connected queue pair: this process's side of its connection to one
// peer process. Its address (queue pair number, packet sequence number, LID, GID, MTU) travels
// to the peer in a lease request or answer; each side connects its Link to the other's address.
// A transfer is one RDMA read or write between a registered local range and a range of the
// peer's registered memory (its address and rkey, from the lease's answer); it returns only once
// the NIC touches neither range any more: done, failed, or aborted (keep_going said stop: the
// queue pair is moved to its error state and its work flushed before the call returns).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace xmesh {

// One queue pair's address, as its peer needs it to connect (written as one line in messages).
struct RdmaAddress {
  uint32_t qpn = 0, psn = 0;
  uint32_t lid = 0;     // InfiniBand: the port's LID; RoCE: 0 (addressed by gid)
  std::string gid;      // 32 hex digits (RoCE), or "" (InfiniBand)
  uint32_t mtu = 0;     // the ibv_mtu enum value of the port
  std::string to_string() const;  // "qpn:psn:lid:mtu:gid"
  // false (and *why) for anything that is not what to_string() writes.
  static bool parse(const std::string& text, RdmaAddress* out, std::string* why);
};

struct RdmaResult {
  enum class Status { done, failed, aborted } status = Status::done;
  std::string why;  // failed: the completion's status or the step that failed
  explicit operator bool() const { return status == Status::done; }
};

class RdmaNic {
 public:
  // Memory the NIC may reach: lkey for this process's own work requests, rkey for peers'. addr:
  // where it starts as work requests and peers address it (a dma-buf's: the device pointer).
  struct Region {
    char* addr = nullptr;
    size_t size = 0;
    uint32_t lkey = 0, rkey = 0;
  };
  using RegionPtr = std::shared_ptr<const Region>;  // deregistered when the last holder lets go

  class Link {
   public:
    virtual ~Link() = default;
    virtual RdmaAddress address() const = 0;
    // Connects to the peer's Link at `peer` (once): "" or why not.
    virtual std::string connect(const RdmaAddress& peer) = 0;
    virtual bool connected() const = 0;
    virtual uint32_t peer_qpn() const = 0;  // 0 before connect()
    // Moves n bytes between local (inside `local_region`) and the peer's [remote, remote + n)
    // (rkey): write true is local -> peer. keep_going is asked every few milliseconds; false
    // aborts. Transfers on one Link run one at a time. A Link whose transfer failed or was
    // aborted is broken: every later transfer fails (open a new one).
    virtual RdmaResult transfer(bool write, char* local, const Region& local_region, uint64_t remote, uint32_t rkey,
                                size_t n, const std::function<bool()>& keep_going) = 0;
  };

  virtual ~RdmaNic() = default;
  virtual std::string device() const = 0;
  // [addr, addr + size) registered (remote_access: peers may read it, and write it when
  // writable); nullptr and *why when the NIC refuses.
  virtual RegionPtr register_memory(char* addr, size_t size, bool remote_access, bool writable, std::string* why) = 0;
  // Device memory exported as a dma-buf (device_memory.hpp): size bytes at `offset` in it,
  // addressed as [iova, iova + size) by work requests and peers (the device pointer). The fd is
  // the caller's still. nullptr and *why when the NIC (or its driver) cannot.
  virtual RegionPtr register_dmabuf(int fd, uint64_t offset, size_t size, uint64_t iova, bool remote_access,
                                    bool writable, std::string* why) = 0;
  virtual std::unique_ptr<Link> open_link(std::string* why) = 0;
};

// The NIC of the device the ibverbs probe found working (ibverbs_probe.hpp); nullptr and *why
// when there is none (no device, none that works, a build without libibverbs, XMESH_IBVERBS=0).
std::shared_ptr<RdmaNic> open_ibverbs_nic(std::string* why);

}  // namespace xmesh
