// libFuzzer target: what a node does with one frame's bytes from a peer. Both header decoders
// must accept or refuse alike without crashing, an accepted header must survive re-encoding,
// and every typed body must read or be refused (naming why) from whatever body decoded.
#include <cstdint>
#include <string>

#include "agent_bodies.hpp"
#include "bodies.hpp"
#include "cast_bodies.hpp"
#include "data_bodies.hpp"
#include "debug_bodies.hpp"
#include "link_bodies.hpp"
#include "node_bodies.hpp"
#include "output_bodies.hpp"
#include "sync_bodies.hpp"
#include "cast_tree.hpp"
#include "wire.hpp"

using namespace xmesh;

namespace {
template <class... Body>
void read_every_body(const json& body) {
  std::string why;
  ((void)read_as<Body>(body, &why), ...);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string error, general_error;
  auto h = decode_header(data, size, error);
  auto g = decode_header_general(data, size, general_error);
  if (h.has_value() != g.has_value()) __builtin_trap();  // the fast path and the general disagree
  if (!h) return 0;
  auto bytes = encode_header(*h);
  auto again = decode_header(bytes.data(), bytes.size(), error);
  if (!again || encode_header(*again) != bytes) __builtin_trap();  // not stable under re-encoding
  read_every_body<HelloBody, ErrorBody, ProcExitedBody, LogBody, CancelBody, ConfigureBody, AdoptBody,
                  PeerDeadBody, ReloadBody, SpawnRank, SpawnProcsBody, ProcEntry, SpawnProcsReply, StopProcsBody,
                  StopProcsReply, AttachBody, PreviousOwner, AttachReply, AllocationStatus, PortCounts, StatusReply, BufferLeaseBody, BufferLeaseReply, BufferReleaseBody,
                  SpawnActorBody, ActorRecord, RefuseBody, ReloadReply, ProcInfoBody, ProcInfoReply,
                  DumpStacksReply, FlushOutputReply, DebugEventBody, DebugCommandBody, SyncStepBody, SyncReply,
                  RankMeta, AllocationMeta, RingOfferBody, RingAcceptBody, LaneOfferBody, CastTarget, CastBody, ReplyEntry,
                  RepliesBody, CastLostBody>(h->body);
  if (h->body.is_object() && h->body.contains("cast")) read_as<CastBody>(h->body["cast"]);
  Message m;
  m.header = *h;
  std::string origin, why;
  read_replies(m, &origin, &why);  // a Replies body that miscounts its frames is refused, never read past
  return 0;
}
