"""Why an attach or a pause found no rank to stop, said plainly: no actor mesh of that name on
this controller's procs (with the allocations of other controllers, which only their owner can
pause, and how to reach them), a rank past the mesh's end, or a dead rank (and how it died). Asked only after a
pause went unanswered, so nothing here costs a debugger that finds its ranks."""
import os
from typing import Any, Optional

from .. import _core
from .._runtime.agents import agent, connected_agents
from .._base.pids import running_agent_pid
from .._runtime.process import Kind
from .._base.shape import ranks_text
from .._runtime.wait import request

INFO_WAIT_S = 2.0


def _actor_records(rt: Any, addrs: list) -> dict:
    """{actor mesh name: its latest ActorRecord} as the procs at addrs report them."""
    if not addrs:
        return {}
    answers = request(rt.node, addrs, Kind.ProcInfo, timeout=INFO_WAIT_S, description="the procs' actors")
    latest: dict = {}
    for ok, body, _ in answers.values():
        if not ok:
            continue
        for rec in _core.ProcInfoReply.from_dict(body).actors:
            if rec.name not in latest or rec.spawned > latest[rec.name].spawned:
                latest[rec.name] = rec
    return latest


def _own_meshes(rt: Any) -> dict:
    """{actor mesh name: (Allocation, ActorRecord)} on this controller's live procs."""
    found: dict = {}
    for alloc in rt.owned_allocs():
        addrs = [alloc.procs[r].addr for r in alloc.alive_ranks()]
        for name, rec in _actor_records(rt, addrs).items():
            if name not in found or rec.spawned > found[name][1].spawned:
                found[name] = (alloc, rec)
    return found


def _agents_to_ask() -> list:
    """The host agents this controller talks to, and this user's default one if it runs (a
    program that spawned nothing yet may be looking for another's actors), none started here."""
    agents = connected_agents()
    default = os.path.abspath(_core.runtime_dir())
    if all(a.runtime_dir != default for a in agents) and running_agent_pid(default) is not None:
        try:
            agents.append(agent(default))
        except Exception:
            pass
    return agents


def _other_allocations(rt: Any) -> list:
    """Allocations of other controllers on the host agents this one asks: [AllocationStatus].
    (Their procs accept only their owner's connections, so which actors they run is not asked.)"""
    out: list = []
    for host_agent in _agents_to_ask():
        try:
            status = host_agent.status(timeout=INFO_WAIT_S)
        except Exception:
            continue  # an agent that cannot answer now: nothing to say about it
        out.extend(a for a in status.allocations if a.controller != rt.node.id and not a.stopping)
    return out


def _why_ranks(actor: str, ranks: list, alloc: Any, proc_ranks: list) -> Optional[str]:
    n = len(proc_ranks)
    reasons = []
    past = [r for r in ranks if not 0 <= r < n]
    if past:
        reasons.append(f"{actor} has {n} rank{'s' if n != 1 else ''} (0-{n - 1}): no {ranks_text(past)}")
    for r in ranks:
        if 0 <= r < n and proc_ranks[r] in alloc.exited:
            text = alloc.exited[proc_ranks[r]].text or "its proc exited"
            reasons.append(f"{actor} rank {r} is dead: {text.strip()}")
    return "; ".join(reasons) or None


def _describe_other(a: Any) -> str:
    what = repr(a.name) if a.name else f"allocation {a.alloc}"
    if a.attached:
        return f"{what} of controller pid {a.controller_pid} (`xmesh debug --pid {a.controller_pid}` debugs it)"
    if a.name:
        return f"{what}, whose controller is gone (xmesh.attach({a.name!r}) takes it over)"
    return f"{what}, whose controller is gone"


def why_not_paused(rt: Any, actor: str, ranks: list) -> str:
    """Why no live rank of `actor` among `ranks` answered a pause, in one sentence or a few."""
    meshes = _own_meshes(rt)
    if actor in meshes:
        alloc, rec = meshes[actor]
        why = _why_ranks(actor, list(ranks), alloc, list(rec.proc_ranks))
        return why or f"{actor} {ranks_text(ranks)} did not answer the pause (its proc may be busy in C " \
                      f"holding the GIL: `where` tells)"
    live = sorted(meshes)
    text = (f"no actor mesh named {actor!r} lives on this program's procs"
            + (f"; live ones: {', '.join(live)}" if live else " (none lives)"))
    others = _other_allocations(rt)
    if others:
        text += ("; only its owner can pause an actor of another program's allocation: "
                 + "; ".join(_describe_other(a) for a in others))
    return text
