/* A stand-in for the CUDA driver library (libcuda.so.1) for the data plane's tests on machines
 * without a GPU (see runtime/data/device_memory.hpp): xmesh loads it through XMESH_CUDA_DRIVER exactly
 * as it loads the real driver. Its "device memory" is host memory mapped PROT_NONE, opened only
 * inside this library's own copy functions: so any code that touches device memory directly
 * (a memcpy, a cross-memory attach by another process, a socket send) faults or fails, as it
 * would with a GPU's memory, and only the driver's copies reach it. Only what xmesh uses is
 * here, plus cuMemAlloc_v2 / cuMemFree_v2 for the tests to make device memory, and a counter
 * of the copies made. Not a CUDA implementation. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3 };
enum { ATTR_CONTEXT = 1, ATTR_MEMORY_TYPE = 2, ATTR_RANGE_START = 11, ATTR_RANGE_SIZE = 12 };
enum { MEMORY_TYPE_HOST = 1, MEMORY_TYPE_DEVICE = 2 };

#define MAX_ALLOCS 256
static struct { char* base; size_t size, mapped; int fd; } allocs[MAX_ALLOCS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static char the_context;  /* the one context there is */
static unsigned long long copies;
static int dmabuf_allowed = 1;
static __thread int pushed;

static int find(CUdeviceptr p, size_t n) {
  for (int i = 0; i < MAX_ALLOCS; ++i) {
    char* b = allocs[i].base;
    if (b && (char*)p >= b && (char*)p + n <= b + allocs[i].size && (char*)p + n >= (char*)p) return i;
  }
  return -1;
}

CUresult cuInit(unsigned flags) {
  (void)flags;
  initialized = 1;
  return SUCCESS;
}

CUresult cuGetErrorString(CUresult r, const char** text) {
  static const char* names[] = {"no error", "invalid argument", "out of memory", "driver not initialized"};
  *text = r >= 0 && r <= 3 ? names[r] : "unknown error";
  return SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t n) {
  if (!initialized) return NOT_INITIALIZED;
  /* Backed by a memfd, so that a dma-buf of it can be handed out (a NIC maps the memfd). */
  size_t page = (size_t)sysconf(_SC_PAGESIZE), mapped = (n + page - 1) / page * page;
  int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
  if (fd < 0) return OUT_OF_MEMORY;
  void* p = ftruncate(fd, (off_t)mapped) == 0 ? mmap(NULL, mapped, PROT_NONE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (p == MAP_FAILED) {
    close(fd);
    return OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_ALLOCS; ++i)
    if (!allocs[i].base) {
      allocs[i].base = p;
      allocs[i].size = n;
      allocs[i].mapped = mapped;
      allocs[i].fd = fd;
      pthread_mutex_unlock(&mu);
      *out = (CUdeviceptr)p;
      return SUCCESS;
    }
  pthread_mutex_unlock(&mu);
  munmap(p, mapped);
  close(fd);
  return OUT_OF_MEMORY;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  int i = find(p, 0);
  if (i < 0 || (char*)p != allocs[i].base) {
    pthread_mutex_unlock(&mu);
    return INVALID_VALUE;
  }
  munmap(allocs[i].base, allocs[i].mapped);
  close(allocs[i].fd);
  allocs[i].base = NULL;
  pthread_mutex_unlock(&mu);
  return SUCCESS;
}

CUresult cuPointerGetAttribute(void* out, int attribute, CUdeviceptr p) {
  if (!initialized) return NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  int i = find(p, 0);
  pthread_mutex_unlock(&mu);
  if (i < 0) return INVALID_VALUE; /* as the driver answers for memory it does not know */
  switch (attribute) {
    case ATTR_CONTEXT: *(void**)out = &the_context; return SUCCESS;
    case ATTR_MEMORY_TYPE: *(unsigned*)out = MEMORY_TYPE_DEVICE; return SUCCESS;
    case ATTR_RANGE_START: *(CUdeviceptr*)out = (CUdeviceptr)allocs[i].base; return SUCCESS;
    case ATTR_RANGE_SIZE: *(size_t*)out = allocs[i].size; return SUCCESS;
    default: return INVALID_VALUE;
  }
}

CUresult cuCtxPushCurrent_v2(void* ctx) {
  if (ctx != &the_context) return INVALID_VALUE;
  ++pushed;
  return SUCCESS;
}

CUresult cuCtxPopCurrent_v2(void** ctx) {
  if (pushed == 0) return INVALID_VALUE;
  --pushed;
  if (ctx) *ctx = &the_context;
  return SUCCESS;
}

/* A copy with the device range opened for this library alone, under the lock (copies of
 * one "device" run one at a time, as on a copy engine). */
static CUresult copy(char* dst, const char* src, CUdeviceptr device, size_t n) {
  if (pushed == 0) return INVALID_VALUE; /* no current context */
  pthread_mutex_lock(&mu);
  int i = find(device, n);
  if (i < 0) {
    pthread_mutex_unlock(&mu);
    return INVALID_VALUE;
  }
  mprotect(allocs[i].base, allocs[i].mapped, PROT_READ | PROT_WRITE);
  memcpy(dst, src, n);
  mprotect(allocs[i].base, allocs[i].mapped, PROT_NONE);
  ++copies;
  pthread_mutex_unlock(&mu);
  return SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void* host, CUdeviceptr device, size_t n) { return copy(host, (const char*)device, device, n); }
CUresult cuMemcpyHtoD_v2(CUdeviceptr device, const void* host, size_t n) { return copy((char*)device, host, device, n); }

/* Helpers for the tests (not CUDA's): copies without a context pushed first. */
CUresult fake_cuda_copy_in(CUdeviceptr device, const void* host, size_t n) {
  ++pushed;
  CUresult r = cuMemcpyHtoD_v2(device, host, n);
  --pushed;
  return r;
}
CUresult fake_cuda_copy_out(void* host, CUdeviceptr device, size_t n) {
  ++pushed;
  CUresult r = cuMemcpyDtoH_v2(host, device, n);
  --pushed;
  return r;
}
unsigned long long fake_cuda_copies(void) { return copies; }

/* A dma-buf of device memory (CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD): here a duplicate of the
 * allocation's memfd, so only ranges that start at an allocation are served (the real driver
 * serves any page-aligned range); fake_cuda_allow_dmabuf(0) refuses all, as a driver or GPU
 * without dma-buf support does. */
CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr p, size_t n, int type, unsigned long long flags) {
  (void)flags;
  if (!initialized) return NOT_INITIALIZED;
  if (type != 1 || !dmabuf_allowed) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int i = find(p, 0);
  int ok = i >= 0 && (char*)p == allocs[i].base && n <= allocs[i].mapped;
  int fd = ok ? dup(allocs[i].fd) : -1;
  pthread_mutex_unlock(&mu);
  if (fd < 0) return INVALID_VALUE;
  *(int*)handle = fd;
  return SUCCESS;
}
void fake_cuda_allow_dmabuf(int on) { dmabuf_allowed = on; }

CUresult cuMemHostAlloc(void** out, size_t n, unsigned flags) {
  (void)flags;
  if (!initialized) return NOT_INITIALIZED;
  *out = malloc(n ? n : 1);
  return *out ? SUCCESS : OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void* p) {
  free(p);
  return SUCCESS;
}
