#include "data_node.hpp"

#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "bodies.hpp"
#include "data_bodies.hpp"
#include "record_cipher.hpp"
#include "tcp_endpoint.hpp"
#include "unique_fd.hpp"
#include "util.hpp"

namespace xmesh {

DataNode& DataNode::attach(Node& node) {
  return node.attach_part<DataNode>([&node](DataNode& data) {
    node.on(Kind::BufferLease, [&data](Message& m) { data.on_buffer_lease(m); });
    node.on(Kind::BufferDrop, [&data](Message& m) { data.on_buffer_drop(m); });
    node.on(Kind::BufferRelease, [&data](Message& m) { data.on_buffer_release(m); });
  });
}

DataNode& DataNode::of(Node& node) { return node.required_part<DataNode>("data plane", "DataNode::attach it"); }

DataNode::DataNode(Node& node) : node_(node) {}

void DataNode::peer_dead(const std::string& addr) {
  buffers_.release_holder(addr);
  std::lock_guard<std::mutex> g(rdma_mu_);
  rdma_links_.erase(addr);
}

void DataNode::on_buffer_lease(Message& m) {
  BufferLeaseBody b;
  if (!node_.request_body(m, b, ErrorKind::Buffer)) return;
  std::string why;
  // A reader elsewhere (or one that may not read this process's memory) gets the bytes streamed.
  const bool stream = b.stream || (!b.host.empty() && b.host != host_key());
  std::string listener;
  if (stream && (listener = buffer_streams(&why)).empty()) {
    node_.reply(m, false, error_body(ErrorKind::Buffer, "the owner cannot stream its buffers: " + why), {});
    return;
  }
  // Small and from elsewhere: the bytes in the messages (the control link seals them), no stream.
  const bool in_messages = b.inline_ && stream && b.size <= kInlineBytes;
  if (in_messages && b.write && (m.frames.size() != 1 || m.frames[0].size() != b.size)) {
    node_.reply(m, false, error_body(ErrorKind::Buffer, "malformed BufferLease request: a write of " +
                                   std::to_string(b.size) + " bytes in the messages must carry them in one frame"), {});
    return;
  }
  // RDMA for a reader elsewhere that offered its address: the link to it and the buffer's
  // registration, made before the lease: a device buffer the NIC reaches itself (dma-buf) is
  // then leased direct, neither staged nor granted to streams.
  RdmaOffer offer;
  if (stream && !in_messages && !b.rdma.empty()) offer = prepare_rdma(m.sender_addr, b);
  const bool direct = offer.link && buffers_.on_device(b.buffer);
  auto lease = buffers_.lease(b.buffer, b.offset, b.size, b.write, m.sender_addr, &why, stream && !in_messages && !direct,
                              direct);
  if (!lease.id) {
    node_.reply(m, false, error_body(ErrorKind::Buffer, why), {});
    return;
  }
  if (in_messages) {
    answer_in_messages(m, b, lease);
    return;
  }
  BufferLeaseReply r;
  r.pid = static_cast<int64_t>(getpid());
  r.addr = reinterpret_cast<uint64_t>(lease.addr);
  r.lease = lease.number;
  r.host = host_key();
  r.device = lease.staged;
  r.direct = direct;
  if (stream && !direct) {
    r.stream = listener;
    r.token = to_hex(lease.token);
    r.key = to_hex(lease.key);
    r.cipher = record_cipher_name(preferred_record_cipher());
  }
  if (offer.link) {
    r.rdma = offer.link->address().to_string();
    r.rkey = offer.region->rkey;
  } else {
    r.rdma_why = offer.why;
  }
  if (m.header.corr) {
    node_.reply(m, true, r, {});
  } else {
    buffers_.release(b.buffer, lease.number, m.sender_addr);  // nobody to tell where: no lease
  }
}

void DataNode::set_rdma_nic_source(RdmaNicSource source) {
  std::lock_guard<std::mutex> g(rdma_mu_);
  rdma_source_ = std::move(source);
  rdma_made_ = false;
  rdma_nic_.reset();
  rdma_links_.clear();
}

std::shared_ptr<RdmaNic> DataNode::rdma_nic(std::string* why) {
  std::lock_guard<std::mutex> g(rdma_mu_);
  if (!rdma_made_) {
    rdma_made_ = true;
    if (rdma_source_) rdma_nic_ = rdma_source_(&rdma_why_);
    if (!rdma_nic_ && rdma_why_.empty()) rdma_why_ = "no RDMA NIC was given to this process";
  }
  if (!rdma_nic_ && why) *why = rdma_why_;
  return rdma_nic_;
}

size_t DataNode::rdma_links() const {
  std::lock_guard<std::mutex> g(rdma_mu_);
  return rdma_links_.size();
}

DataNode::RdmaOffer DataNode::prepare_rdma(const std::string& holder, const BufferLeaseBody& b) {
  RdmaOffer offer;
  std::string why;
  RdmaAddress peer;
  auto nic = rdma_nic(&why);
  if (!nic) return offer.why = "the owner has no working RDMA device: " + why, offer;
  if (!RdmaAddress::parse(b.rdma, &peer, &why)) return offer.why = why, offer;
  auto region = buffers_.registration(b.buffer, [&](char* addr, size_t size, bool writable, DeviceMemory* device,
                                                   std::string* failed) -> RdmaNic::RegionPtr {
    if (!device) return nic->register_memory(addr, size, true, writable, failed);
    uint64_t offset = 0;  // device memory: registered through a dma-buf of it, or staged
    unique_fd fd(device->dmabuf(addr, size, &offset, failed));
    if (!fd) return nullptr;
    return nic->register_dmabuf(fd.get(), offset, size, reinterpret_cast<uint64_t>(addr), true, writable, failed);
  }, &why);
  if (!region) return offer.why = "the owner could not register the buffer's memory for RDMA: " + why, offer;
  auto link = rdma_link_for(holder, peer, &why);
  if (!link) return offer.why = "the owner could not connect to the reader: " + why, offer;
  offer.link = link;
  offer.region = region;
  return offer;
}

std::shared_ptr<RdmaNic::Link> DataNode::rdma_link_for(const std::string& holder, const RdmaAddress& peer, std::string* why) {
  std::lock_guard<std::mutex> g(rdma_mu_);
  auto& link = rdma_links_[holder];
  if (link && link->peer_qpn() == peer.qpn) return link;
  std::shared_ptr<RdmaNic::Link> fresh = rdma_nic_->open_link(why);
  if (fresh) {
    if (std::string bad = fresh->connect(peer); !bad.empty()) {
      *why = bad;
      fresh.reset();
    }
  }
  if (fresh)
    link = fresh;
  else
    rdma_links_.erase(holder);
  return fresh;
}

void DataNode::answer_in_messages(Message& m, const BufferLeaseBody& b, const BufferRegistry::Lease& lease) {
  std::vector<zmq::message_t> frames;
  std::string failed;
  if (b.write) {
    std::memcpy(lease.addr, m.frames[0].data(), lease.size);
    failed = buffers_.land(lease.id, lease.number, m.sender_addr);  // a device buffer's: copied in
  } else {
    frames.emplace_back(lease.addr, lease.size);  // a copy, made before the lease ends
  }
  buffers_.release(lease.id, lease.number, m.sender_addr);
  if (!failed.empty()) {
    node_.reply(m, false, error_body(ErrorKind::Buffer, failed), {});
    return;
  }
  BufferLeaseReply r;
  r.pid = static_cast<int64_t>(getpid());
  r.host = host_key();
  r.inline_ = true;
  try {
    node_.reply(m, true, r, std::move(frames));
  } catch (const SendError& e) {  // this thread does not wait for room: say so, small
    node_.reply(m, false, error_body(ErrorKind::Send, std::string("the owner could not send the bytes: ") + e.what()), {});
  }
}

std::string DataNode::buffer_streams(std::string* why) {
  std::lock_guard<std::mutex> g(streams_mu_);
  // Where the node has a lane listener, streams come to it (no port of their own: a proc behind
  // its agent's one port is reached through the agent like its lanes) and are handed over here.
  if (const std::string lanes = node_.transport().lane_endpoint(); !lanes.empty()) {
    // A controller nobody can connect to: its readers stream over connections it opened for them.
    const std::string where = node_.transport().reaches_back() ? kBackStreamPrefix + node_.transport().tcp_addr()
                                                               : lanes;
    if (!adopting_) {
      adopting_ = std::make_unique<BufferStreamServer>(buffers_);
      // Called by the I/O thread under the transport's lane lock: it takes no lock of the
      // node's. The server outlives the transport (a Node declares its parts before it).
      BufferStreamServer* server = adopting_.get();
      node_.transport().set_stream_adopter([server](unique_fd fd, std::string early) {
        server->adopt(std::move(fd), std::move(early));
      });
    }
    return where;
  }
  const std::string bound = node_.transport().tcp_bound_addr(), reached = node_.transport().tcp_addr();
  if (streams_ && streams_bound_ == bound) return streams_->address();
  // Beside the node's TCP address (bound there, reached as peers reach the node); a node with
  // none is reached by nobody off this host: loopback (the same-host fallback). One placed
  // before the node listened on TCP stays for the streams it serves; a new one goes beside it.
  if (streams_) old_streams_.push_back(std::move(streams_));
  std::string bind_host = "127.0.0.1", reach_host = bind_host;
  try {
    if (!bound.empty()) {
      const auto b = TcpEndpoint::parse(bound), r = TcpEndpoint::parse(reached.empty() ? bound : reached);
      bind_host = b.wildcard() ? (b.host.find(':') != std::string::npos ? "::" : "0.0.0.0") : b.host;
      reach_host = r.wildcard() ? numeric_host(hostname()) : r.host;
      // A proc behind its agent's one port listens on loopback, reached through the agent: its
      // streams listen on the host's address the agent is reached at (a port of their own).
      if (r.behind) bind_host = r.host;
    }
    streams_ = std::make_unique<BufferStreamServer>(buffers_, bind_host, reach_host);
    streams_bound_ = bound;
  } catch (const std::exception& e) {
    *why = e.what();
    return "";
  }
  return streams_->address();
}

void DataNode::on_buffer_release(Message& m) {
  BufferReleaseBody b;
  if (!node_.typed_body(m, b)) return;
  // A complete write into a device buffer: its staged bytes go to the device before the lease
  // ends, and the writer (waiting for this answer) learns whether they did.
  const std::string failed = b.complete ? buffers_.land(b.buffer, b.lease, m.sender_addr) : "";
  buffers_.release(b.buffer, b.lease, m.sender_addr);
  if (!m.header.corr) return;
  if (failed.empty())
    node_.reply(m, true, json(), {});
  else
    node_.reply(m, false, error_body(ErrorKind::Buffer, failed), {});
}

void DataNode::on_buffer_drop(Message& m) {
  BufferReleaseBody b;
  if (!node_.request_body(m, b, ErrorKind::Buffer)) return;
  const int left = buffers_.drop(b.buffer);
  if (left < 0) {
    node_.reply(m, false, error_body(ErrorKind::Buffer, "the buffer was dropped (or never lent by this process)"), {});
    return;
  }
  node_.reply(m, true, json{{"leases", left}}, {});
}

}  // namespace xmesh
