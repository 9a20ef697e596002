// Accelerator memory in the data plane (issue 24; docs/architecture/06-data-plane.md): an
// RDMA buffer or a transfer's local memory may be a GPU's, which no other process can attach to
// and no socket can send from. Such memory is staged through pinned host memory: the owner of a
// device buffer copies a leased range to host memory for a read and copies a write's bytes in
// once they all arrived; a reader with a device destination (or source) moves the bytes through
// host memory of its own. DeviceMemory is what that needs of a driver.
//
// The CUDA one (`load_cuda_driver`) loads the driver library at run time (dlopen of
// libcuda.so.1, or the file XMESH_CUDA_DRIVER names), so nothing needs CUDA to build or run; a
// machine without it is told why.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace xmesh {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual std::string name() const = 0;
  // Whether [p, p + n) is device memory of this driver (the whole range).
  virtual bool holds(const void* p, size_t n) = 0;
  // Copies between device and host memory, synchronously: "" or why not.
  virtual std::string to_host(char* host, const char* device, size_t n) = 0;
  virtual std::string to_device(char* device, const char* host, size_t n) = 0;
  // n bytes of host memory the device copies to and from fast (pinned); nullptr and *why.
  virtual std::shared_ptr<char> host_staging(size_t n, std::string* why) = 0;
  // A dma-buf file descriptor covering [p, p + n) (the caller closes it) and p's offset in it,
  // for a NIC to register the device memory itself (GPUDirect RDMA); -1 and *why where the
  // driver or the memory does not allow it (the data plane then stages).
  virtual int dmabuf(const char* p, size_t n, uint64_t* offset, std::string* why) = 0;
};

// The CUDA driver, loaded once per process; nullptr and *why when it cannot be (no driver
// library, no device, an entry point missing).
std::shared_ptr<DeviceMemory> load_cuda_driver(std::string* why);

}  // namespace xmesh
