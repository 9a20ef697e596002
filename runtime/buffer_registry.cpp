#include "buffer_registry.hpp"

#include <stdexcept>

#include "util.hpp"

namespace xmesh {

uint64_t BufferRegistry::lend(void* addr, size_t size, bool writable) {
  if (!addr || size == 0) throw std::invalid_argument("an RDMA buffer needs memory of at least one byte");
  std::lock_guard<std::mutex> g(mu_);
  uint64_t id;
  do id = random_token();
  while (buffers_.count(id));
  buffers_.emplace(id, Entry{static_cast<char*>(addr), size, writable, false, {}});
  return id;
}

BufferRegistry::Lease BufferRegistry::lease(uint64_t id, uint64_t offset, uint64_t size, bool write,
                                            const std::string& holder, std::string* why) {
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
  uint64_t number = next_lease_++;
  e.leases.emplace(number, holder);
  return Lease{id, number, e.addr + offset, static_cast<size_t>(size)};
}

bool BufferRegistry::release(uint64_t id, uint64_t lease_number, const std::string& holder) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return false;
  auto lease = it->second.leases.find(lease_number);
  if (lease == it->second.leases.end() || lease->second != holder) return false;  // not its lease to end
  it->second.leases.erase(lease);
  if (it->second.dropped && it->second.leases.empty()) {
    buffers_.erase(it);
    return true;
  }
  return false;
}

size_t BufferRegistry::release_holder(const std::string& holder) {
  std::lock_guard<std::mutex> g(mu_);
  size_t ended = 0;
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    auto& leases = it->second.leases;
    for (auto l = leases.begin(); l != leases.end();) {
      if (l->second == holder) {
        l = leases.erase(l);
        ++ended;
      } else {
        ++l;
      }
    }
    if (it->second.dropped && leases.empty())
      it = buffers_.erase(it);
    else
      ++it;
  }
  return ended;
}

int BufferRegistry::drop(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end() || it->second.dropped) return -1;
  if (it->second.leases.empty()) {
    buffers_.erase(it);
    return 0;
  }
  it->second.dropped = true;
  return static_cast<int>(it->second.leases.size());
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
