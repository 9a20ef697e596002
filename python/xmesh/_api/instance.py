"""Monarch's context(): the actor running this code (its id, its rank and mesh, the procs it
runs on, who spawned it) and the message it handles (its rank in the mesh or slice it was sent
to, who sent it). In the controller, the root client's. Read from what _context keeps per actor
and per message; nothing is sent or computed until asked."""
import dataclasses
import os
from typing import Any, Optional

from .. import _core
from .._base.context import actor_context, actor_handles, actor_point, current_message, message_point
from .._base.shape import Point

_EMPTY = _core.Shape([], 0, [], [])
ROOT = "root"  # Monarch's name of the program's own instance (the root client)


@dataclasses.dataclass(frozen=True)
class CreatorInstance:
    """The actor that spawned another (Monarch's CreatorInstance): its mesh's name, its class,
    its rank, and the actor that spawned it in turn; the program's own is the root ("root", no
    class, no dimensions, no creator)."""
    name: str
    class_name: Optional[str]
    rank: Point
    creator: "Optional[CreatorInstance]"

    @staticmethod
    def from_record(record: Any) -> "CreatorInstance":
        if record is None:
            return CreatorInstance(ROOT, None, Point(0, _EMPTY), None)
        name, class_name, rank, parent = record
        return CreatorInstance(name, class_name, rank, CreatorInstance.from_record(parent))

    def __repr__(self) -> str:
        return _qualified_name(self)


def _qualified_name(ins: Any) -> str:
    """Monarch's "<root>.<mod.Trainer trainers{'gpus': 1/8}>.<mod.Worker w>": the chain of
    creators, outermost first, each with its qualified class and its point."""
    names = []
    while ins is not None:
        prefix = f"{ins.class_name} " if ins.class_name else ""
        names.append(f"<{prefix}{ins.name}{ins.rank if len(ins.rank) else ''}>")
        ins = ins.creator
    return ".".join(reversed(names))


class Instance:
    """The actor running this code (Monarch's `context().actor_instance`); in the controller,
    the root client ("root", rank 0 of no dimensions, on this_proc(); Monarch's name)."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx  # the actor's ActorContext, None in the controller

    @property
    def actor_id(self) -> str:
        """Unique per actor while it lives: "<mesh name>.<spawn id>[<rank>]" ("root" in the
        controller)."""
        ctx = self._ctx
        return ROOT if ctx is None else f"{ctx.actor_id}[{ctx.rank}]"

    @property
    def name(self) -> str:
        """The name the actor mesh was spawned with."""
        return ROOT if self._ctx is None else self._ctx.mesh_name

    @property
    def class_name(self) -> Optional[str]:
        """The actor's class, qualified by its module (None for the client)."""
        return None if self._ctx is None else self._ctx.class_name

    @property
    def rank(self) -> Point:
        """The actor's point in the mesh it was spawned as (not the message's: see
        Context.message_rank)."""
        return actor_point() if self._ctx is None else Point(self._ctx.rank, self._ctx.shape)

    @property
    def proc_mesh(self) -> Any:
        """The ProcMesh the actor mesh was spawned on (this_proc() for the client)."""
        if self._ctx is None or self._ctx.handles is None:
            from .proc_mesh import this_proc

            return this_proc()
        return actor_handles(self._ctx)[0]

    @property
    def proc(self) -> Any:
        """The one proc this actor runs on, as a ProcMesh."""
        pm = self.proc_mesh
        return pm.slice(**dict(self.rank)) if len(self.rank) else pm

    @property
    def actor_mesh(self) -> Any:
        """The whole ActorMesh this actor belongs to (call its peers through it); None for the
        client. An xmesh addition."""
        if self._ctx is None or self._ctx.handles is None:
            return None
        return actor_handles(self._ctx)[1]

    @property
    def creator(self) -> Optional[CreatorInstance]:
        """The actor that spawned this one (the root, "root", when the program did); None for
        the root itself."""
        if self._ctx is None or self._ctx.handles is None:
            return None
        return CreatorInstance.from_record(actor_handles(self._ctx)[2])

    @property
    def proc_id(self) -> str:
        """The process this actor runs in: "<host>:<pid>"."""
        return f"{_core.hostname()}:{os.getpid()}"

    def stop(self, reason: Optional[str] = None) -> None:
        """Stops this actor once its current message is handled (its later messages fail as to
        a stopped actor); its proc and the other actors of the mesh go on."""
        if self._ctx is None:
            raise RuntimeError("the client is not an actor that can stop; shutdown_context() stops the controller")
        self._ctx.stop_requested = True

    def abort(self, reason: Optional[str] = None) -> None:
        """Fails this actor once its current message is handled (Monarch's abort): its owner
        is told, with reason ("no reason provided" without one), and its later messages fail
        with a SupervisionError saying so."""
        if self._ctx is None:
            raise RuntimeError("the client is not an actor that can abort; raise an exception or call sys.exit()")
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"abort()'s reason is a str, got {type(reason).__name__}")
        self._ctx.abort_reason = reason or ""

    def __repr__(self) -> str:
        return _qualified_name(self)


@dataclasses.dataclass(frozen=True)
class MessageSender:
    """Who sent the message being handled: the controller ("client") or a proc (an actor's
    call, or a controller's this_proc())."""
    role: str   # "controller" or "proc"
    host: str
    pid: int
    addr: str   # the sending process's node address

    @property
    def is_client(self) -> bool:
        return self.role == "controller"

    def __str__(self) -> str:
        who = "the controller" if self.is_client else "a proc"
        return f"{who} (pid {self.pid} on {self.host})"


def _sender_of(msg: Any) -> MessageSender:
    # A node id reads "<role>-<host>-<pid>-<incarnation>" (runtime/transport/transport.cpp); hosts may hold '-'.
    role, _, rest = msg.sender.partition("-")
    host, _, tail = rest.rpartition("-")
    host, _, pid = host.rpartition("-")
    return MessageSender(role, host, int(pid) if pid.isdigit() else 0, msg.sender_addr)


class Context:
    """What context() returns: `actor_instance` (the running actor) and `message_rank` (the
    message's point in the mesh or slice it was sent to; what current_rank() returns)."""

    def __init__(self, ctx: Any, message: Any) -> None:
        self._instance = Instance(ctx)
        self._message = message

    @property
    def actor_instance(self) -> Instance:
        return self._instance

    @property
    def message_rank(self) -> Point:
        """Where this actor sits in the mesh or slice the message was sent to: for a call on
        `mesh.slice(gpus=slice(2, 4))`, ranks 0 and 1 of a {"gpus": 2} extent. Not the actor's
        rank (actor_instance.rank) unless the whole mesh was called. For the client, rank 0
        of no dimensions."""
        if self._instance._ctx is None:
            return Point(0, _EMPTY)
        return message_point(self._instance._ctx, self._message)

    @property
    def message_sender(self) -> Optional[MessageSender]:
        """Who sent the message being handled (None outside a message, and in the client).
        An xmesh addition."""
        return None if self._message is None else _sender_of(self._message[0])

    def __repr__(self) -> str:
        return f"<Context {self._instance!r} message_rank={self.message_rank!r}>"


def context() -> Context:
    """The running actor and the message it handles (Monarch's context()); in the controller,
    the root client's."""
    ctx = actor_context()
    return Context(ctx, current_message() if ctx is not None else None)


def current_actor_name() -> str:
    """The running actor's id as a string (Monarch's current_actor_name()): "root" in the
    controller."""
    return context().actor_instance.actor_id
