// Copies between this process's memory and another process's on the same host, in one copy:
// Linux's cross-memory attach (process_vm_readv / process_vm_writev). The data plane's same-host
// transfers use it (docs/architecture/06-data-plane.md): a reader copies from its peer's
// leased buffer straight into its own destination, no staging, no socket.
//
// The kernel allows it where this process may ptrace the other (the same user, and under Yama's
// ptrace_scope 1 only an ancestor, or a process the other named with PR_SET_PTRACER): a copy
// that is not permitted says so, and the caller takes another way.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <string>

namespace xmesh {

struct ProcessCopy {
  enum class Status { ok, gone, not_permitted, bad_address, failed };
  Status status = Status::ok;
  std::string why;  // for anything but ok: what went wrong, naming the process
  explicit operator bool() const { return status == Status::ok; }
};

// size bytes at `remote` in process pid into `local` (all of them, or an error).
ProcessCopy read_process_memory(pid_t pid, const void* remote, void* local, size_t size);
// size bytes at `local` into `remote` in process pid.
ProcessCopy write_process_memory(pid_t pid, void* remote, const void* local, size_t size);

}  // namespace xmesh
