// A simulated RDMA fabric for the data plane's tests (this machine has no RDMA device; see
// docs/architecture/06-data-plane.md): NICs in one process that keep the verbs rules the
// data plane depends on. Memory is reached only through a registration (lkey for its own NIC,
// rkey for peers, remote write only where registered writable, ranges inside it); a link moves
// bytes only once connected to a peer link that is connected back to it; a link whose transfer
// failed or was aborted stays broken; a transfer returns only when it no longer touches memory.
// Faults to inject: the peer unreachable, a pause per step (to act mid-transfer), a NIC that
// refuses to register memory.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <sys/mman.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "rdma_nic.hpp"

namespace xmesh::testing {

class SimulatedLink;

struct SimulatedFabric {
  struct Registration {
    int nic;
    char* addr;  // where this process reaches it
    size_t size;
    bool remote, writable;
    uint64_t iova;  // where work requests and peers address it (addr, or a dma-buf's device pointer)
  };
  std::mutex mu;
  uint32_t next_key = 0x100, next_qpn = 0x1000;
  std::map<uint32_t, Registration> regions;  // by key (lkey and rkey are one number here)
  std::map<uint32_t, SimulatedLink*> links;  // by queue pair number
  std::atomic<bool> unreachable{false};      // transfers fail as a fabric that cannot route them
  std::atomic<int> step_pause_ms{0};         // a pause per 1 MiB moved
  std::atomic<int> transfers{0}, aborted{0}, dmabufs{0};

  size_t registered() {
    std::lock_guard<std::mutex> g(mu);
    return regions.size();
  }
};

class SimulatedLink : public RdmaNic::Link {
 public:
  SimulatedLink(std::shared_ptr<SimulatedFabric> fabric, int nic) : fabric_(std::move(fabric)), nic_(nic) {
    std::lock_guard<std::mutex> g(fabric_->mu);
    qpn_ = fabric_->next_qpn++;
    fabric_->links[qpn_] = this;
  }
  ~SimulatedLink() override {
    std::lock_guard<std::mutex> g(fabric_->mu);
    fabric_->links.erase(qpn_);
  }
  RdmaAddress address() const override { return RdmaAddress{qpn_, 7, 1, "", 5}; }
  std::string connect(const RdmaAddress& peer) override {
    if (peer_ != 0) return "the queue pair is connected already";
    peer_ = peer.qpn;
    return "";
  }
  bool connected() const override { return peer_ != 0; }
  uint32_t peer_qpn() const override { return peer_; }

  RdmaResult transfer(bool write, char* local, const RdmaNic::Region& region, uint64_t remote, uint32_t rkey, size_t n,
                      const std::function<bool()>& keep_going) override {
    std::lock_guard<std::mutex> g(mu_);
    if (broken_) return fail("the RDMA connection broke in an earlier transfer");
    char *here = nullptr, *there = nullptr;
    if (std::string bad = check(write, local, region, remote, rkey, n, &here, &there); !bad.empty()) return fail(bad);
    ++fabric_->transfers;
    constexpr size_t kStep = size_t(1) << 20;
    for (size_t at = 0; at < n; at += kStep) {
      if (!keep_going()) {
        broken_ = true;
        ++fabric_->aborted;
        return {RdmaResult::Status::aborted, "the transfer was stopped"};
      }
      const size_t k = std::min(kStep, n - at);
      if (write)
        std::memcpy(there + at, here + at, k);
      else
        std::memcpy(here + at, there + at, k);
      if (int pause = fabric_->step_pause_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(pause));
    }
    return {};
  }

