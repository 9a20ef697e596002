"""Named allocations: procs that outlive their controller (DESIGN §6). A later controller (a
restarted kernel) attaches by name and becomes the owner; the actors it finds are called by
the endpoint names their procs report, with no need for the class."""
import json
import os
import time
from typing import Optional

from .. import _core
from .actor import ActorMesh, ActorMeshRef
from .allocation import Allocation, ProcRecord, addrs_list
from .future import CallTarget
from .._runtime.agents import HostdError, agent
from .._base.protocol import ErrorKind, error, error_kind
from .._runtime.process import Kind, get_runtime
from .._runtime.wait import request, wait_call


def shape_dict(shape):
    return dict(zip(shape.labels, shape.sizes))


def _shape_of(shape_json):
    """A Shape from the JSON object a host agent keeps (labels, sizes, strides, offset)."""
    return _core.Shape.from_json(json.dumps(shape_json))


def attach_named(host_mesh, name, make_mesh, expected_shape=None):
    """Attaches this controller to the live allocation `name` on the hosts of host_mesh.
    Returns its mesh, make_mesh(alloc, shape) (a ProcMesh), or None if no host has it. Raises
    ValueError if expected_shape differs from the live shape (naming both)."""
    rt = get_runtime()
    host_ranks = list(host_mesh.shape.ranks())
    agents = [agent(host_mesh.runtime_dirs[h]) for h in host_ranks]
    replies = []
    for a in agents:
        try:
            replies.append(a.attach(name))
        except HostdError as e:
            if error_kind(e.body) != ErrorKind.NoAllocation:
                raise
            replies.append(None)
    found = [r for r in replies if r is not None]
    if not found:
        return None
    if len(found) != len(replies) or len({r.alloc for r in found}) != 1:
        where = {a.runtime_dir: (r.alloc if r else None) for a, r in zip(agents, replies)}
        raise RuntimeError(f"allocation {name!r} does not span exactly these hosts (allocation id per host: {where}); "
                           f"attach with the HostMesh it was spawned on, or `xmesh stop {name}`")
    shape = _shape_of(found[0].shape)
    if expected_shape is not None and shape_dict(expected_shape) != shape_dict(shape):
        raise ValueError(f"allocation {name!r} is live with shape {shape_dict(shape)}; this call asks for "
                         f"{shape_dict(expected_shape)}. Use xmesh.attach({name!r}) to use it as it is, or stop it "
                         f"first (procs.stop() or `xmesh stop {name}`)")

    alloc = Allocation(found[0].alloc, name, shape, agents)
    for a, r in zip(agents, replies):
        for p in r.procs:
            alloc.procs[p.rank] = ProcRecord(p.addr, p.pid, r.host, a)
    cookie = found[0].job_cookie
    if cookie and cookie not in rt.cookies:
        _share_cookie(rt, cookie)
    rt.node.add_accepted_cookie(cookie)
    for a, r in zip(agents, replies):
        for p in r.procs:
            addr = p.addr
            rt.node.set_peer_cookie(addr, cookie)
            rt.node.revive(addr)  # this process may have seen it die before: it is fresh now
            rt.node.add_dependent(a.addr, addr)
            rt.node.add_supervision_subscriber(addr)
            if not p.alive:
                text = f"proc rank {p.rank} of {name!r} is dead"
                alloc.exited[p.rank] = _core.ProcExitedBody(alloc=alloc.id, rank=p.rank, pid=p.pid, addr=addr,
                                                            host=r.host, text=text)
                rt.node.mark_dead(addr, error(ErrorKind.Supervision, text))
    rt.register_alloc(alloc)

    # The procs take us as their owner and refuse the previous controller, whose calls then
    # fail with a clear error instead of racing ours.
    previous = sorted({r.previous.addr for r in found if r.previous.addr and r.previous.addr != rt.node.addr})
    refuse_text = (f"allocation {name!r} was taken over by another controller (pid {os.getpid()} on "
                   f"{_core.hostname()}); this handle no longer works here: xmesh.attach({name!r}) takes it back")
    live = [r for r in sorted(alloc.procs) if r not in alloc.exited]
    call = rt.node.call([(alloc.procs[r].addr, "") for r in live], int(Kind.Adopt), "",
                        _core.AdoptBody(cookies=rt.cookies, refuse=previous, refuse_text=refuse_text).to_dict(),
                        None, True)
    described = [CallTarget(r, {}, "proc") for r in live]
    mesh = make_mesh(alloc, shape)  # no lease: a named allocation outlives its handles
    rebuild = lambda: make_mesh(alloc, shape)  # noqa: E731
    ready = mesh.ready_when(call, rebuild, described, f"attach to {name!r}")
    # The runtime's own wait: ranks stopped in pdb that the procs announce now are the user's
    # to look at (xmesh.debug()), not a prompt inside attach().
    if not wait_call(call, 30, f"attach to {name!r}", debugger=False):
        raise TimeoutError(f"procs {ready.running_ranks()} of {name!r} did not answer the attach within 30 s")
    ready.get(timeout=0)
    return mesh


