"""Owners and orphans across procs (issue 44; docs/architecture/13-actor-lifecycle.md, invariants
life.4-6): a proc that dies under a mesh an actor owns reaches that actor's __supervise__ (an
unhandled one fails it, up to the program); an actor whose owner's proc died ends, and its
callers hear why; a stop does not wait forever for an actor that never returns."""
import os
import signal
import threading
import time

import pytest

from xmesh import Actor, SupervisionError, endpoint, this_host
from xmesh_testing import run_program, wait_until


class Leaf(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def ping(self) -> str:
        return "pong"


class Owner(Actor):
    """Spawns Leaf on the procs it is given (or on procs of its own); records what it is told."""

    def __init__(self, given, handle: bool) -> None:
        self.procs = given if given is not None else this_host().spawn_procs({"gpus": 2})
        self.leaves = self.procs.spawn("leaves", Leaf)
        self.handle = handle
        self.seen = []

    @endpoint
    def leaf_pids(self) -> list:
        return sorted(self.leaves.pid.call().get().values())

    @endpoint
    def leaves_mesh(self):
        return self.leaves

    @endpoint
    def seen_failures(self) -> list:
        return list(self.seen)

    @endpoint
    def die_hard(self) -> None:
        os._exit(1)

    def __supervise__(self, failure) -> bool:
        self.seen.append((failure.mesh_name, failure.crashed_ranks, failure.report()))
        return self.handle


def test_a_killed_proc_under_an_owned_mesh_reaches_the_owner(failures):
    """Invariant life.4 (docs/architecture/13-actor-lifecycle.md):
    the owner of an actor mesh hears, in __supervise__, of each rank
    whose proc died, whoever started the procs (here the program); handled, the program hears
    nothing of the actors (the proc's death itself is still the program's news)."""
    owners, given = this_host().spawn_procs({"gpus": 1}), this_host().spawn_procs({"gpus": 2})
    try:
        o = owners.spawn("owner", Owner, given, True)
        pids = o.leaf_pids.call_one().get(timeout=60)
        os.kill(pids[1], signal.SIGKILL)
        assert wait_until(lambda: o.seen_failures.call_one().get(timeout=30), timeout=30)
        time.sleep(0.3)  # no second event comes for the same death
        seen = o.seen_failures.call_one().get(timeout=30)
        assert len(seen) == 1, seen
        mesh, ranks, report = seen[0]
        assert mesh == "leaves" and len(ranks) == 1
        assert "The actor Leaf 'leaves' rank" in report and "its proc died" in report and "SIGKILL" in report
        assert o.seen_failures.call_one().get(timeout=30) == seen  # the owner lives on
    finally:
        owners.stop().get()
        given.stop().get()


def test_an_actor_owned_proc_mesh_dies_unhandled_and_the_program_hears_the_chain(failures):
    """Invariant life.4 (docs/architecture/13-actor-lifecycle.md):
    procs an actor started itself are its own to supervise; not handled, the owner
    fails and its failure reaches the program's hook, naming the child's death."""
    owners = this_host().spawn_procs({"gpus": 1})
    try:
        o = owners.spawn("owner", Owner, None, False)
        pids = o.leaf_pids.call_one().get(timeout=60)
        os.kill(pids[0], signal.SIGKILL)
        assert wait_until(lambda: any(f.mesh_name == "owner" for f in failures), timeout=30), failures
        report = next(f for f in failures if f.mesh_name == "owner").report()
        assert "did not handle a supervision event from its child" in report and "its proc died" in report
        with pytest.raises(SupervisionError, match="did not handle a supervision event"):
            o.seen_failures.call_one().get(timeout=30)
    finally:
        owners.stop().get()


def test_an_orphan_ends_when_its_owners_proc_dies(failures):
    """Invariant life.5 (docs/architecture/13-actor-lifecycle.md):
    when the proc of the actor that spawned a mesh dies, that mesh's
    actors end (nothing could supervise them), and calls to them say why, in xmesh's words and
    in Monarch's; a mesh the owner had stopped before says it too."""
    owners, given = this_host().spawn_procs({"gpus": 1}), this_host().spawn_procs({"gpus": 1})
    try:
        o = owners.spawn("owner", Owner, given, True)
        leaves = o.leaves_mesh.call_one().get(timeout=60)
        assert leaves.ping.call_one().get(timeout=30) == "pong"  # called directly, from the program
        with pytest.raises(SupervisionError):
            o.die_hard.call_one().get(timeout=30)

        def leaf_ended() -> bool:
            try:
                leaves.ping.call_one().get(timeout=30)
                return False
            except SupervisionError as e:
                return "is gone: its proc" in str(e)

        assert wait_until(leaf_ended, timeout=30)
        with pytest.raises(SupervisionError, match="timed out reaching controller.*for mesh leaves") as info:
            leaves.ping.call_one().get(timeout=30)
        assert "has status: stopped" in str(info.value) and "its owner, an actor of mesh 'owner'," in str(info.value)
        assert given.allocation.alive_ranks() == [0]  # the proc lives on; only the orphan ended
    finally:
        owners.stop().get()
        given.stop().get()


class Stuck(Actor):
    """Its __init__ or an endpoint blocks until the proc ends (a gate nobody opens)."""

    def __init__(self, block_init: bool) -> None:
        if block_init:
            threading.Event().wait()

    @endpoint
    def block(self) -> None:
        threading.Event().wait()

    @endpoint
    def ping(self) -> str:
        return "pong"


class StuckInCleanup(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc) -> None:
        threading.Event().wait()


def test_a_stop_does_not_wait_forever_for_a_busy_actor():
    """Invariant life.6 (docs/architecture/13-actor-lifecycle.md):
    stop() waits for the message an actor runs at most the stop grace
    (XMESH_STOP_GRACE_MS); then the actor is stopped from outside: the stop returns, the running
    call's caller and later callers hear it was stopped while busy; other actors are untouched."""
    pm = this_host().spawn_procs({"gpus": 1})
    try:
        in_init = pm.spawn("in_init", Stuck, True)
        in_call = pm.spawn("in_call", Stuck, False)
        fine = pm.spawn("fine", Stuck, False)
        running = in_call.block.call_one()
        assert wait_until(lambda: not running.done() and fine.ping.call_one().get(timeout=30) == "pong", timeout=30)
        in_init.stop().get(timeout=30)
        in_call.stop().get(timeout=30)
        with pytest.raises(SupervisionError, match=r"busy in block\(\) for more than"):
            running.get(timeout=30)
        with pytest.raises(SupervisionError, match="busy in __init__"):
            in_init.ping.call_one().get(timeout=30)
        with pytest.raises(SupervisionError, match="has status: stopped"):
            in_call.ping.call_one().get(timeout=30)
        assert fine.ping.call_one().get(timeout=30) == "pong"
        cleaning = pm.spawn("cleaning", StuckInCleanup)
        assert cleaning.ping.call_one().get(timeout=30) == "pong"
        cleaning.stop().get(timeout=30)  # its __cleanup__ never returns: the stop does
        with pytest.raises(SupervisionError, match=r"busy in ending \(its __cleanup__"):
            cleaning.ping.call_one().get(timeout=30)
    finally:
        pm.stop().get()


BURST_PROGRAM = """
import time
from xmesh import Actor, endpoint, this_host

class Flaky(Actor):
    @endpoint
    def fail(self, odd_differs: bool) -> None:
        from xmesh import current_rank
        rank = current_rank().rank
        raise (KeyError if odd_differs and rank % 2 else ValueError)(f"rank {rank} gave up")

pm = this_host().spawn_procs({"gpus": 4})
pm.spawn("flaky", Flaky).fail.broadcast(True)
time.sleep(3)
print("alive")
"""


def test_the_default_says_a_meshs_failures_together_once():
    """With no fault hook installed, the ranks of one mesh that failed together are said once: the
    first report whole, the others by how they ended (a hook still gets one per rank: above)."""
    result = run_program(BURST_PROGRAM, timeout=90)
    assert result.returncode == 0 and result.stdout.strip() == "alive", result.stderr
    err = result.stderr
    assert err.count("and all its descendants have failed") == 1, err
    assert "4 failures of 'flaky' (ranks 0-3); the first:" in err
    first = err.split("the first:")[1].split("the others:")[0]
    ended = "ValueError" if "ValueError: rank" in first else "KeyError"
    others = err.split("the others:")[1]
    assert "ValueError: rank" in others and "KeyError: 'rank" in others and ended in first, err
    assert sum(others.count(f"rank {r} gave up") for r in range(4)) == 3, err


def test_a_burst_summary_groups_ranks_by_outcome():
    from xmesh._base.errors import MeshFailure
    from xmesh._runtime.fault_reports import summary

    fails = [MeshFailure("m", f"report of {r}\n  Traceback...\nValueError: {'x' if r < 3 else 'y'}", "actor", r)
             for r in (0, 1, 2, 5)]
    text = summary(fails)
    assert text.startswith("4 failures of 'm' (ranks 0-2,5); the first:\nreport of 0")
    assert text.endswith("the others:\n  ranks 1-2: ValueError: x\n  rank 5: ValueError: y")
    assert summary(fails[:1]) == fails[0].report()
    # Procs that all ended alike (stopped by the panel, one signal) are one line.
    stopped = [MeshFailure("grid", f"proc rank {r} (pid {100 + r} on vm) was stopped: by the xmesh panel", "proc", r)
               for r in range(4)]
    assert summary(stopped) == "'grid' (ranks 0-3): each proc was stopped: by the xmesh panel"
    killed = stopped[:2] + [MeshFailure("grid", "proc rank 2 (pid 9 on vm) was killed by SIGKILL", "proc", 2)]
    assert summary(killed).endswith("the others:\n  rank 1: was stopped: by the xmesh panel\n"
                                    "  rank 2: was killed by SIGKILL")
