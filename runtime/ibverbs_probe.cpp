#include "ibverbs_probe.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "util.hpp"

#ifdef XMESH_HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif

namespace xmesh {

#ifdef XMESH_HAVE_IBVERBS
namespace {
constexpr size_t kProbeBytes = 4096;

std::string failed(const char* step) { return std::string(step) + " failed: " + std::strerror(errno); }

// The verbs objects of one device's probe, released in reverse order however far it got.
struct Verbs {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* src_mr = nullptr;
  ibv_mr* dst_mr = nullptr;
  std::vector<char> src = std::vector<char>(kProbeBytes), dst = std::vector<char>(kProbeBytes);
  ~Verbs() {
    if (qp) ibv_destroy_qp(qp);
    if (cq) ibv_destroy_cq(cq);
    if (src_mr) ibv_dereg_mr(src_mr);
    if (dst_mr) ibv_dereg_mr(dst_mr);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
};

// The queue pair to INIT, RTR (connected to itself) and RTS; "" or the step that failed.
std::string connect_to_itself(Verbs& v) {
  ibv_port_attr port{};
  if (ibv_query_port(v.ctx, 1, &port) != 0) return failed("ibv_query_port");
  if (port.state != IBV_PORT_ACTIVE) return "port 1 is not active (state " + std::to_string(port.state) + ")";
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(v.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
    return failed("moving the queue pair to INIT");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = port.active_mtu;
  a.dest_qp_num = v.qp->qp_num;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = port.lid;
  a.ah_attr.port_num = 1;
  if (port.lid == 0) {  // RoCE: addressed by GID
    ibv_gid gid{};
    if (ibv_query_gid(v.ctx, 1, 0, &gid) != 0) return failed("ibv_query_gid");
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.hop_limit = 1;
  }
  if (ibv_modify_qp(v.qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
    return failed("moving the queue pair to RTR (connected to itself)");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(v.qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC) != 0)
    return failed("moving the queue pair to RTS");
  return "";
}

// One RDMA write of the probe's bytes and its completion (1 s at most); "" or why not.
std::string write_through(Verbs& v) {
  for (size_t i = 0; i < kProbeBytes; ++i) v.src[i] = static_cast<char>(i * 7 + 3);
  ibv_sge sge{reinterpret_cast<uint64_t>(v.src.data()), static_cast<uint32_t>(kProbeBytes), v.src_mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 1;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(v.dst.data());
  wr.wr.rdma.rkey = v.dst_mr->rkey;
  if (ibv_post_send(v.qp, &wr, &bad) != 0) return failed("ibv_post_send");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  ibv_wc wc{};
  int n = 0;
  while ((n = ibv_poll_cq(v.cq, 1, &wc)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  if (n < 0) return "ibv_poll_cq failed";
  if (n == 0) return "the loopback RDMA write did not complete within 1 s";
  if (wc.status != IBV_WC_SUCCESS) return std::string("the loopback RDMA write failed: ") + ibv_wc_status_str(wc.status);
  if (v.src != v.dst) return "the loopback RDMA write completed but the bytes did not arrive";
  return "";
}

// "" when the device carried the loopback transfer, else the step that failed.
std::string try_device(ibv_device* dev) {
  Verbs v;
  if (!(v.ctx = ibv_open_device(dev))) return failed("ibv_open_device");
  if (!(v.pd = ibv_alloc_pd(v.ctx))) return failed("ibv_alloc_pd");
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (!(v.src_mr = ibv_reg_mr(v.pd, v.src.data(), kProbeBytes, access))) return failed("registering memory (ibv_reg_mr)");
  if (!(v.dst_mr = ibv_reg_mr(v.pd, v.dst.data(), kProbeBytes, access))) return failed("registering memory (ibv_reg_mr)");
  if (!(v.cq = ibv_create_cq(v.ctx, 4, nullptr, nullptr, 0))) return failed("ibv_create_cq");
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = v.cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = init.cap.max_recv_wr = 4;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  if (!(v.qp = ibv_create_qp(v.pd, &init))) return failed("ibv_create_qp");
  std::string why = connect_to_itself(v);
  return why.empty() ? write_through(v) : why;
}

IbverbsProbe run_probe() {
  IbverbsProbe out;
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    out.why = "no RDMA device (ibv_get_device_list: " + std::string(std::strerror(errno ? errno : ENODEV)) + ")";
    return out;
  }
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> hold(list, ibv_free_device_list);
  if (n == 0) {
    out.why = "no RDMA device (ibv_get_device_list lists none)";
    return out;
  }
  for (int i = 0; i < n; ++i) {
    const std::string name = ibv_get_device_name(list[i]);
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

}  // namespace xmesh
