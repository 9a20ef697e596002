"""Actors' lives as Monarch defines them (issue 44; docs/architecture/13-actor-lifecycle.md): what
ends an actor, what its callers and its owner hear, __supervise__ up the chain of owners,
__cleanup__ after its concurrent calls, a proc mesh's stop finalizing Python in the procs,
__init__ on the loop of an all-async actor, abort(), and Monarch's sync/async rule."""
import asyncio
import os
import threading
import time

import pytest

from xmesh import Actor, ActorError, SupervisionError, concurrent_endpoint, context, endpoint, this_host
from xmesh._runtime.process import set_unhandled_fault_hook
from xmesh_testing import read, run_program, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


class Boom(BaseException):
    """Not an Exception: it ends the actor that raises it."""


class Fragile(Actor):
    def __init__(self, fail_init: bool = False) -> None:
        if fail_init:
            raise ValueError("no start")
        self.calls = 0

    @endpoint
    def ok(self) -> int:
        self.calls += 1
        return self.calls

    @endpoint
    def raises(self, text: str) -> None:
        raise ValueError(text)

    @endpoint
    def base(self) -> None:
        raise Boom("a base exception")

    @endpoint
    def slow(self, s: float) -> str:
        time.sleep(s)
        return "slept"

    @endpoint(explicit_response_port=True)
    def by_port(self, port, fail: bool) -> None:
        if fail:
            raise ValueError("raised instead of answering")
        port.send("answered")

    @endpoint
    def abort(self, reason) -> str:
        context().actor_instance.abort(reason)
        return "aborting"


class AsyncFragile(Actor):
    def __init__(self) -> None:
        self.local = threading.local()
        self.local.seen = "set in __init__"

    @endpoint
    async def base(self) -> None:
        raise Boom("async base exception")

    @endpoint
    async def tls(self) -> str:
        return self.local.seen

    @concurrent_endpoint(explicit_response_port=True)
    async def by_port(self, port) -> None:
        raise ValueError("concurrent raised instead of answering")


def test_an_error_nobody_receives_fails_the_actor_and_its_owner_hears(failures):
    """Invariant life.1 (docs/architecture/13-actor-lifecycle.md):
    a broadcast whose endpoint raised fails the actor, once per rank to
    its owner (here the program's hook); an error its caller receives leaves it serving."""
    pm = this_host().spawn_procs({"gpus": 2})
    try:
        f = pm.spawn("fragile", Fragile)
        with pytest.raises(ActorError, match="Actor call fragile.raises failed") as caught:
            f.slice(gpus=0).raises.call_one("the caller gets this").get(timeout=30)
        assert not isinstance(caught.value, SupervisionError)
        assert f.slice(gpus=0).ok.call_one().get(timeout=30) == 1  # it lives on
        f.raises.broadcast("nobody receives this")
        queued = f.ok.call()  # behind the broadcast: answered with the failure
        with pytest.raises(SupervisionError) as dead:
            queued.get(timeout=30)
        text = str(dead.value)
        assert isinstance(dead.value, RuntimeError) and dead.value.endpoint == "fragile.ok()"
        assert text.startswith("Endpoint call fragile.ok() failed, The actor Fragile 'fragile' rank ")
        assert "and all its descendants have failed:" in text and "ValueError: nobody receives this" in text
        assert wait_until(lambda: len(failures) >= 2, timeout=30), failures
        assert sorted(f.rank for f in failures) == [0, 1] and {f.mesh_name for f in failures} == {"fragile"}
        assert all(str(f).startswith(f"MeshFailure(mesh_name=fragile, crashed_ranks=[{f.rank}], event=The actor")
                   for f in failures)
        with pytest.raises(SupervisionError, match="nobody could receive the error"):
            f.slice(gpus=1).ok.call_one().get(timeout=30)
    finally:
        pm.stop().get()


def test_a_base_exception_fails_the_actor_for_every_later_call(failures):
    """Invariant life.1 (docs/architecture/13-actor-lifecycle.md):
    a BaseException (sync or async endpoint) fails the actor: its caller,
    the calls queued behind it and later calls get a SupervisionError; other ranks live."""
    pm = this_host().spawn_procs({"gpus": 2})
    try:
        for cls in (Fragile, AsyncFragile):
            a = pm.spawn(f"base_{cls.__name__.lower()}", cls)
            rank0 = a.slice(gpus=0)
            first = rank0.base.call_one()
            behind = rank0.base.call_one()
            for fut in (first, behind):
                ends = "failed with BaseException \\(Boom\\), which ends the actor"
                with pytest.raises(SupervisionError, match=ends):
                    fut.get(timeout=30)
            if cls is Fragile:
                assert a.slice(gpus=1).ok.call_one().get(timeout=30) == 1
        assert wait_until(lambda: len(failures) >= 2, timeout=30)
    finally:
        pm.stop().get()