 private:
  RdmaResult fail(const std::string& why) {
    broken_ = true;
    return {RdmaResult::Status::failed, why};
  }
  // What a NIC would refuse (a completion error's words), or "" and *there: the peer's bytes.
  static bool inside(const SimulatedFabric::Registration& r, uint64_t at, size_t n) {
    return at >= r.iova && n <= r.size && at - r.iova <= r.size - n;
  }
  // *here and *there: the two ranges as this process reaches them.
  std::string check(bool write, char* local, const RdmaNic::Region& region, uint64_t remote, uint32_t rkey, size_t n,
                    char** here, char** there) {
    std::lock_guard<std::mutex> g(fabric_->mu);
    if (!peer_) return "the queue pair is not connected";
    auto peer = fabric_->links.find(peer_);
    if (fabric_->unreachable || peer == fabric_->links.end() || peer->second->peer_ != qpn_)
      return "transport retry counter exceeded";
    auto mine = fabric_->regions.find(region.lkey);
    const uint64_t at_local = reinterpret_cast<uint64_t>(local);
    if (mine == fabric_->regions.end() || mine->second.nic != nic_ || !inside(mine->second, at_local, n))
      return "local protection error";
    auto theirs = fabric_->regions.find(rkey);
    if (theirs == fabric_->regions.end() || theirs->second.nic != peer->second->nic_ || !theirs->second.remote ||
        (write && !theirs->second.writable) || !inside(theirs->second, remote, n))
      return "remote access error";
    *here = mine->second.addr + (at_local - mine->second.iova);
    *there = theirs->second.addr + (remote - theirs->second.iova);
    return "";
  }
  std::shared_ptr<SimulatedFabric> fabric_;
  const int nic_;
  uint32_t qpn_ = 0;
  std::atomic<uint32_t> peer_{0};
  std::mutex mu_;
  bool broken_ = false;
};

class SimulatedNic : public RdmaNic {
 public:
  SimulatedNic(std::shared_ptr<SimulatedFabric> fabric, int id) : fabric_(std::move(fabric)), id_(id) {}
  std::string device() const override { return "sim" + std::to_string(id_); }
  RegionPtr register_memory(char* addr, size_t size, bool remote, bool writable, std::string* why) override {
    if (refuse_registration) return *why = "registering memory (ibv_reg_mr) failed: Cannot allocate memory", nullptr;
    std::lock_guard<std::mutex> g(fabric_->mu);
    const uint32_t key = fabric_->next_key++;
    fabric_->regions[key] = {id_, addr, size, remote, writable, reinterpret_cast<uint64_t>(addr)};
    auto fabric = fabric_;
    return RegionPtr(new Region{addr, size, key, key}, [fabric, key](const Region* r) {
      std::lock_guard<std::mutex> g(fabric->mu);
      fabric->regions.erase(key);
      delete r;
    });
  }
  // The dma-buf mapped (as a NIC reaches it, by its own mapping of the exporter's memory).
  RegionPtr register_dmabuf(int fd, uint64_t offset, size_t size, uint64_t iova, bool remote, bool writable,
                            std::string* why) override {
    void* base = mmap(nullptr, offset + size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return *why = "registering device memory (ibv_reg_dmabuf_mr) failed: Bad address", nullptr;
    std::lock_guard<std::mutex> g(fabric_->mu);
    const uint32_t key = fabric_->next_key++;
    fabric_->regions[key] = {id_, static_cast<char*>(base) + offset, size, remote, writable, iova};
    ++fabric_->dmabufs;
    auto fabric = fabric_;
    const size_t mapped = offset + size;
    return RegionPtr(new Region{reinterpret_cast<char*>(iova), size, key, key}, [fabric, key, base, mapped](const Region* r) {
      {
        std::lock_guard<std::mutex> g(fabric->mu);
        fabric->regions.erase(key);
      }
      munmap(base, mapped);
      delete r;
    });
  }
  std::unique_ptr<Link> open_link(std::string*) override { return std::make_unique<SimulatedLink>(fabric_, id_); }
  std::atomic<bool> refuse_registration{false};

 private:
  std::shared_ptr<SimulatedFabric> fabric_;
  const int id_;
};

}  // namespace xmesh::testing
