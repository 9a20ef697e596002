// The data plane's owner side (issue 24; docs/architecture/06-data-plane.md): the memory a
// process lends as RDMA buffers, by id. A buffer is a range of this process's memory that peers
// read from or write into directly; the registry says which ranges are lent, hands out leases
// for one transfer each (a range checked against the buffer, the memory pinned until the lease
// ends), and lets a buffer go only once no lease holds it and no stream copies it.
//
// Ids are random 64-bit numbers: a handle names its buffer by id only, never by address, so a
// peer learns nothing it could use to reach other memory, and a forged or stale id is refused.
// A lease for a stream (a reader on another host) comes with a grant: a random token naming the
// lease on the owner's stream listener and a random key its records are sealed with.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <functional>
#include <set>
#include <string>
#include <unordered_map>

#include "device_memory.hpp"
#include "rdma_nic.hpp"

namespace xmesh {

class BufferRegistry {
 public:
  // Lends [addr, addr + size) (size > 0); writable: peers may write into it too. Returns its id.
  // device: the memory is that driver's (device_memory.hpp), which no peer reaches: each lease
  // gets a staging range of host memory (a read's filled from the device at the lease, a
  // write's copied in by land()).
  uint64_t lend(void* addr, size_t size, bool writable, std::shared_ptr<DeviceMemory> device = nullptr);

  struct Lease {
    uint64_t id = 0;      // 0: refused (*why says why)
    uint64_t number = 0;  // this lease, for release()
    char* addr = nullptr; // the leased range's start (on a device buffer: its host staging)
    size_t size = 0;
    std::string token, key;  // a stream lease's grant (empty otherwise)
    bool staged = false;     // a device buffer's lease: addr is host staging
  };
  // A lease on [offset, offset + size) of buffer `id` for reading it (write: for writing into
  // it), held by the process at address `holder`: refused, naming why, when no such buffer is
  // lent (never, or dropped), the range is not inside it, or a write is asked of a read-only
  // buffer, or a device buffer's range cannot be staged. stream: with a grant (token and key)
  // for the stream listener. direct: a device buffer's range as it is (for the NIC's own
  // registration of it), not staged.
  Lease lease(uint64_t id, uint64_t offset, uint64_t size, bool write, const std::string& holder, std::string* why,
              bool stream = false, bool direct = false);
  // A write lease on a device buffer, its bytes all in the staging range: they are copied to
  // the device. "" or why not (no such lease of this holder's, the driver's error); nothing to
  // do (a host buffer, a read lease) is "".
  std::string land(uint64_t id, uint64_t lease_number, const std::string& holder);
  // The lease ends (only its holder ends it). True when that let a dropped buffer go (its
  // memory is the owner's again).
  bool release(uint64_t id, uint64_t lease_number, const std::string& holder);
  // The process at `holder` died: every lease it held ends. Returns how many did.
  size_t release_holder(const std::string& holder);

  // A stream of a granted lease starts: bytes [offset, offset + length) of the leased range,
  // stream number `stream` (each number once per lease: a record nonce is never used twice
  // under a key). The buffer stays (even dropped, even the lease ended) until unpin().
  struct Pin {
    uint64_t id = 0;  // 0: refused (*why)
    char* addr = nullptr;
    size_t size = 0;
    bool write = false;
    std::string key;
    std::shared_ptr<char> staging;  // a device buffer's lease: kept while the stream copies
  };
  Pin pin_stream(const std::string& token, uint32_t stream, uint64_t offset, uint64_t length, std::string* why);
  void unpin(uint64_t id);

  // The RDMA NIC's registration of buffer `id`'s whole memory (rdma_nic.hpp): made by `make`
  // (memory, size, writable) at the first call, kept with the buffer and let go (deregistered)
  // when the buffer goes. nullptr when no such buffer is lent or make failed (made again at the
  // next call). Peers reach the whole buffer with its rkey, which is what its handle allows.
  // make gets the buffer's driver for device memory (nullptr: host memory); a failure is kept
  // (*why, at every later call: not tried again).
  using MakeRegion =
      std::function<RdmaNic::RegionPtr(char* addr, size_t size, bool writable, DeviceMemory* device, std::string* why)>;
  RdmaNic::RegionPtr registration(uint64_t id, const MakeRegion& make, std::string* why);
  bool on_device(uint64_t id) const;  // lent from device memory

  // Stops lending buffer `id`: new leases are refused at once. Returns how many leases still
  // hold it (its memory stays untouched by this process until release() ends the last one);
  // -1 when no such buffer is lent.
  int drop(uint64_t id);
  // Whether `id` is lent, or dropped with leases or streams still holding it.
  bool holds(uint64_t id) const;
  size_t lent() const;  // buffers lent now, not dropped

 private:
  struct LeaseRecord {
    std::string holder;
    uint64_t offset = 0, size = 0;  // within the buffer
    bool write = false;
    std::string token, key;
    std::set<uint32_t> streams;  // stream numbers used
    std::shared_ptr<char> staging;  // a device buffer's: the leased range in host memory
  };
  struct Entry {
    char* addr;
    size_t size;
    bool writable;
    bool dropped = false;
    int pins = 0;  // streams copying now
    RdmaNic::RegionPtr region;  // registered for RDMA (at the first RDMA lease)
    std::string region_failed;  // why it could not be
    std::shared_ptr<DeviceMemory> device;  // the driver of device memory; nullptr: host memory
    std::unordered_map<uint64_t, LeaseRecord> leases;  // the leases holding it, by number
  };
  // A dropped buffer nothing holds any more goes. mu_ held.
  void forget_if_unheld(std::unordered_map<uint64_t, Entry>::iterator it);
  void forget_lease(Entry& e, uint64_t number);  // mu_ held
  // A device buffer's lease gets its staging range (a read's filled from the device). mu_ held.
  bool stage(Entry& e, LeaseRecord& rec, std::string* why);
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> buffers_;
  std::unordered_map<std::string, std::pair<uint64_t, uint64_t>> tokens_;  // grant token -> (id, lease)
  uint64_t next_lease_ = 1;
};

}  // namespace xmesh
