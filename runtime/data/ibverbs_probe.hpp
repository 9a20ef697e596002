// Whether RDMA through libibverbs really works here (issue 24; docs/architecture/06-data-plane.md): not whether a device is listed (listed-but-broken devices exist: a port down, no
// memory registration allowed, a provider without its kernel driver), but whether one carries a
// transfer. The probe opens each listed device, registers memory, brings up a reliable-connected
// queue pair connected to itself (loopback), RDMA-writes 4 KiB from one registered buffer into
// another and checks the bytes. The first device that passes is the one to use; otherwise the
// answer says, per device, the step that failed.
//
// Built where libibverbs' headers are (Debian's libibverbs-dev, which scripts/setup.sh
// installs); without them the probe says the build has no ibverbs.
#pragma once
#include <string>
#include <vector>

namespace xmesh {

struct IbverbsProbe {
  bool usable = false;
  std::string device;               // the device that carried the loopback transfer
  std::vector<std::string> listed;  // every device listed
  std::string why;                  // when not usable: why, per device
};

// Probes once per process (the answer is kept); XMESH_IBVERBS=0 skips it (not usable, saying so).
const IbverbsProbe& probe_ibverbs();

}  // namespace xmesh