def test_explicit_port_raise_fails_the_actor(failures):
    """Invariant life.1 (docs/architecture/13-actor-lifecycle.md):
    an explicit-port endpoint (plain or concurrent) that raises instead of
    answering fails its actor; its caller hears the report. Answering keeps it alive."""
    pm = this_host().spawn_procs({"gpus": 1})
    try:
        f = pm.spawn("ports", Fragile)
        assert f.by_port.call_one(False).get(timeout=30) == "answered"
        with pytest.raises(SupervisionError, match="raised instead of answering"):
            f.by_port.call_one(True).get(timeout=30)
        c = pm.spawn("concurrent_ports", AsyncFragile)
        with pytest.raises(SupervisionError, match="concurrent raised instead of answering"):
            c.by_port.call_one().get(timeout=30)
    finally:
        pm.stop().get()


def test_a_failing_init_reaches_the_owner_without_any_call(failures):
    pm = this_host().spawn_procs({"gpus": 2})
    try:
        pm.spawn("no_start", Fragile, True)
        assert wait_until(lambda: len(failures) >= 2, timeout=30), failures
        assert all("__init__ raised" in f.report() and "ValueError: no start" in f.report() for f in failures)
    finally:
        pm.stop().get()


class Parent(Actor):
    """Owns a mesh of Fragile on the procs it is given; handles its failures when told to."""

    def __init__(self, procs, handle: bool) -> None:
        self.child = procs.spawn("child", Fragile)
        self.handle = handle
        self.seen = []

    @endpoint
    def child_broadcast_fails(self) -> None:
        self.child.ok.call().get()
        self.child.raises.broadcast("child failed")

    @endpoint
    def seen_failures(self) -> list:
        return list(self.seen)

    def __supervise__(self, failure) -> bool:
        self.seen.append((str(failure), failure.report()))
        return self.handle


class AsyncParent(Parent):
    @endpoint
    async def wait_for_child_failure(self, s: float) -> str:
        self.child.raises.broadcast("child failed")
        await asyncio.sleep(s)  # __supervise__ runs beside this, on the loop
        return "slept"

    @endpoint
    async def seen_failures(self) -> list:  # type: ignore[override]
        return list(self.seen)

    @endpoint
    async def child_broadcast_fails(self) -> None:  # type: ignore[override]
        self.child.raises.broadcast("child failed")

    @endpoint
    async def children_fail_in_a_call(self) -> str:
        try:
            await self.child.base.call()
        except SupervisionError:
            return "raised"
        return "no error"

    async def __supervise__(self, failure) -> bool:  # type: ignore[override]
        await asyncio.sleep(0)
        self.seen.append((str(failure), failure.report()))
        return self.handle


def test_supervise_handles_a_child_failure(failures):
    """Invariant life.2 (docs/architecture/13-actor-lifecycle.md):
    the failure goes to the actor that spawned the failed mesh (not to
    the program); returning True handles it and the owner serves on."""
    parents, children = this_host().spawn_procs({"gpus": 1}), this_host().spawn_procs({"gpus": 2})
    try:
        for cls in (Parent, AsyncParent):
            p = parents.spawn(f"parent_{cls.__name__.lower()}", cls, children, True)
            p.child_broadcast_fails.call_one().get(timeout=30)
            assert wait_until(lambda: len(p.seen_failures.call_one().get(timeout=30)) >= 2, timeout=30)
            seen = p.seen_failures.call_one().get(timeout=30)
            assert sorted(s for s, _ in seen)[0].startswith("MeshFailure(mesh_name=child, crashed_ranks=[0], event=")
            assert all("ValueError: child failed" in report for _, report in seen)
        time.sleep(0.5)
        assert failures == []  # handled: the program heard nothing
    finally:
        parents.stop().get()
        children.stop().get()


def test_a_call_that_fails_its_actors_raises_after_their_owner_heard_of_each(failures):
    """Invariant life.2 (docs/architecture/13-actor-lifecycle.md):
    a call on four actors that all fail raises once every rank
    answered (only a dead proc ends a call early), so their owner has heard of all four by then."""
    parents, children = this_host().spawn_procs({"gpus": 1}), this_host().spawn_procs({"gpus": 4})
    try:
        p = parents.spawn("owner_of_four", AsyncParent, children, True)
        assert p.children_fail_in_a_call.call_one().get(timeout=60) == "raised"
        seen = p.seen_failures.call_one().get(timeout=30)  # no waiting: all four are there
        assert sorted(text.split("crashed_ranks=")[1][:3] for text, _ in seen) == ["[0]", "[1]", "[2]", "[3]"]
    finally:
        parents.stop().get()
        children.stop().get()


