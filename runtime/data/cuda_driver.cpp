// The CUDA driver API as DeviceMemory (device_memory.hpp), loaded with dlopen: the few entry
// points the data plane uses, declared here with the driver's C types (no CUDA header needed).
// Copies run in the context that owns the pointer (pushed around the copy), so memory of any
// device and of any context (PyTorch's primary ones) is served.
#include <dlfcn.h>
#include <unistd.h>

#include <mutex>

#include "device_memory.hpp"
#include "dl_symbols.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
using CUresult = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;
constexpr int kPointerContext = 1;     // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kPointerMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerRangeSize = 12;  // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr int kPointerRangeStart = 11; // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr unsigned kMemoryTypeDevice = 2;
constexpr unsigned kHostAllocPortable = 1;  // CU_MEMHOSTALLOC_PORTABLE: pinned for every context

struct Api {
  CUresult (*init)(unsigned);
  CUresult (*pointer_attribute)(void*, int, CUdeviceptr);
  CUresult (*dtoh)(void*, CUdeviceptr, size_t);
  CUresult (*htod)(CUdeviceptr, const void*, size_t);
  CUresult (*host_alloc)(void**, size_t, unsigned);
  CUresult (*free_host)(void*);
  CUresult (*push)(CUcontext);
  CUresult (*pop)(CUcontext*);
  CUresult (*error_string)(CUresult, const char**);
  // Optional (CUDA 11.7 and later): a dma-buf of device memory, for GPUDirect RDMA.
  CUresult (*range_handle)(void*, CUdeviceptr, size_t, int, unsigned long long);
};
constexpr int kRangeHandleDmabufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

class CudaDriver : public DeviceMemory {
 public:
  CudaDriver(void* lib, Api api, std::string path) : lib_(lib), api_(api), path_(std::move(path)) {}
  std::string name() const override { return "CUDA (" + path_ + ")"; }

  bool holds(const void* p, size_t n) override {
    unsigned type = 0;
    if (api_.pointer_attribute(&type, kPointerMemoryType, ptr(p)) != 0 || type != kMemoryTypeDevice) return false;
    CUdeviceptr start = 0;
    size_t size = 0;
    if (api_.pointer_attribute(&start, kPointerRangeStart, ptr(p)) != 0 ||
        api_.pointer_attribute(&size, kPointerRangeSize, ptr(p)) != 0)
      return true;  // an older driver: the start is device memory, the caller's size is trusted
    return ptr(p) >= start && n <= size - (ptr(p) - start);
  }

  std::string to_host(char* host, const char* device, size_t n) override {
    return in_context_of(device, "cuMemcpyDtoH", [&] { return api_.dtoh(host, ptr(device), n); });
  }
  std::string to_device(char* device, const char* host, size_t n) override {
    return in_context_of(device, "cuMemcpyHtoD", [&] { return api_.htod(ptr(device), host, n); });
  }

  int dmabuf(const char* p, size_t n, uint64_t* offset, std::string* why) override {
    if (!api_.range_handle) {
      *why = "the CUDA driver has no cuMemGetHandleForAddressRange (older than CUDA 11.7)";
      return -1;
    }
    // The range must start and end on host pages: the whole pages around [p, p + n).
    const CUdeviceptr page = static_cast<CUdeviceptr>(sysconf(_SC_PAGESIZE));
    const CUdeviceptr start = ptr(p) / page * page, end = (ptr(p) + n + page - 1) / page * page;
    int fd = -1;
    if (CUresult r = api_.range_handle(&fd, start, end - start, kRangeHandleDmabufFd, 0); r != 0) {
      *why = said("cuMemGetHandleForAddressRange (dma-buf)", r);
      return -1;
    }
    *offset = ptr(p) - start;
    return fd;
  }

  std::shared_ptr<char> host_staging(size_t n, std::string* why) override {
    void* p = nullptr;
    if (CUresult r = api_.host_alloc(&p, n, kHostAllocPortable); r != 0) {
      *why = said("cuMemHostAlloc of " + std::to_string(n) + " bytes", r);
      return nullptr;
    }
    auto free_host = api_.free_host;
    return std::shared_ptr<char>(static_cast<char*>(p), [free_host](char* q) { free_host(q); });
  }

 private:
  static CUdeviceptr ptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }
  std::string said(const std::string& what, CUresult r) const {
    const char* text = nullptr;
    if (api_.error_string(r, &text) != 0 || !text) text = "unknown error";
    return what + " failed: " + text + " (CUresult " + std::to_string(r) + ")";
  }
  template <class Copy>
  std::string in_context_of(const char* device, const char* what, Copy copy) {
    CUcontext ctx = nullptr;
    if (CUresult r = api_.pointer_attribute(&ctx, kPointerContext, ptr(device)); r != 0)
      return said("finding the context of device memory", r);
    if (CUresult r = api_.push(ctx); r != 0) return said("cuCtxPushCurrent", r);
    const CUresult r = copy();
    CUcontext popped = nullptr;
    api_.pop(&popped);
    return r == 0 ? "" : said(what, r);
  }
  void* lib_;  // kept open for the process's life (the driver is not unloadable in practice)
  Api api_;
  std::string path_;
};


std::shared_ptr<DeviceMemory> open_driver(std::string* why) {
  const std::string chosen = env_str("XMESH_CUDA_DRIVER");
  const std::string path = chosen.empty() ? "libcuda.so.1" : chosen;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    *why = "the CUDA driver could not be loaded (" + std::string(err ? err : path) +
           "): no NVIDIA driver on this machine";
    return nullptr;
  }
  Api a{};
  std::string missing;
  resolve_symbol(lib, "cuInit", &a.init, &missing);
  resolve_symbol(lib, "cuPointerGetAttribute", &a.pointer_attribute, &missing);
  resolve_symbol(lib, "cuMemcpyDtoH_v2", &a.dtoh, &missing);
  resolve_symbol(lib, "cuMemcpyHtoD_v2", &a.htod, &missing);
  resolve_symbol(lib, "cuMemHostAlloc", &a.host_alloc, &missing);
  resolve_symbol(lib, "cuMemFreeHost", &a.free_host, &missing);
  resolve_symbol(lib, "cuCtxPushCurrent_v2", &a.push, &missing);
  resolve_symbol(lib, "cuCtxPopCurrent_v2", &a.pop, &missing);
  resolve_symbol(lib, "cuGetErrorString", &a.error_string, &missing);
  a.range_handle = reinterpret_cast<decltype(a.range_handle)>(dlsym(lib, "cuMemGetHandleForAddressRange"));
  if (!missing.empty()) {
    *why = "the CUDA driver " + path + " lacks " + missing;
    dlclose(lib);
    return nullptr;
  }
  if (CUresult r = a.init(0); r != 0) {
    const char* text = nullptr;
    a.error_string(r, &text);
    *why = "cuInit failed: " + std::string(text ? text : "unknown error") + " (CUresult " + std::to_string(r) +
           "): no usable GPU";
    return nullptr;  // the library stays loaded: unloading a driver that failed to start helps nothing
  }
  return std::make_shared<CudaDriver>(lib, a, path);
}
}  // namespace

std::shared_ptr<DeviceMemory> load_cuda_driver(std::string* why) {
  static std::mutex mu;
  static bool tried = false;
  static std::shared_ptr<DeviceMemory> driver;
  static std::string failure;
  std::lock_guard<std::mutex> g(mu);
  if (!tried) {
    tried = true;
    driver = open_driver(&failure);
  }
  if (!driver && why) *why = failure;
  return driver;
}

}  // namespace xmesh
