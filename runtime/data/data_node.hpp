// DataNode: the data plane's part of a Node (a NodePart), the owner's side of every transfer:
// the memory this process lends as RDMA buffers (buffer_registry.hpp) and the answers to peers'
// BufferLease, BufferRelease and BufferDrop, given on the node's reading thread, never an
// actor's; the stream listener that serves the bytes to readers on other hosts
// (buffer_stream.hpp); the process's RDMA NIC (rdma_nic.hpp), shared with its DataPlane (the
// moving side, data_plane.hpp), and the NIC's link to each reader that offered its address.
// The node knows none of this: it dispatches the three kinds here and says when a peer died.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "buffer_registry.hpp"
#include "buffer_stream.hpp"
#include "node.hpp"
#include "rdma_nic.hpp"
#include "data_bodies.hpp"

namespace xmesh {

struct BufferLeaseBody;

class DataNode : public NodePart {
 public:
  // Adds the data plane's part to node, before node.start(): its handlers and this part.
  static DataNode& attach(Node& node);
  // node's part; std::logic_error when none was attached.
  static DataNode& of(Node& node);

  explicit DataNode(Node& node);
  DataNode(const DataNode&) = delete;
  DataNode& operator=(const DataNode&) = delete;

  // The memory this process lends as RDMA buffers.
  BufferRegistry& buffers() { return buffers_; }
  // The RDMA NIC through which peers on other hosts reach this process's buffers and its data
  // plane reaches theirs, made by the injected source at first need (the Python module gives
  // the ibverbs one; tests a simulated one). No source, or the source's nullptr: none (*why
  // says why), and the data plane streams.
  using RdmaNicSource = std::function<std::shared_ptr<RdmaNic>(std::string* why)>;
  void set_rdma_nic_source(RdmaNicSource source);
  std::shared_ptr<RdmaNic> rdma_nic(std::string* why = nullptr);
  size_t rdma_links() const;  // the links peers' readers have to this process's buffers

  // A reader that died mid-copy: its leases end (a dropped buffer may go), its link goes.
  void peer_dead(const std::string& addr) override;

 private:
  void on_buffer_lease(Message& m);
  void on_buffer_release(Message& m);
  void on_buffer_drop(Message& m);
  // A small lease from another host answered with its bytes (a read) or done in place (a write).
  void answer_in_messages(Message& m, const BufferLeaseBody& b, const BufferRegistry::Lease& lease);
  // Where the stream listener is reached ("" and *why when it cannot start).
  std::string buffer_streams(std::string* why);
  // For a reader elsewhere that offered its RDMA address: the owner's link to it and the
  // buffer's registration (its rkey), or why not (the reader streams).
  struct RdmaOffer {
    std::shared_ptr<RdmaNic::Link> link;
    RdmaNic::RegionPtr region;
    std::string why;
  };
  RdmaOffer prepare_rdma(const std::string& holder, const BufferLeaseBody& b);
  // The link to `holder`, connected to its address (a new one when the holder's changed).
  std::shared_ptr<RdmaNic::Link> rdma_link_for(const std::string& holder, const RdmaAddress& peer, std::string* why);

  Node& node_;
  BufferRegistry buffers_;
  // The stream listener of the buffers' bytes for readers on other hosts, started at the first
  // lease that needs it; why it could not start, once it failed.
  std::mutex streams_mu_;
  std::unique_ptr<BufferStreamServer> streams_;
  std::string streams_bound_;  // the TCP address the listener was placed beside ("": none)
  std::vector<std::unique_ptr<BufferStreamServer>> old_streams_;  // placed before the node listened on TCP
  std::unique_ptr<BufferStreamServer> adopting_;  // the streams that come to the lane listener
  // The RDMA NIC (made once) and, per reader that offered its RDMA address, this process's link
  // to it (replaced when the reader offers a new one; gone with the reader).
  mutable std::mutex rdma_mu_;
  RdmaNicSource rdma_source_;
  bool rdma_made_ = false;
  std::shared_ptr<RdmaNic> rdma_nic_;
  std::string rdma_why_;
  std::unordered_map<std::string, std::shared_ptr<RdmaNic::Link>> rdma_links_;
};

}  // namespace xmesh
