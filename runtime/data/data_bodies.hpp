// The bodies of the data plane's messages (data/): leases on a buffer's ranges, their answers and ends.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bodies.hpp"
#include "wire.hpp"

namespace xmesh {

// BufferLease (-> an RDMA buffer's owner; the data plane, buffer_registry.hpp): a lease on
// [offset, offset + size) of buffer `buffer`, for reading it or (write) writing into it.
// Answered with a BufferLeaseReply, or a Buffer error saying why not.
// The reader says its host (util.hpp host_key): another host's (or stream: the reader asks for
// it) gets a stream grant (buffer_stream.hpp), a reader of the owner's host the pid and address.
// Small ranges (at most kInlineBytes) from another host travel in the messages themselves:
// a read's answer carries the bytes (inline: the reader takes them so), a write's request
// carries them in its one frame (inline), and no lease outlives the exchange.
// (Well under a shared-memory ring's size: the owner answers on its reading thread, which
// never waits for room, and a message larger than the ring never fits it.)
constexpr uint64_t kInlineBytes = 64 << 10;
struct BufferLeaseBody {
  static constexpr const char* what = "BufferLease";
  static constexpr Kind kind = Kind::BufferLease;  // the message it is the body of
  uint64_t buffer = 0, offset = 0, size = 0;
  bool write = false;
  std::string host;
  bool stream = false;
  bool inline_ = false;
  std::string rdma;  // the reader's RDMA address for its link to this owner (rdma_nic.hpp), or ""
  template <class F>
  static void fields(F&& f) {
    f("buffer", &BufferLeaseBody::buffer, Need::Required);
    f("offset", &BufferLeaseBody::offset, Need::Optional);
    f("size", &BufferLeaseBody::size, Need::Required);
    f("write", &BufferLeaseBody::write, Need::Optional);
    f("host", &BufferLeaseBody::host, Need::Optional);
    f("stream", &BufferLeaseBody::stream, Need::Optional);
    f("inline", &BufferLeaseBody::inline_, Need::Optional);
    f("rdma", &BufferLeaseBody::rdma, Need::Optional);
  }
};
XMESH_BODY_JSON(BufferLeaseBody)

// Where a leased range is: the owner's host (util.hpp host_key: a reader with the same key
// copies by pid), pid and the range's address there, and the lease's number (for BufferRelease);
// for a stream, the owner's stream listener ("tcp://host:port"), the grant's token and key (hex)
// and the cipher its records are sealed with. A reader that offered an RDMA address gets the
// owner's link's address and the buffer's rkey (addr is then where the range starts for RDMA),
// or why not (rdma_why: the reader streams).
struct BufferLeaseReply {
  static constexpr const char* what = "BufferLease reply";
  int64_t pid = 0;
  uint64_t addr = 0, lease = 0, rkey = 0;
  std::string host, stream, token, key, cipher, rdma, rdma_why;
  bool inline_ = false;  // the bytes are done: read, in the answer's frame; written, in place
  // The buffer is device memory, the range staged in host memory: a write's release must say
  // it is complete and wait for its answer (the bytes reach the device then).
  bool device = false;
  // The range is device memory the owner's NIC reaches itself (dma-buf): RDMA only, no stream
  // grant (a reader whose RDMA fails ends the lease and asks again without offering RDMA).
  bool direct = false;
  template <class F>
  static void fields(F&& f) {
    f("pid", &BufferLeaseReply::pid, Need::Required);
    f("addr", &BufferLeaseReply::addr, Need::Required);
    f("lease", &BufferLeaseReply::lease, Need::Required);
    f("host", &BufferLeaseReply::host, Need::Optional);
    f("stream", &BufferLeaseReply::stream, Need::Optional);
    f("token", &BufferLeaseReply::token, Need::Optional);
    f("key", &BufferLeaseReply::key, Need::Optional);
    f("cipher", &BufferLeaseReply::cipher, Need::Optional);
    f("inline", &BufferLeaseReply::inline_, Need::Optional);
    f("rdma", &BufferLeaseReply::rdma, Need::Optional);
    f("rkey", &BufferLeaseReply::rkey, Need::Optional);
    f("rdma_why", &BufferLeaseReply::rdma_why, Need::Optional);
    f("device", &BufferLeaseReply::device, Need::Optional);
    f("direct", &BufferLeaseReply::direct, Need::Optional);
  }
};
XMESH_BODY_JSON(BufferLeaseReply)

// BufferRelease (-> the owner): the lease ended; complete: a write's bytes all arrived (a
// device buffer's staged bytes are then copied in, answered when asked with a reply).
// BufferDrop (-> the owner): lend the buffer no more (lease 0), answered with the leases that
// still hold it.
struct BufferReleaseBody {
  static constexpr const char* what = "BufferRelease";
  uint64_t buffer = 0, lease = 0;
  bool complete = false;
  template <class F>
  static void fields(F&& f) {
    f("buffer", &BufferReleaseBody::buffer, Need::Required);
    f("lease", &BufferReleaseBody::lease, Need::Optional);
    f("complete", &BufferReleaseBody::complete, Need::Optional);
  }
};
XMESH_BODY_JSON(BufferReleaseBody)

}  // namespace xmesh