def _share_cookie(rt, cookie):
    """Procs we already own learn to accept the procs of a newly attached allocation."""
    rt.cookies.append(cookie)
    for alloc in rt.owned_allocs():
        for rank in alloc.alive_ranks():
            try:
                rt.node.send(alloc.procs[rank].addr, int(Kind.Adopt), _core.AdoptBody(cookies=[cookie]).to_dict())
            except Exception:
                pass


def actors_of(proc_mesh, name=None, timeout=30):
    """The live actor meshes on proc_mesh's procs, as reported by the procs: the one named
    `name` (the latest spawn of that name), or a dict of all of them by name."""
    rt = get_runtime()
    alloc = proc_mesh.allocation
    addrs = proc_mesh.proc_addrs()
    ranks = [r for r in proc_mesh.shape.ranks() if r not in alloc.exited]
    answers = request(rt.node, [addrs[r] for r in ranks], Kind.ProcInfo, timeout=timeout,
                      description="the procs' actors")
    if len(answers) < len(ranks):
        missing = [r for i, r in enumerate(ranks) if i not in answers]
        raise TimeoutError(f"procs {missing} did not report their actors within {timeout} s")
    records: dict = {}
    for ok, body, _ in answers.values():
        if ok:
            for rec in _core.ProcInfoReply.from_dict(body).actors:
                records.setdefault(rec.actor_id, rec)
    latest = {}
    for rec in sorted(records.values(), key=lambda r: r.spawned):
        latest[rec.name] = rec

    def mesh_of(rec):
        shape = _core.Shape.from_json(rec.shape)
        sigs = ({n: (s, d) for n, s, d in zip(rec.endpoints, rec.signatures, rec.summaries)}
                if len(rec.signatures) == len(rec.endpoints) == len(rec.summaries) else {})
        ref = ActorMeshRef(rec.actor_id, rec.name, rec.class_name, rec.endpoints, addrs_list(addrs), shape,
                           rec.proc_ranks, sigs)
        return ActorMesh(ref, shape, None, proc_mesh, None)

    if name is None:
        return {n: mesh_of(rec) for n, rec in latest.items()}
    if name not in latest:
        raise KeyError(f"no live actor mesh named {name!r} on these procs; live ones: {sorted(latest)}")
    return mesh_of(latest[name])


def allocations(runtime_dirs: Optional[list[str]] = None) -> list[dict]:
    """Live named allocations on this host (or on the agents of the given runtime
    directories): name, shape, hosts (host names; runtime_dirs: their agents' directories),
    age, procs alive, and the controller attached."""
    out: dict = {}
    for d in runtime_dirs or [_core.runtime_dir()]:
        status = agent(d).status()
        for a in status.allocations:
            if not a.name or a.stopping:
                continue
            entry = out.setdefault(a.name, {
                "name": a.name, "shape": shape_dict(_shape_of(a.shape)), "hosts": [], "runtime_dirs": [],
                "age_s": time.time() - a.created, "procs": 0, "procs_alive": 0, "controller_pid": a.controller_pid,
                "attached": a.attached})
            entry["hosts"].append(status.host or _core.hostname())
            entry["runtime_dirs"].append(d)
            entry["procs"] += len(a.procs)
            entry["procs_alive"] += sum(p.alive for p in a.procs)
    return sorted(out.values(), key=lambda e: e["name"])


def stop_named(name: str, runtime_dirs: Optional[list[str]] = None, by: str = "") -> int:
    """Stops the live allocation `name` on each host that has it; returns how many hosts had it.
    by: who asks (what its controller is told stopped its procs)."""
    stopped = 0
    for d in runtime_dirs or [_core.runtime_dir()]:
        try:
            agent(d).stop_procs(name=name, by=by)
            stopped += 1
        except HostdError as e:
            if error_kind(e.body) != ErrorKind.NoAllocation:
                raise
    return stopped
