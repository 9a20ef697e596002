// The RDMA NIC over libibverbs (rdma_nic.hpp) and the probe that decides whether one works
// here (ibverbs_probe.hpp): the probe is the NIC's own code path run against itself (a link
// connected to itself, one RDMA write between two registered buffers), so a device that passes
// it has carried what the data plane will ask of it.
//
// libibverbs is loaded at run time (dlopen), never linked: xmesh must load where no libibverbs
// is installed (a wheel on a machine without rdma-core), and must use the machine's own copy,
// whose providers (libmlx5 and the others) are tied to it, never one bundled beside xmesh.
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "ibverbs_probe.hpp"
#include "rdma_nic.hpp"
#include "dl_symbols.hpp"
#include "util.hpp"

#ifdef XMESH_HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif

namespace xmesh {

std::string RdmaAddress::to_string() const {
  return std::to_string(qpn) + ":" + std::to_string(psn) + ":" + std::to_string(lid) + ":" + std::to_string(mtu) +
         ":" + gid;
}

bool RdmaAddress::parse(const std::string& text, RdmaAddress* out, std::string* why) {
  RdmaAddress a;
  uint32_t* numbers[] = {&a.qpn, &a.psn, &a.lid, &a.mtu};
  size_t at = 0;
  for (uint32_t* n : numbers) {
    const size_t colon = text.find(':', at);
    const std::string part = text.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
    if (colon == std::string::npos || part.empty() || part.size() > 10 ||
        part.find_first_not_of("0123456789") != std::string::npos || std::stoull(part) > 0xffffffffULL) {
      *why = "an RDMA address is qpn:psn:lid:mtu:gid (decimal numbers, gid 32 hex digits or empty), not '" +
             text.substr(0, 80) + "'";
      return false;
    }
    *n = static_cast<uint32_t>(std::stoull(part));
    at = colon + 1;
  }
  a.gid = text.substr(at);
  std::string raw;
  if (!a.gid.empty() && (a.gid.size() != 32 || !from_hex(a.gid, &raw))) {
    *why = "an RDMA address's gid is 32 hex digits or empty, not '" + a.gid.substr(0, 40) + "'";
    return false;
  }
  if (a.qpn == 0) {
    *why = "an RDMA address names queue pair 0";
    return false;
  }
  *out = a;
  return true;
}

#ifdef XMESH_HAVE_IBVERBS
namespace {
std::string failed(const char* step) { return std::string(step) + " failed: " + std::strerror(errno ? errno : EIO); }

// The entry points used, typed by verbs.h's declarations (decltype does not link them). Post and
// poll are verbs.h's inline calls through the context's ops, which need no symbol.
struct Verbs {
  decltype(&::ibv_get_device_list) get_device_list;
  decltype(&::ibv_free_device_list) free_device_list;
  decltype(&::ibv_get_device_name) get_device_name;
  decltype(&::ibv_open_device) open_device;
  decltype(&::ibv_close_device) close_device;
  decltype(&::ibv_alloc_pd) alloc_pd;
  decltype(&::ibv_dealloc_pd) dealloc_pd;
  decltype(&::ibv_query_port) query_port;  // the exported one, which fills a whole ibv_port_attr
  decltype(&::ibv_query_gid) query_gid;
  decltype(&::ibv_reg_mr) reg_mr;
  decltype(&::ibv_reg_dmabuf_mr) reg_dmabuf_mr;  // optional: rdma-core 34 and later
  decltype(&::ibv_dereg_mr) dereg_mr;
  decltype(&::ibv_create_cq) create_cq;
  decltype(&::ibv_destroy_cq) destroy_cq;
  decltype(&::ibv_create_qp) create_qp;
  decltype(&::ibv_destroy_qp) destroy_qp;
  decltype(&::ibv_modify_qp) modify_qp;
  decltype(&::ibv_wc_status_str) wc_status_str;
};
Verbs verbs{};  // filled by load_verbs, before the probe opens anything


// "" once every required entry point is resolved, else why not.
std::string load_verbs() {
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) return std::string("libibverbs could not be loaded (") + dlerror() + "): no RDMA here";
  std::string missing;
  resolve_symbol(lib, "ibv_get_device_list", &verbs.get_device_list, &missing);
  resolve_symbol(lib, "ibv_free_device_list", &verbs.free_device_list, &missing);
  resolve_symbol(lib, "ibv_get_device_name", &verbs.get_device_name, &missing);
  resolve_symbol(lib, "ibv_open_device", &verbs.open_device, &missing);
  resolve_symbol(lib, "ibv_close_device", &verbs.close_device, &missing);
  resolve_symbol(lib, "ibv_alloc_pd", &verbs.alloc_pd, &missing);
  resolve_symbol(lib, "ibv_dealloc_pd", &verbs.dealloc_pd, &missing);
  resolve_symbol(lib, "ibv_query_port", &verbs.query_port, &missing);
  resolve_symbol(lib, "ibv_query_gid", &verbs.query_gid, &missing);
  resolve_symbol(lib, "ibv_reg_mr", &verbs.reg_mr, &missing);
  resolve_symbol(lib, "ibv_dereg_mr", &verbs.dereg_mr, &missing);
  resolve_symbol(lib, "ibv_create_cq", &verbs.create_cq, &missing);
  resolve_symbol(lib, "ibv_destroy_cq", &verbs.destroy_cq, &missing);
  resolve_symbol(lib, "ibv_create_qp", &verbs.create_qp, &missing);
  resolve_symbol(lib, "ibv_destroy_qp", &verbs.destroy_qp, &missing);
  resolve_symbol(lib, "ibv_modify_qp", &verbs.modify_qp, &missing);
  resolve_symbol(lib, "ibv_wc_status_str", &verbs.wc_status_str, &missing);
  if (!missing.empty()) return "this libibverbs lacks " + missing;
  verbs.reg_dmabuf_mr = reinterpret_cast<decltype(verbs.reg_dmabuf_mr)>(dlsym(lib, "ibv_reg_dmabuf_mr"));
  return "";
}

int query_port(ibv_context* ctx, ibv_port_attr* attr) {
  std::memset(attr, 0, sizeof *attr);
  return verbs.query_port(ctx, 1, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

class IbverbsNic : public RdmaNic, public std::enable_shared_from_this<IbverbsNic> {
 public:
  // The device opened with a protection domain and port 1 active; nullptr and *why otherwise.
  static std::shared_ptr<IbverbsNic> open(ibv_device* dev, std::string* why) {
    auto nic = std::shared_ptr<IbverbsNic>(new IbverbsNic(verbs.get_device_name(dev)));
    if (!(nic->ctx_ = verbs.open_device(dev))) return *why = failed("ibv_open_device"), nullptr;
    if (!(nic->pd_ = verbs.alloc_pd(nic->ctx_))) return *why = failed("ibv_alloc_pd"), nullptr;
    if (query_port(nic->ctx_, &nic->port_) != 0) return *why = failed("ibv_query_port"), nullptr;
    if (nic->port_.state != IBV_PORT_ACTIVE)
      return *why = "port 1 is not active (state " + std::to_string(nic->port_.state) + ")", nullptr;
    if (nic->port_.lid == 0) {  // RoCE: addressed by GID
      ibv_gid gid{};
      if (verbs.query_gid(nic->ctx_, 1, 0, &gid) != 0) return *why = failed("ibv_query_gid"), nullptr;
      nic->gid_hex_ = to_hex(std::string(reinterpret_cast<const char*>(gid.raw), sizeof gid.raw));
    }
    return nic;
  }
  ~IbverbsNic() override {
    if (pd_) verbs.dealloc_pd(pd_);
    if (ctx_) verbs.close_device(ctx_);
  }
  std::string device() const override { return name_; }

  RegionPtr register_memory(char* addr, size_t size, bool remote_access, bool writable, std::string* why) override {
    int access = IBV_ACCESS_LOCAL_WRITE;
    if (remote_access) access |= IBV_ACCESS_REMOTE_READ | (writable ? IBV_ACCESS_REMOTE_WRITE : 0);
    errno = 0;
    ibv_mr* mr = verbs.reg_mr(pd_, addr, size, access);
    if (!mr) return *why = failed("registering memory (ibv_reg_mr)"), nullptr;
    auto self = shared_from_this();  // the domain outlives its regions
    return RegionPtr(new Region{addr, size, mr->lkey, mr->rkey}, [mr, self](const Region* r) {
      verbs.dereg_mr(mr);
      delete r;
    });
  }

  RegionPtr register_dmabuf(int fd, uint64_t offset, size_t size, uint64_t iova, bool remote_access, bool writable,
                            std::string* why) override {
    int access = IBV_ACCESS_LOCAL_WRITE;
    if (remote_access) access |= IBV_ACCESS_REMOTE_READ | (writable ? IBV_ACCESS_REMOTE_WRITE : 0);
    if (!verbs.reg_dmabuf_mr) return *why = "this libibverbs has no ibv_reg_dmabuf_mr (older than rdma-core 34)", nullptr;
    errno = 0;
    ibv_mr* mr = verbs.reg_dmabuf_mr(pd_, offset, size, iova, fd, access);
    if (!mr) return *why = failed("registering device memory (ibv_reg_dmabuf_mr)"), nullptr;
    auto self = shared_from_this();
    return RegionPtr(new Region{reinterpret_cast<char*>(iova), size, mr->lkey, mr->rkey}, [mr, self](const Region* r) {
      verbs.dereg_mr(mr);
      delete r;
    });
  }

  std::unique_ptr<Link> open_link(std::string* why) override;

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_port_attr port_{};
  std::string gid_hex_;

 private:
  explicit IbverbsNic(std::string name) : name_(std::move(name)) {}
  std::string name_;
};

class IbverbsLink : public RdmaNic::Link {
 public:
  explicit IbverbsLink(std::shared_ptr<IbverbsNic> nic) : nic_(std::move(nic)) {}
  ~IbverbsLink() override {
    if (qp_) verbs.destroy_qp(qp_);
    if (cq_) verbs.destroy_cq(cq_);
  }
  std::string create() {
    if (!(cq_ = verbs.create_cq(nic_->ctx_, 16, nullptr, nullptr, 0))) return failed("ibv_create_cq");
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 4;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    if (!(qp_ = verbs.create_qp(nic_->pd_, &init))) return failed("ibv_create_qp");
    std::string r = random_bytes(3);  // a 24-bit starting packet sequence number
    psn_ = (uint32_t(uint8_t(r[0])) << 16) | (uint32_t(uint8_t(r[1])) << 8) | uint8_t(r[2]);
    return "";
  }
  RdmaAddress address() const override {
    return RdmaAddress{qp_->qp_num, psn_, nic_->port_.lid, nic_->gid_hex_, static_cast<uint32_t>(nic_->port_.active_mtu)};
  }
  bool connected() const override { return peer_qpn_ != 0; }
  uint32_t peer_qpn() const override { return peer_qpn_; }
  std::string connect(const RdmaAddress& peer) override;
  RdmaResult transfer(bool write, char* local, const RdmaNic::Region& region, uint64_t remote, uint32_t rkey, size_t n,
                      const std::function<bool()>& keep_going) override;

 private:
  // Polls for the one outstanding work request's completion (0 none yet, 1 got, -1 error).
  int poll(ibv_wc* wc) { return ibv_poll_cq(cq_, 1, wc); }
  RdmaResult abort_outstanding();
  std::shared_ptr<IbverbsNic> nic_;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0, peer_qpn_ = 0;
  std::mutex mu_;  // one transfer at a time
  bool broken_ = false;
  uint64_t next_wr_ = 1;
};

std::unique_ptr<RdmaNic::Link> IbverbsNic::open_link(std::string* why) {
  auto link = std::make_unique<IbverbsLink>(shared_from_this());
  if (std::string bad = link->create(); !bad.empty()) return *why = bad, nullptr;
  return link;
}

// The queue pair to INIT, RTR (connected to the peer's) and RTS.
std::string IbverbsLink::connect(const RdmaAddress& peer) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE;
  if (verbs.modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
    return failed("moving the queue pair to INIT");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<uint32_t>(peer.mtu, nic_->port_.active_mtu));
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = static_cast<uint16_t>(peer.lid);
  a.ah_attr.port_num = 1;
  if (!peer.gid.empty()) {
    std::string raw;
    from_hex(peer.gid, &raw);
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, raw.data(), sizeof a.ah_attr.grh.dgid.raw);
    a.ah_attr.grh.hop_limit = 64;
  }
  if (verbs.modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
    return failed("moving the queue pair to RTR (connected to its peer)");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;  // 4.096 us * 2^14 = 67 ms a try, 7 tries: an unreachable peer fails in ~0.5 s
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = psn_;
  a.max_rd_atomic = 1;
  if (verbs.modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                 IBV_QP_MAX_QP_RD_ATOMIC) != 0)
    return failed("moving the queue pair to RTS");
  peer_qpn_ = peer.qpn;
  return "";
}

RdmaResult IbverbsLink::transfer(bool write, char* local, const RdmaNic::Region& region, uint64_t remote,
                                 uint32_t rkey, size_t n, const std::function<bool()>& keep_going) {
  std::lock_guard<std::mutex> g(mu_);
  if (broken_) return {RdmaResult::Status::failed, "the RDMA connection broke in an earlier transfer"};
  ibv_sge sge{reinterpret_cast<uint64_t>(local), static_cast<uint32_t>(n), region.lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = next_wr_++;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  if (ibv_post_send(qp_, &wr, &bad) != 0) {
    broken_ = true;
    return {RdmaResult::Status::failed, failed("ibv_post_send")};
  }
  ibv_wc wc{};
  auto next_look = std::chrono::steady_clock::now();
  int got = 0;
  while ((got = poll(&wc)) == 0) {
    if (std::chrono::steady_clock::now() >= next_look) {
      if (!keep_going()) return abort_outstanding();
      next_look = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (got < 0 || wc.status != IBV_WC_SUCCESS) {
    broken_ = true;
    return {RdmaResult::Status::failed,
            std::string("the RDMA ") + (write ? "write" : "read") + " failed: " +
                (got < 0 ? "ibv_poll_cq failed" : verbs.wc_status_str(wc.status))};
  }
  return {};
}

// The queue pair to ERROR: its outstanding work completes flushed, after which the NIC touches
// no memory of it. Waited for (5 s at most: a NIC that flushes nothing is past helping).
RdmaResult IbverbsLink::abort_outstanding() {
  broken_ = true;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  verbs.modify_qp(qp_, &a, IBV_QP_STATE);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  ibv_wc wc{};
  while (poll(&wc) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  return {RdmaResult::Status::aborted, "the transfer was stopped"};
}

constexpr size_t kProbeBytes = 4096;

// "" when the device carried a loopback RDMA write through the NIC's own path, else the step
// that failed.
std::string try_device(ibv_device* dev) {
  std::string why;
  auto nic = IbverbsNic::open(dev, &why);
  if (!nic) return why;
  std::vector<char> src(kProbeBytes), dst(kProbeBytes);
  for (size_t i = 0; i < kProbeBytes; ++i) src[i] = static_cast<char>(i * 7 + 3);
  auto src_mr = nic->register_memory(src.data(), src.size(), false, false, &why);
  auto dst_mr = src_mr ? nic->register_memory(dst.data(), dst.size(), true, true, &why) : nullptr;
  if (!dst_mr) return why;
  auto link = nic->open_link(&why);
  if (!link) return why;
  if (why = link->connect(link->address()); !why.empty()) return why;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  auto r = link->transfer(true, src.data(), *src_mr, reinterpret_cast<uint64_t>(dst.data()), dst_mr->rkey,
                          kProbeBytes, [&] { return std::chrono::steady_clock::now() < deadline; });
  if (r.status == RdmaResult::Status::aborted) return "the loopback RDMA write did not complete within 1 s";
  if (!r) return "the loopback " + r.why;
  if (src != dst) return "the loopback RDMA write completed but the bytes did not arrive";
  return "";
}

IbverbsProbe run_probe() {
  IbverbsProbe out;
  if (out.why = load_verbs(); !out.why.empty()) return out;
  int n = 0;
  errno = 0;
  ibv_device** list = verbs.get_device_list(&n);
  if (!list) {
    out.why = "no RDMA device (ibv_get_device_list: " + std::string(std::strerror(errno ? errno : ENODEV)) + ")";
    return out;
  }
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> hold(list, verbs.free_device_list);
  if (n == 0) {
    out.why = "no RDMA device (ibv_get_device_list lists none)";
    return out;
  }
  for (int i = 0; i < n; ++i) {
    const std::string name = verbs.get_device_name(list[i]);
    out.listed.push_back(name);
    const std::string why = try_device(list[i]);
    if (why.empty()) {
      out.usable = true;
      out.device = name;
      out.why.clear();
      return out;
    }
    out.why += (out.why.empty() ? "" : "; ") + name + ": " + why;
  }
  return out;
}

std::shared_ptr<RdmaNic> open_device(const std::string& name, std::string* why) {
  int n = 0;
  ibv_device** list = verbs.get_device_list(&n);
  if (!list) return *why = "the RDMA device list is gone", nullptr;
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> hold(list, verbs.free_device_list);
  for (int i = 0; i < n; ++i)
    if (name == verbs.get_device_name(list[i])) return IbverbsNic::open(list[i], why);
  return *why = "the RDMA device " + name + " is no longer listed", nullptr;
}
}  // namespace
#endif

const IbverbsProbe& probe_ibverbs() {
  static const IbverbsProbe probe = [] {
    IbverbsProbe p;
    if (env_str("XMESH_IBVERBS") == "0") {
      p.why = "XMESH_IBVERBS=0: not probed";
      return p;
    }
#ifdef XMESH_HAVE_IBVERBS
    return run_probe();
#else
    p.why = "this build of xmesh has no libibverbs (its headers were missing when it was built)";
    return p;
#endif
  }();
  return probe;
}

std::shared_ptr<RdmaNic> open_ibverbs_nic(std::string* why) {
  const auto& probe = probe_ibverbs();
  if (!probe.usable) return *why = probe.why, nullptr;
#ifdef XMESH_HAVE_IBVERBS
  return open_device(probe.device, why);
#else
  return nullptr;
#endif
}

}  // namespace xmesh
