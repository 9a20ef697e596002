// The bodies of the node's messages (node/): calls and what surrounds them (cancel, configure, adopt,
// spawning an actor, a proc's description and stacks), supervision notices, the order numbers
// of the call path (a message's cast part, numbers said lost), a broken ring.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bodies.hpp"
#include "wire.hpp"

namespace xmesh {

// Call (caller -> actor): absent on the fast path (the whole actor mesh called, the reply to the
// caller). Present when the message's point is not the actor's own (a slice, a renamed or
// reshaped mesh, choose), when the reply goes to a port (send(..., port=)), or when a plain
// method is called as an endpoint (as_endpoint()).
struct CallBody {
  static constexpr const char* what = "Call";
  static constexpr Kind kind = Kind::Call;  // the message it is the body of
  std::optional<std::vector<std::string>> labels;  // the called mesh's extent: its dimensions
  std::optional<std::vector<int64_t>> sizes;       //   and their sizes (both or neither)
  std::optional<int64_t> rank;        // the message's rank in that extent (default: its target index)
  std::optional<std::string> reply_addr;  // the reply goes to this port instead of the caller
  std::optional<uint64_t> reply_corr;     //   (owner's address and the port's id; both or neither)
  std::optional<bool> as_endpoint;    // the method is a plain one, called as an endpoint (as_endpoint())
  std::optional<bool> explicit_port;  //   taking a Port first (as_endpoint(..., explicit_response_port=True))
  // A broadcast whose caller learns when it ended (what the panel shows busy, what later calls
  // queue behind), not what it returned: answered with an empty ok once the endpoint is done.
  std::optional<bool> ended_only;
  template <class F>
  static void fields(F&& f) {
    f("labels", &CallBody::labels, Need::Optional);
    f("as_endpoint", &CallBody::as_endpoint, Need::Optional);
    f("explicit_port", &CallBody::explicit_port, Need::Optional);
    f("ended_only", &CallBody::ended_only, Need::Optional);
    f("sizes", &CallBody::sizes, Need::Optional);
    f("rank", &CallBody::rank, Need::Optional);
    f("reply_addr", &CallBody::reply_addr, Need::Optional);
    f("reply_corr", &CallBody::reply_corr, Need::Optional);
  }
  void check() const;
};
XMESH_BODY_JSON(CallBody)

// Cancel (controller -> proc): cancel one target of a call.
struct CancelBody {
  static constexpr const char* what = "Cancel";
  static constexpr Kind kind = Kind::Cancel;  // the message it is the body of
  uint64_t corr = 0;  // the call's correlation id
  int64_t index = 0;  // which of its targets
  template <class F>
  static void fields(F&& f) {
    f("corr", &CancelBody::corr, Need::Required);
    f("index", &CancelBody::index, Need::Required);
  }
};
XMESH_BODY_JSON(CancelBody)

// Configure (controller -> proc): settings; only those present change.
struct ConfigureBody {
  static constexpr const char* what = "Configure";
  static constexpr Kind kind = Kind::Configure;  // the message it is the body of
  std::optional<int> log_level;     // the procs' Python logging level
  std::optional<bool> post_mortem;  // stop in pdb where an endpoint raises
  template <class F>
  static void fields(F&& f) {
    f("log_level", &ConfigureBody::log_level, Need::Optional);
    f("post_mortem", &ConfigureBody::post_mortem, Need::Optional);
  }
};
XMESH_BODY_JSON(ConfigureBody)

// Adopt (controller -> proc of a named allocation it attached, or sharing a cookie).
struct AdoptBody {
  static constexpr const char* what = "Adopt";
  static constexpr Kind kind = Kind::Adopt;  // the message it is the body of
  std::vector<std::string> cookies;  // to accept from now on
  std::vector<std::string> refuse;   // controllers whose calls are refused from now on
  std::string refuse_text;           // what they are told
  template <class F>
  static void fields(F&& f) {
    f("cookies", &AdoptBody::cookies, Need::Optional);
    f("refuse", &AdoptBody::refuse, Need::Optional);
    f("refuse_text", &AdoptBody::refuse_text, Need::Optional);
  }
};
XMESH_BODY_JSON(AdoptBody)

// SpawnActor (controller or proc -> proc): create one actor of a mesh; the payload is the pickled
// (class, args, kwargs). Answered with {pid, host} or the error __init__ raised.
struct SpawnActorBody {
  static constexpr const char* what = "SpawnActor";
  static constexpr Kind kind = Kind::SpawnActor;  // the message it is the body of
  std::string name;                // the actor mesh's name
  std::string class_name;          // the class's qualified name (for messages)
  std::string shape;               // the actor mesh's shape (runtime/base/shape.hpp JSON text)
  std::vector<int64_t> proc_ranks;  // the procs it spans, by rank in their allocation
  // The actor that spawned it (its id on the spawning process, the message's sender), whose
  // __supervise__ gets its failures; empty: the controller's code spawned it (the root).
  std::string owner;
  template <class F>
  static void fields(F&& f) {
    f("name", &SpawnActorBody::name, Need::Required);
    f("class_name", &SpawnActorBody::class_name, Need::Optional);
    f("shape", &SpawnActorBody::shape, Need::Required);
    f("proc_ranks", &SpawnActorBody::proc_ranks, Need::Optional);
    f("owner", &SpawnActorBody::owner, Need::Optional);
  }
};
XMESH_BODY_JSON(SpawnActorBody)

// A live actor as its proc describes it (ProcInfo reply): what a controller that attaches later
// needs to call it without its class.
struct ActorRecord {
  static constexpr const char* what = "actor record";
  std::string actor_id, name, class_name;
  std::vector<std::string> endpoints;
  std::string shape;  // the actor mesh's shape (JSON text)
  std::vector<int64_t> proc_ranks;
  double spawned = 0;  // seconds since the epoch
  // By endpoint, as endpoints: its signature without self ("(n: int) -> int"), and the first
  // line of its docstring (completion and inspection in a kernel without the class).
  std::vector<std::string> signatures, summaries;
  template <class F>
  static void fields(F&& f) {
    f("actor_id", &ActorRecord::actor_id, Need::Required);
    f("name", &ActorRecord::name, Need::Required);
    f("class_name", &ActorRecord::class_name, Need::Optional);
    f("endpoints", &ActorRecord::endpoints, Need::Optional);
    f("shape", &ActorRecord::shape, Need::Required);
    f("proc_ranks", &ActorRecord::proc_ranks, Need::Optional);
    f("spawned", &ActorRecord::spawned, Need::Optional);
    f("signatures", &ActorRecord::signatures, Need::Optional);
    f("summaries", &ActorRecord::summaries, Need::Optional);
  }
};
XMESH_BODY_JSON(ActorRecord)

// ProcInfo (controller -> proc): its pid and live actors (and, for `where`, what async
// endpoints await).
struct ProcInfoBody {
  static constexpr const char* what = "ProcInfo";
  static constexpr Kind kind = Kind::ProcInfo;  // the message it is the body of
  bool async_stacks = false;
  template <class F>
  static void fields(F&& f) {
    f("async_stacks", &ProcInfoBody::async_stacks, Need::Optional);
  }
};
XMESH_BODY_JSON(ProcInfoBody)

struct ProcInfoReply {
  static constexpr const char* what = "ProcInfo reply";
  int64_t pid = 0;
  std::vector<ActorRecord> actors;
  std::optional<nlohmann::json> async_stacks;       // asked for: {thread label: [frames]}
  template <class F>
  static void fields(F&& f) {
    f("pid", &ProcInfoReply::pid, Need::Required);
    f("actors", &ProcInfoReply::actors, Need::Optional);
    f("async_stacks", &ProcInfoReply::async_stacks, Need::Optional);
  }
};
XMESH_BODY_JSON(ProcInfoReply)

// DumpStacks (controller -> proc) is answered from the I/O thread (the dump taken with the GIL by
// a helper thread, or without it when the GIL stays held: python/src/debugger_bindings.cpp), with every
// thread's Python stack as CPython's fault handler writes it and what runs on each thread.
struct DumpStacksReply {
  static constexpr const char* what = "DumpStacks reply";
  std::string stacks;                         // _Py_DumpTracebackThreads' text
  std::map<std::string, std::string> labels;  // thread ident -> "mesh\trank" of the actor it runs
  int64_t pid = 0;
  std::optional<std::string> error;           // what kept part of the dump from being taken
  template <class F>
  static void fields(F&& f) {
    f("stacks", &DumpStacksReply::stacks, Need::Required);
    f("labels", &DumpStacksReply::labels, Need::Optional);
    f("pid", &DumpStacksReply::pid, Need::Optional);
    f("error", &DumpStacksReply::error, Need::Optional);
  }
};
XMESH_BODY_JSON(DumpStacksReply)

// ProcExited (agent -> controller): a proc ended, after its pipes were drained.
struct ProcExitedBody {
  static constexpr const char* what = "ProcExited";
  static constexpr Kind kind = Kind::ProcExited;  // the message it is the body of
  std::string alloc;                  // the allocation's id
  int64_t rank = 0;
  int64_t pid = 0;
  std::string addr;                   // the proc's node address (now dead)
  std::string host;                   // the agent's hostname
  nlohmann::json coords = nlohmann::json::object();
  bool stopping = false;              // it was asked to stop (not a failure)
  std::string text;                   // "proc rank 3 (pid 123 on host) killed by SIGKILL; its last output: ..."
  std::optional<std::string> signal;  // "SIGKILL" when a signal ended it
  std::optional<int> exit_code;       // when it exited
  std::string stopped_by;             // who stopped it when not its controller ("the xmesh panel ...")
  void check();
  template <class F>
  static void fields(F&& f) {
    f("alloc", &ProcExitedBody::alloc, Need::Required);
    f("rank", &ProcExitedBody::rank, Need::Required);
    f("pid", &ProcExitedBody::pid, Need::Optional);
    f("addr", &ProcExitedBody::addr, Need::Required);
    f("host", &ProcExitedBody::host, Need::Optional);
    f("coords", &ProcExitedBody::coords, Need::Optional);
    f("stopping", &ProcExitedBody::stopping, Need::Optional);
    f("text", &ProcExitedBody::text, Need::Required);
    f("signal", &ProcExitedBody::signal, Need::Optional);
    f("exit_code", &ProcExitedBody::exit_code, Need::Optional);
    f("stopped_by", &ProcExitedBody::stopped_by, Need::Optional);
  }
};
XMESH_BODY_JSON(ProcExitedBody)

// PeerDead: a peer address died (relayed to procs; a host loss goes to the node's own control
// inbox with host_lost).
struct PeerDeadBody {
  static constexpr const char* what = "PeerDead";
  static constexpr Kind kind = Kind::PeerDead;  // the message it is the body of
  std::string addr;
  nlohmann::json error = nlohmann::json::object();  // the error body calls to it fail with
  bool host_lost = false;
  void check();
  template <class F>
  static void fields(F&& f) {
    f("addr", &PeerDeadBody::addr, Need::Required);
    f("error", &PeerDeadBody::error, Need::Optional);
    f("host_lost", &PeerDeadBody::host_lost, Need::Optional);
  }
};
XMESH_BODY_JSON(PeerDeadBody)

// Cast trees (runtime/cast/cast_tree.hpp). One target behind a relay, as its message lists it.
struct CastTarget {
  static constexpr const char* what = "CastTarget";
  std::string addr;    // its proc's node address
  std::string actor;   // its actor's name there
  int64_t index = 0;   // its index in the origin's call (answers carry it)
  uint64_t oseq = 0;   // its order number from the origin (Header::oseq)
  std::string local;   // its unix socket, when known: a relay on its host sends there ("": none)
  void check() const {
    if (addr.empty()) throw std::invalid_argument("CastTarget: 'addr' is empty");
    if (index < 0) throw std::invalid_argument("CastTarget: 'index' is negative");
  }
  template <class F>
  static void fields(F&& f) {
    f("a", &CastTarget::addr, Need::Required);
    f("n", &CastTarget::actor, Need::Required);
    f("i", &CastTarget::index, Need::Required);
    f("u", &CastTarget::oseq, Need::Required);
    f("l", &CastTarget::local, Need::Optional);
  }
};
XMESH_BODY_JSON(CastTarget)

// The "cast" part of an actor message's body in a cast tree: who made it (absent in the
// origin's own messages, whose sender is the origin) and the targets the receiver relays it to.
struct CastBody {
  static constexpr const char* what = "Cast";
  std::optional<std::string> origin;       // the origin's address (as the first relay knew it)
  std::optional<std::string> origin_id;    // the origin's node id (its messages' order is per id)
  int64_t fanout = 16;                     // how many messages a relay sends at most
  std::vector<CastTarget> behind;          // the receiver's slice of the targets, itself excluded
  void check() const {
    if (fanout < 2 || fanout > 4096) throw std::invalid_argument("Cast: 'fanout' is not within 2..4096");
  }
  template <class F>
  static void fields(F&& f) {
    f("o", &CastBody::origin, Need::Optional);
    f("s", &CastBody::origin_id, Need::Optional);
    f("f", &CastBody::fanout, Need::Optional);
    f("t", &CastBody::behind, Need::Optional);
  }
};
XMESH_BODY_JSON(CastBody)

// CastLost (origin -> a target behind a relay that died): the messages with these order
// numbers will not come; the target stops waiting for them (and drops them if they still do).
// Also (a shared-memory link that broke) every number up to `t` that has not come.
struct CastLostBody {
  static constexpr const char* what = "CastLost";
  static constexpr Kind kind = Kind::CastLost;  // the message it is the body of
  std::vector<uint64_t> oseqs;
  std::optional<std::string> origin_id;  // whose numbers (default: the sender's)
  uint64_t through = 0;
  template <class F>
  static void fields(F&& f) {
    f("u", &CastLostBody::oseqs, Need::Required);
    f("s", &CastLostBody::origin_id, Need::Optional);
    f("t", &CastLostBody::through, Need::Optional);
  }
};
XMESH_BODY_JSON(CastLostBody)

// RingBroken (a node -> the other end of a shared-memory link): the link with this token broke
// (its records or positions do not read, or its reader closed it): what was on it is lost. The
// receiver forgets the link too and fails the calls in flight between the two.
struct RingBrokenBody {
  static constexpr const char* what = "RingBroken";
  static constexpr Kind kind = Kind::RingBroken;  // the message it is the body of
  uint64_t token = 0;
  std::string why;
  template <class F>
  static void fields(F&& f) {
    f("token", &RingBrokenBody::token, Need::Required);
    f("why", &RingBrokenBody::why, Need::Optional);
  }
};
XMESH_BODY_JSON(RingBrokenBody)

}  // namespace xmesh
