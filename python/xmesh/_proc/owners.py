"""Deaths of other processes as the actors of this proc see them (docs/architecture/13-actor-lifecycle.md,
"Owners and orphans"). A proc hears of a proc that died from the controller (PeerDead, relayed to
every proc it started) or, for procs it started itself, from their agent (ProcExited):

- an actor whose owner (the actor that spawned it) was on the dead proc is an orphan: nothing can
  supervise it any more, so it ends, and every call to it says why; one that had ended already
  keeps its tombstone with that said too;
- an actor that owns a mesh with a proc there gets a MeshFailure in `__supervise__`: one per rank
  of each actor mesh it spawned on that proc, or one for its proc mesh where none of its actor
  meshes ran (unhandled, the owner fails in turn, as for any failure of its children).

A proc that was stopped on purpose (its mesh's stop, its controller's exit) is nobody's failure."""
from __future__ import annotations

import collections
import threading
from typing import Any, Iterator, Optional

from .._api.actor import ActorMesh, actor_ranks_at
from .._base.protocol import actor_mesh_name
from .._base.errors import MeshFailure, failure_report

_ENDED_KEPT = 1000  # ended actors whose owner is remembered (their tombstone can still say it died)


def orphan_words(owner: str, addr: str, mesh: str, text: str) -> str:
    """Why an orphan ended (owner: the id of the actor that spawned it, "MESH.HEX"); Monarch's
    words come last, for programs that match them."""
    owner_mesh = actor_mesh_name(owner)
    return (f"its owner, an actor of mesh {owner_mesh!r}, is gone: its proc {addr} died ({text.strip()}); "
            f"in Monarch's words, timed out reaching controller for mesh {mesh}")


class Owners:
    """The proc's side of supervision between procs: orphans end, owners are told of deaths.
    `threads()` gives the live ActorThreads of this proc (see ActorHost)."""

    def __init__(self, threads: Any, node: Any):
        self._threads = threads
        self._node = node
        self._lock = threading.Lock()
        # actor id -> (owner address, owner actor, mesh name, tombstone) of actors that ended
        self._ended: collections.OrderedDict[str, tuple] = collections.OrderedDict()
        self._dead: collections.OrderedDict[str, None] = collections.OrderedDict()  # procs known dead

    def note_ended(self, t: Any, tombstone: dict) -> None:
        """An actor of this proc ended: if its owner dies later, its tombstone says so."""
        if not t.owner_actor:
            return
        with self._lock:
            if t.owner_addr in self._dead:  # it ended as an orphan: its tombstone says so
                return
            self._ended[t.actor_id] = (t.owner_addr, t.owner_actor, t.actor_name, tombstone)
            while len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)

    def proc_died(self, addr: str, text: str) -> None:
        """The proc at addr died (not stopped on purpose)."""
        with self._lock:
            if addr in self._dead:
                return
            self._dead[addr] = None
            while len(self._dead) > _ENDED_KEPT:
                self._dead.popitem(last=False)
        self._end_orphans(addr, text)
        self._amend_ended(addr, text)
        self._tell_owners(addr, text)

    def _end_orphans(self, addr: str, text: str) -> None:
        for t in self._threads():
            if t.owner_actor and t.owner_addr == addr and t.tombstone is None:
                t.end_now(orphan_words(t.owner_actor, addr, t.actor_name, text))

    def _amend_ended(self, addr: str, text: str) -> None:
        with self._lock:
            ended = [(a, e) for a, e in self._ended.items() if e[0] == addr]
            for actor_id, _ in ended:
                del self._ended[actor_id]
        for actor_id, (_, owner, mesh, stone) in ended:
            more = "; since then " + orphan_words(owner, addr, mesh, text)
            self._node.amend_tombstone(actor_id, dict(stone, text=stone.get("text", "") + more))

    def _tell_owners(self, addr: str, text: str) -> None:
        for t in self._threads():
            if t.instance is None or t.failure is not None or t.ctx is None:
                continue
            for failure in owned_failures(t.ctx.owned, addr, text):
                t.supervision_event(failure)


def owned_failures(owned: list, addr: str, text: str) -> Iterator[MeshFailure]:
    """The failures the death of the proc at addr makes among the meshes an actor owns (weak
    references): each rank of its actor meshes there; its proc meshes' rank where none ran."""
    meshes = [m for m in (r() for r in owned) if m is not None]
    told = False
    for mesh in meshes:
        if isinstance(mesh, ActorMesh):
            name, class_name, ranks = actor_ranks_at(mesh, addr)
            for rank in ranks:
                told = True
                who = f"{class_name} {name!r} rank {rank}"
                yield MeshFailure(name, failure_report(who, f"its proc died: {text.strip()}"), "proc", rank)
    if told:
        return
    for mesh in meshes:
        rank = _proc_rank_at(mesh, addr)
        if rank is not None:
            name = mesh.allocation.name or mesh.allocation.id
            yield MeshFailure(name, f"proc {rank} of {name!r} died: {text.strip()}", "proc", rank)


def _proc_rank_at(mesh: Any, addr: str) -> Optional[int]:
    alloc = None if isinstance(mesh, ActorMesh) else getattr(mesh, "allocation", None)
    if alloc is None:
        return None
    for rank, p in alloc.procs.items():
        if p.addr == addr:
            return rank
    return None

