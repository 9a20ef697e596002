"""Allocations: the procs of one spawn_procs (or attach) on their host agents, the lease that
stops an unnamed one when its last handle goes, and the small helpers that turn readiness
replies into meshes. Below ProcMesh (_proc_mesh) and named allocations (_named), which both
build on it."""
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from .. import _core
from .._output import logfiles as _logfiles
from .._base.context import current_cell
from .._base.errors import MeshFailure
from .future import death_reported
from .._base.pids import unusual_state
from .._runtime.process import DEFAULT_PROC_LOG_LEVEL, current_runtime, get_runtime
from .._runtime.wait import add_slow_wait_hook
from .._base.threads import start_thread


@dataclass
class ProcRecord:
    """One proc of an allocation as its controller knows it."""
    addr: str                   # its node's address
    pid: Optional[int] = None   # None until its agent reported it started
    host: str = ""              # the hostname of its agent
    agent: Any = None           # its AgentClient (None in a mesh rebuilt from a pickle)


class Allocation:
    """The procs of one spawn_procs call: their addresses, pids, hosts and liveness."""

    def __init__(self, alloc_id, name, shape, agents):
        self.id = alloc_id
        self.created = time.time()         # when this controller made (or attached) it
        self.name = name
        self.shape = shape                 # dense shape over global ranks
        self.agents = agents               # host index -> AgentClient
        self.procs = {}                    # global rank -> ProcRecord
        self.exited = {}                   # global rank -> _core.ProcExitedBody
        self.stopped = False
        self.owner = ""                    # the actor that spawned it, if one did (its proc hears of deaths)
        self.log_level = DEFAULT_PROC_LOG_LEVEL
        self.last_cell = current_cell()    # the cell of the last call to its actors: where its deaths are said
        self._cond = threading.Condition()

    def on_proc_exited(self, body):
        with self._cond:
            self.exited[body.rank] = body
            self._cond.notify_all()
            all_gone = len(self.exited) >= len(self.procs)
        rt = get_runtime()
        # Said unless this controller stopped it: a death, or a stop by someone else (the panel,
        # `xmesh stop`); an owning actor is told instead (_proc/owners.py).
        if not self.stopped and (not body.stopping or body.stopped_by) and not self.owner:
            proc = self.procs.get(body.rank)
            self._say_death(rt, body.text, proc.addr if proc is not None else "", body.rank)
        if all_gone:
            rt.forget_alloc(self.id)

    DEATH_NOTICE_DELAY_S = 0.5

    def _say_death(self, rt, text, addr, rank):
        """A proc's death is said once: by the error of a call it failed, when the caller takes
        that error within a moment (a wait on it ends as soon as the call fails), else here, as
        a failure nobody waits for (the unhandled fault hook's)."""
        def say():
            # Nobody to tell when the program let go of the mesh meanwhile (it stopped, or its
            # last handle went: a test or a cell that ended after killing its procs).
            if not death_reported(addr) and not self.stopped:  # in the cell that last used it
                rt.unhandled_fault(MeshFailure(self.name or self.id, text, "proc", rank, self.last_cell))

        timer = threading.Timer(self.DEATH_NOTICE_DELAY_S, say)
        timer.start()  # not a daemon: a program that ends meanwhile still gets the notice

    def logdir(self, agent):
        """Where the host agent keeps this allocation's per-rank log files: a path here, or an
        AgentLogDir read through an agent on another host."""
        if agent.over_tcp:
            name = os.path.basename(_logfiles.logdir("/", self.name, self.id))
            return _logfiles.AgentLogDir(name, agent.host or agent.addr, agent.log_reader(name))
        return _logfiles.logdir(agent.runtime_dir, self.name, self.id)

    def alive_ranks(self):
        with self._cond:
            return [r for r in self.procs if r not in self.exited]

    def request_stop(self, immediately=False):
        if self.stopped:
            return
        self.stopped = True
        rt = current_runtime()
        if rt is not None:  # their lanes end with them: not a fault to report
            for p in self.procs.values():
                rt.node.expect_gone(p.addr)
        for a in {id(a): a for a in self.agents}.values():
            try:
                a.stop_procs(alloc=self.id, immediately=immediately, timeout=5)
            except Exception:
                pass

    def wait_exited(self, timeout, node):
        """Waits at most timeout seconds until every started proc has exited; one whose host
        agent the node knows lost is not waited for (no exit notice will come from it)."""
        deadline = time.monotonic() + timeout

        def agent_lost(p: ProcRecord) -> bool:
            return p.agent is not None and node.dead_reason(p.agent.addr) is not None

        with self._cond:
            while any(p.pid and r not in self.exited and not agent_lost(p) for r, p in self.procs.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True


class Lease:
    """Held by every handle on an unnamed allocation (its ProcMeshes, through them its
    ActorMeshes, and its readiness Future). When the last handle goes, the procs stop: a
    notebook that re-runs a spawning cell does not pile up procs. Named allocations have no
    lease: they outlive their handles and their controller."""

    def __init__(self, alloc):
        fin = weakref.finalize(self, _stop_unreferenced, alloc)
        fin.atexit = False  # at exit the runtime stops everything itself


def _stop_unreferenced(alloc):
    if not alloc.stopped:
        # Garbage collection can run anywhere: never block it on the host agents' replies.
        start_thread(threading.Thread(target=alloc.request_stop, name="xmesh-stop-unreferenced", daemon=True))


def addrs_list(addrs):
    out = [None] * (max(addrs) + 1 if addrs else 0)
    for r, a in addrs.items():
        out[r] = a
    return out


# -- procs that cannot answer ---------------------------------------------------------------------
def proc_at(rt: Any, addr: str) -> "tuple[Allocation, int, ProcRecord] | None":
    """The allocation, rank and record of this controller's proc at addr."""
    for alloc in rt.owned_allocs():
        for rank, p in list(alloc.procs.items()):
            if p.addr == addr:
                return alloc, rank, p
    return None


def why_not_answering(rt: Any, addr: str) -> Optional[str]:
    """"proc rank 1 of 'trainers' (pid 4242): stopped (SIGSTOP...)" for a proc of this machine
    that cannot answer for what it is doing (stopped, blocked in the kernel); None otherwise."""
    found = proc_at(rt, addr)
    if found is None:
        return None
    alloc, rank, p = found
    if not p.pid or (p.host and p.host != _HOSTNAME):
        return None
    state = unusual_state(p.pid)
    if state is None or state == "gone":  # a proc that ended is reported by its agent
        return None
    return f"proc rank {rank} of {describe_alloc(alloc)} (pid {p.pid}): {state}"


def describe_alloc(alloc: "Allocation") -> str:
    return repr(alloc.name) if alloc.name else f"allocation {alloc.id}"


_HOSTNAME = _core.hostname()
_noticed: "dict[int, set]" = {}


def _notice_stalled_targets(call: Any, description: str) -> None:
    """A wait that goes on says, once per state, which of its targets cannot answer and why."""
    rt = get_runtime()
    news = []
    seen = _noticed.setdefault(call.id, set())
    for index in call.missing():
        why = why_not_answering(rt, call.target_addr(index))
        if why and why not in seen:
            seen.add(why)
            news.append(why)
    while len(_noticed) > 64:  # only the latest calls are remembered
        _noticed.pop(next(iter(_noticed)))
    if news:
        rt.diag(f"{description} is still waiting: " + "; ".join(news))


add_slow_wait_hook(_notice_stalled_targets)
