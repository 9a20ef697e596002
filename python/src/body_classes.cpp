// xmesh._core: the typed message bodies' classes (runtime/protocol/bodies.hpp,
// agent_bodies.hpp, link_bodies.hpp, node_bodies.hpp), each made from its body's own field list
// (body_bindings.hpp). Control messages only, never a call's path: this file compiles at -O1
// (python/CMakeLists.txt), which halves its compile (one per Python a wheel holds).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "agent_bodies.hpp"
#include "bodies.hpp"
#include "body_bindings.hpp"
#include "link_bodies.hpp"
#include "node_bodies.hpp"

using namespace xmesh;

// The typed message bodies (runtime/protocol/bodies.hpp), each a class made from its own field list
// (body_bindings.hpp); a received message reads its body with `msg.cancel()` and the like.
void bind_bodies(py::module_& m) {
  bind_body<ErrorBody>(m, "ErrorBody", "A failed reply's body, a supervision error, a Fault.");
  bind_body<ProcExitedBody>(m, "ProcExitedBody", "ProcExited: a proc ended.");
  bind_body<PeerDeadBody>(m, "PeerDeadBody", "PeerDead: a peer address died.");
  bind_body<CancelBody>(m, "CancelBody", "Cancel: cancel one target of a call.");
  bind_body<ConfigureBody>(m, "ConfigureBody", "Configure: settings for procs; only those given change.");
  bind_body<AdoptBody>(m, "AdoptBody", "Adopt: a controller adopts a proc.");
  bind_body<SpawnRank>(m, "SpawnRank", "One rank of a SpawnProcs request.");
  bind_body<SpawnProcsBody>(m, "SpawnProcsBody", "SpawnProcs: start an allocation's procs on a host.");
  bind_body<ProcEntry>(m, "ProcEntry", "A proc an agent started or runs.");
  bind_body<SpawnProcsReply>(m, "SpawnProcsReply", "What an agent started.");
  bind_body<StopProcsBody>(m, "StopProcsBody", "StopProcs: stop an allocation, by id or name.");
  bind_body<StopProcsReply>(m, "StopProcsReply", "Which allocation an agent stops.");
  bind_body<AttachBody>(m, "AttachBody", "Attach: take over (or observe) a live named allocation.");
  bind_body<PreviousOwner>(m, "PreviousOwner", "The controller that owned an allocation before.");
  bind_body<AttachReply>(m, "AttachReply", "What a controller needs to reach an attached allocation.");
  bind_body<AllocationStatus>(m, "AllocationStatus", "One allocation of an agent's Status.");
  bind_body<PortCounts>(m, "PortCounts", "What an agent's one TCP port did: connections relayed, lanes handed over, refused.");
  bind_body<StatusReply>(m, "StatusReply", "What an agent runs.");
  bind_body<CallBody>(m, "CallBody", "Call: the message's point when not the actor's own, and a port for the reply.");
  bind_body<SpawnActorBody>(m, "SpawnActorBody", "SpawnActor: create one actor of a mesh on a proc.");
  bind_body<ActorRecord>(m, "ActorRecord", "A live actor as its proc describes it.");
  bind_body<RefuseBody>(m, "RefuseBody", "Refuse: why a connection is refused.");
  bind_body<GatewayBody>(m, "GatewayBody", "Gateway: let a controller's connections through this agent's port to these agents' ports.");
  bind_body<ReadLogBody>(m, "ReadLogBody", "ReadLog: list a log directory of a host agent, or read part of a file.");
  bind_body<LogFileEntry>(m, "LogFileEntry", "One file of a log directory: name and size.");
  bind_body<ReadLogReply>(m, "ReadLogReply", "ReadLog's answer: the files, or the size of the file read (bytes: payload).");
  bind_body<ProcInfoBody>(m, "ProcInfoBody", "ProcInfo: ask a proc its pid and actors.");
  bind_body<ProcInfoReply>(m, "ProcInfoReply", "A proc's pid and actors.");
  bind_body<DumpStacksReply>(m, "DumpStacksReply", "Every thread's stack of a proc, answered by its I/O thread.");
  bind_body<RankMeta>(m, "RankMeta", "One rank in procs.json.");
  bind_body<AllocationMeta>(m, "AllocationMeta", "procs.json: an allocation's log directory described.");
}