def test_an_unhandled_child_failure_fails_the_owner_and_reaches_the_hook(failures):
    """Invariant life.2 (docs/architecture/13-actor-lifecycle.md):
    an owner that does not handle its child's failure fails in turn (a
    call running in an async owner ends with it) and the program's hook hears the chain."""
    parents, children = this_host().spawn_procs({"gpus": 1}), this_host().spawn_procs({"gpus": 1})
    try:
        p = parents.spawn("unhandled", AsyncParent, children, False)
        with pytest.raises(SupervisionError) as info:
            p.wait_for_child_failure.call_one(20).get(timeout=30)
        text = str(info.value)
        assert "AsyncParent 'unhandled' rank 0" in text and "did not handle a supervision event from its child" in text
        assert "The actor Fragile 'child' rank 0" in text and "ValueError: child failed" in text
        sync_parent = parents.spawn("unhandled_sync", Parent, children, False)
        sync_parent.child_broadcast_fails.call_one().get(timeout=30)
        errors = []

        def parent_failed() -> bool:
            try:
                sync_parent.seen_failures.call_one().get(timeout=30)
                return False
            except SupervisionError as e:
                errors.append(str(e))
                return True

        assert wait_until(parent_failed, timeout=30)
        assert "Parent 'unhandled_sync' rank 0" in errors[0] and "did not handle" in errors[0]
        assert wait_until(lambda: {f.mesh_name for f in failures} == {"unhandled", "unhandled_sync"}, timeout=30)
    finally:
        parents.stop().get()
        children.stop().get()


CLEANUP_ACTOR = """
import asyncio
from xmesh import Actor, concurrent_endpoint, endpoint

class Cleans(Actor):
    def __init__(self, path):
        self.file = open(path, "w")
        self.gate = asyncio.Event()

    @concurrent_endpoint(explicit_response_port=True)
    async def hold(self, port):
        port.send("started")
        try:
            await self.gate.wait()
        finally:
            self.file.write("task ended\\n")
            self.file.flush()

    async def __cleanup__(self, exc):
        self.file.write(f"cleanup {exc}\\n")
        self.file.close()
"""


def test_stop_cancels_concurrent_calls_then_cleans_up(tmp_path, monkeypatch):
    """Invariant life.3 (docs/architecture/13-actor-lifecycle.md):
    ActorMesh.stop() cancels the running concurrent call, which ends
    first, then __cleanup__(None) runs, once; later calls hear it was stopped."""
    (tmp_path / "cleans.py").write_text(CLEANUP_ACTOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    from cleans import Cleans

    pm = this_host().spawn_procs({"gpus": 1})
    try:
        out = tmp_path / "order.txt"
        c = pm.spawn("cleans", Cleans, str(out))
        assert c.hold.call_one().get(timeout=30) == "started"
        c.stop().get()
        assert wait_until(lambda: out.exists() and read(str(out)).count("\n") == 2, timeout=30), read(str(out))
        assert read(str(out)) == "task ended\ncleanup None\n"
        with pytest.raises(SupervisionError, match="has status: stopped \\(its actor mesh was stopped"):
            c.hold.call_one().get(timeout=30)
    finally:
        pm.stop().get()


FINALIZE_PROGRAM = """
import atexit, os, sys
sys.path.insert(0, {here!r})
from xmesh import Actor, endpoint, this_host

class Leaves(Actor):
    def __init__(self, directory):
        import finalizing
        finalizing.keep(directory)
        atexit.register(lambda: open(os.path.join(directory, "atexit"), "w").write("ran"))

    @endpoint
    def pid(self):
        return os.getpid()

pm = this_host().spawn_procs({{"gpus": 1}})
pid = pm.spawn("leaves", Leaves, {directory!r}).pid.call_one().get()
pm.stop().get()
print("STOPPED", pid, flush=True)
"""

FINALIZING_MODULE = """
import os

class Marker:
    def __init__(self, directory):
        self.file = open(os.path.join(directory, "finalized"), "w")  # open() is gone at finalization

    def __del__(self):
        self.file.write("ran")
        self.file.close()

kept = None

def keep(directory):
    global kept
    kept = Marker(directory)
"""


def test_proc_mesh_stop_finalizes_python_in_the_procs(tmp_path):
    """Invariant life.3 (docs/architecture/13-actor-lifecycle.md):
    ProcMesh.stop() lets the procs' Python exit normally: atexit handlers
    and the finalizers of module globals run."""
    (tmp_path / "finalizing.py").write_text(FINALIZING_MODULE)
    r = run_program(FINALIZE_PROGRAM.format(here=str(tmp_path), directory=str(tmp_path)))
    assert r.returncode == 0 and "STOPPED" in r.stdout, r.stderr
    pid = int(r.stdout.split("STOPPED")[1].split()[0])
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), timeout=30)
    assert read(str(tmp_path / "atexit")) == "ran"
    assert read(str(tmp_path / "finalized")) == "ran"


