// Libraries the data plane loads at run time rather than links (the CUDA driver, libibverbs):
// an entry point resolved by name, the missing ones collected for one message.
#pragma once
#include <dlfcn.h>

#include <string>

namespace xmesh {

template <class F>
bool resolve_symbol(void* lib, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (!*out) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *out != nullptr;
}

}  // namespace xmesh
