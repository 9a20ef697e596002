#include "buffer_registry.hpp"

#include <iterator>
#include <stdexcept>
#include <vector>

#include "record_cipher.hpp"
#include "util.hpp"

namespace xmesh {

uint64_t BufferRegistry::lend(void* addr, size_t size, bool writable, std::shared_ptr<DeviceMemory> device) {
  if (!addr || size == 0) throw std::invalid_argument("an RDMA buffer needs memory of at least one byte");
  std::lock_guard<std::mutex> g(mu_);
  uint64_t id;
  do id = random_token();
  while (buffers_.count(id));
  buffers_.emplace(id, Entry{static_cast<char*>(addr), size, writable, false, 0, nullptr, "", std::move(device), {}});
  return id;
}

RdmaNic::RegionPtr BufferRegistry::registration(uint64_t id, const MakeRegion& make, std::string* why) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end() || it->second.dropped) {
    *why = "the buffer was dropped (or never lent by this process)";
    return nullptr;
  }
  Entry& e = it->second;
  if (!e.region && e.region_failed.empty()) {
    e.region = make(e.addr, e.size, e.writable, e.device.get(), why);
    if (!e.region) e.region_failed = why->empty() ? "the NIC refused it" : *why;
  }
  if (!e.region) *why = e.region_failed;
  return e.region;
}

bool BufferRegistry::on_device(uint64_t id) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = buffers_.find(id);
  return it != buffers_.end() && it->second.device != nullptr;
}

BufferRegistry::Lease BufferRegistry::lease(uint64_t id, uint64_t offset, uint64_t size, bool write,
                                            const std::string& holder, std::string* why, bool stream, bool direct) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end() || it->second.dropped) {
    *why = "the buffer was dropped (or never lent by this process)";
    return {};
  }
  Entry& e = it->second;
  if (offset > e.size || size > e.size - offset) {
    *why = "bytes " + std::to_string(offset) + ".." + std::to_string(offset + size) + " are not inside the buffer (" +
           std::to_string(e.size) + " bytes)";
    return {};
  }
  if (write && !e.writable) {
    *why = "the buffer is read-only (it was lent from read-only memory)";
    return {};
  }
  LeaseRecord rec{holder, offset, size, write, "", "", {}, nullptr};
  if (e.device && !direct && !stage(e, rec, why)) return {};
  uint64_t number = next_lease_++;
  if (stream) {
    do rec.token = random_bytes(16);
    while (tokens_.count(rec.token));
    rec.key = random_bytes(kRecordKeyBytes);
    tokens_[rec.token] = {id, number};
  }
  Lease out{id, number, rec.staging ? rec.staging.get() : e.addr + offset, static_cast<size_t>(size), rec.token,
            rec.key, rec.staging != nullptr};
  e.leases.emplace(number, std::move(rec));
  return out;
}

bool BufferRegistry::stage(Entry& e, LeaseRecord& rec, std::string* why) {
  rec.staging = e.device->host_staging(rec.size, why);
  if (!rec.staging) {
    *why = "the buffer's device memory could not be staged: " + *why;
    return false;
  }
  if (rec.write) return true;  // the writer fills it all; land() copies it in
  if (std::string bad = e.device->to_host(rec.staging.get(), e.addr + rec.offset, rec.size); !bad.empty()) {
    *why = "the buffer's device memory could not be read: " + bad;
    return false;
  }
  return true;
}

std::string BufferRegistry::land(uint64_t id, uint64_t lease_number, const std::string& holder) {
  std::lock_guard<std::mutex> g(mu_);
  const char* unheld = "no such lease is held (it ended, or the owner restarted)";
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return unheld;
  auto lease = it->second.leases.find(lease_number);
  if (lease == it->second.leases.end() || lease->second.holder != holder) return unheld;
  const LeaseRecord& rec = lease->second;
  if (!rec.staging || !rec.write) return "";
  if (std::string bad = it->second.device->to_device(it->second.addr + rec.offset, rec.staging.get(), rec.size);
      !bad.empty())
    return "the written bytes could not be copied to the buffer's device memory: " + bad;
  return "";
}

void BufferRegistry::forget_lease(Entry& e, uint64_t number) {
  auto l = e.leases.find(number);
  if (l == e.leases.end()) return;
  if (!l->second.token.empty()) tokens_.erase(l->second.token);
  e.leases.erase(l);
}

void BufferRegistry::forget_if_unheld(std::unordered_map<uint64_t, Entry>::iterator it) {
  if (it->second.dropped && it->second.leases.empty() && it->second.pins == 0) buffers_.erase(it);
}

bool BufferRegistry::release(uint64_t id, uint64_t lease_number, const std::string& holder) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return false;
  auto lease = it->second.leases.find(lease_number);
  if (lease == it->second.leases.end() || lease->second.holder != holder) return false;  // not its lease to end
  forget_lease(it->second, lease_number);
  const size_t before = buffers_.size();
  forget_if_unheld(it);
  return buffers_.size() < before;
}

size_t BufferRegistry::release_holder(const std::string& holder) {
  std::lock_guard<std::mutex> g(mu_);
  size_t ended = 0;
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    std::vector<uint64_t> theirs;
    for (auto& [number, rec] : it->second.leases)
      if (rec.holder == holder) theirs.push_back(number);
    for (uint64_t number : theirs) forget_lease(it->second, number);
    ended += theirs.size();
    auto next = std::next(it);
    forget_if_unheld(it);
    it = next;
  }
  return ended;
}

BufferRegistry::Pin BufferRegistry::pin_stream(const std::string& token, uint32_t stream, uint64_t offset,
                                               uint64_t length, std::string* why) {
  std::lock_guard<std::mutex> g(mu_);
  auto t = tokens_.find(token);
  if (t == tokens_.end()) {
    *why = "no lease has that token (ended, or never granted)";
    return {};
  }
  Entry& e = buffers_.at(t->second.first);
  LeaseRecord& rec = e.leases.at(t->second.second);
  if (offset > rec.size || length > rec.size - offset || length == 0) {
    *why = "bytes " + std::to_string(offset) + ".." + std::to_string(offset + length) + " are not inside the lease (" +
           std::to_string(rec.size) + " bytes)";
    return {};
  }
  if (!rec.streams.insert(stream).second) {
    *why = "stream " + std::to_string(stream) + " of this lease was used already";
    return {};
  }
  ++e.pins;
  char* base = rec.staging ? rec.staging.get() : e.addr + rec.offset;
  return Pin{t->second.first, base + offset, static_cast<size_t>(length), rec.write, rec.key, rec.staging};
}

void BufferRegistry::unpin(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  --it->second.pins;
  forget_if_unheld(it);
}

int BufferRegistry::drop(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end() || it->second.dropped) return -1;
  it->second.dropped = true;
  const int left = static_cast<int>(it->second.leases.size());
  forget_if_unheld(it);
  return left;
}

bool BufferRegistry::holds(uint64_t id) const {
  std::lock_guard<std::mutex> g(mu_);
  return buffers_.count(id) > 0;
}

size_t BufferRegistry::lent() const {
  std::lock_guard<std::mutex> g(mu_);
  size_t n = 0;
  for (auto& kv : buffers_) n += !kv.second.dropped;
  return n;
}

}  // namespace xmesh