def test_an_all_async_actor_runs_init_on_its_loop():
    pm = this_host().spawn_procs({"gpus": 1})
    try:
        assert pm.spawn("tls", AsyncFragile).tls.call_one().get(timeout=30) == "set in __init__"
    finally:
        pm.stop().get()


def test_abort_fails_the_actor_with_its_reason(failures):
    pm = this_host().spawn_procs({"gpus": 1})
    try:
        f = pm.spawn("aborts", Fragile)
        assert f.abort.call_one("enough").get(timeout=30) == "aborting"
        with pytest.raises(SupervisionError, match="aborted itself .*: enough"):
            f.ok.call_one().get(timeout=30)
        g = pm.spawn("aborts_quietly", Fragile)
        g.abort.call_one(None).get(timeout=30)
        assert wait_until(lambda: any("no reason provided" in x.report() for x in failures), timeout=30)
        with pytest.raises(RuntimeError, match="the client is not an actor that can abort"):
            context().actor_instance.abort("from the program")
    finally:
        pm.stop().get()


def test_monarch_actors_keep_monarch_rule_on_sync_and_async_endpoints():
    import monarch.actor

    class Mixed(monarch.actor.Actor):
        @endpoint
        def a(self) -> None:
            pass

        @endpoint
        async def b(self) -> None:
            pass

    class XmeshMixed(Actor):
        @endpoint
        def a(self) -> int:
            return 1

        @endpoint
        async def b(self) -> int:
            return 2

    set_unhandled_fault_hook(None)  # importing the shim installed Monarch's default, which stops a script
    pm = this_host().spawn_procs({"gpus": 1})
    try:
        with pytest.raises(ValueError, match="mixes both async and sync endpoints"):
            pm.spawn("mixed", Mixed)
        m = pm.spawn("xmesh_mixed", XmeshMixed)  # xmesh's own Actor may mix them
        assert (m.a.call_one().get(timeout=30), m.b.call_one().get(timeout=30)) == (1, 2)
    finally:
        pm.stop().get()


class Leaf(Actor):
    def __init__(self, counter) -> None:
        self.counter = counter

    @endpoint
    def pid(self) -> int:
        print("leaf here", flush=True)
        return os.getpid()

    def __cleanup__(self, exc) -> None:
        self.counter.incr.call_one().get()


class Tally(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def incr(self) -> None:
        self.n += 1

    @endpoint
    def value(self) -> int:
        return self.n


class Spawner(Actor):
    """Spawns procs of its own and actors on them, and actors on procs it is given."""

    def __init__(self, given, counter) -> None:
        self.procs = this_host().spawn_procs({"gpus": 2})
        self.own = self.procs.spawn("own_leaves", Leaf, counter)
        self.on_given = given.spawn("given_leaves", Leaf, counter)

    @endpoint
    def pids(self) -> list:
        return sorted(self.own.pid.call().get().values()) + sorted(self.on_given.pid.call().get().values())


def test_an_actor_spawns_procs_and_its_meshes_end_with_it():
    """An actor's this_host().spawn_procs() gives it procs of its own (their output comes out
    through its proc); when it stops, the actor meshes it spawned stop (their __cleanup__ runs)
    and so do its procs."""
    procs = this_host().spawn_procs({"gpus": 1})
    given = this_host().spawn_procs({"gpus": 1})
    try:
        counter = procs.spawn("tally", Tally)
        s = procs.spawn("spawner", Spawner, given, counter)
        pids = s.pids.call_one().get(timeout=60)
        assert len(set(pids)) == 3 and os.getpid() not in pids
        s.stop().get()
        assert wait_until(lambda: counter.value.call_one().get(timeout=30) == 3, timeout=30)  # 2 own + 1 given
        own = pids[:2]
        assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in own), timeout=30)
        assert os.path.exists(f"/proc/{pids[2]}")  # the given procs are not the spawner's: they live on
    finally:
        given.stop().get()
        procs.stop().get()
