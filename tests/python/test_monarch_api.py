"""Monarch 0.7's public actor API on xmesh (issue 19), written in Monarch's documented style
and imported from `monarch.actor`: typed futures, Extent and Point, ValueMesh's return
types, returns_future, Accumulator, and the names xmesh has not (yet)."""
import asyncio

import pytest

import monarch.actor
from monarch.actor import (
    Accumulator, Actor, Extent, Future, Point, ValueMesh, current_rank, endpoint, returns_future, this_host,
)
from xmesh._runtime.process import report_fault

# The shim's default hook stops a script on an unhandled failure, as Monarch's does; this test
# process says them and lives on (the session's agent is stopped under its controller at the end).
monarch.actor.unhandled_fault_hook = report_fault


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self) -> int:
        self.value += 1
        return self.value

    @endpoint
    def get_value(self) -> int:
        return self.value

    @endpoint
    def rank_times(self, k: int) -> int:
        return current_rank().rank * k


@pytest.fixture(scope="module")
def counters():
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    mesh = procs.spawn("counters", Counter, 10)
    mesh.initialized.get()
    yield mesh
    procs.stop()


def test_future_is_generic_and_its_value_has_monarchs_types(counters):
    fut: Future[int] = counters.slice(gpus=0).get_value.call_one()
    assert fut.get() == 10
    values: ValueMesh[int] = counters.rank_times.call(3).get()
    assert values.values() == [0, 3, 6, 9] and isinstance(values.values(), list)
    assert len(values) == 4 and values.get(2) == 6
    with pytest.raises(IndexError, match="rank 4 is out of range"):
        values.get(4)
    point, value = list(values.items())[3]
    assert (point.rank, point["gpus"], value) == (3, 3, 9)
    assert point.extent == Extent(["gpus"], [4]) and point.size("gpus") == 4
    assert values.item(gpus=1) == 3


def test_extent_and_point_as_in_monarch(counters):
    extent = Extent(["hosts", "gpus"], [2, 4])
    assert extent.labels == ["hosts", "gpus"] and extent.sizes == [2, 4] and extent.nelements == 8
    assert dict(extent) == {"hosts": 2, "gpus": 4} and extent["gpus"] == 4 and len(extent) == 2
    assert extent == {"hosts": 2, "gpus": 4} and extent != Extent(["gpus", "hosts"], [4, 2])
    point = Point(5, extent)
    assert point.rank == 5
    assert dict(point) == {"hosts": 1, "gpus": 1} and point.extent == extent and point.size("hosts") == 2
    with pytest.raises(IndexError, match="rank 8 is outside an extent of 8"):
        Point(8, extent)
    with pytest.raises(ValueError, match="one size per label"):
        Extent(["a"], [1, 2])
    assert counters.extent == Extent(["gpus"], [4]) and counters.extent == {"gpus": 4}
    import pickle
    assert pickle.loads(pickle.dumps(extent)) == extent and pickle.loads(pickle.dumps(point)) == point


@returns_future
async def total_after_increments(mesh, times: int) -> int:
    for _ in range(times):
        await mesh.incr.call()
    values = await mesh.get_value.call()
    return sum(values.values())


def test_returns_future_runs_once_when_first_observed_by_get_or_await():
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        mesh = procs.spawn("lazy", Counter, 0)
        fut = total_after_increments(mesh, 3)
        assert not fut.done()
        assert mesh.get_value.call().get().values() == [0, 0]  # nothing ran yet: it is lazy
        assert fut.get() == 6 and fut.done()
        assert fut.get() == 6  # kept, not run again
        assert asyncio.run(_await(fut)) == 6
        fut2 = total_after_increments(mesh, 1)
        assert asyncio.run(_await(fut2)) == 8 and fut2.get() == 8
    finally:
        procs.stop()


async def _await(fut):
    return await fut


def test_returns_future_errors_and_timeouts():
    @returns_future
    async def slow_then_fail(delay: float) -> None:
        await asyncio.sleep(delay)
        raise ValueError("failed after the nap")

    fut = slow_then_fail(0.5)
    with pytest.raises(TimeoutError, match="did not finish within 0.05 s"):
        fut.get(timeout=0.05)
    with pytest.raises(ValueError, match="failed after the nap"):  # the same run, finished
        fut.get()
    with pytest.raises(TypeError, match="returns_future decorates an async def"):
        returns_future(lambda: 1)


def test_accumulator_folds_a_broadcast_in_arrival_order(counters):
    total = Accumulator(counters.rank_times, 0, lambda acc, reply: acc + reply)
    assert total.accumulate(5).get() == (0 + 1 + 2 + 3) * 5
    seen = Accumulator(counters.rank_times, [], lambda acc, reply: acc + [reply])
    assert sorted(asyncio.run(_await(seen.accumulate(1)))) == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="needs an endpoint of an actor mesh"):
        Accumulator(lambda: 0, 0, max)


class _Streams:
    """Not an endpoint: an object whose stream() gives Futures, as Monarch's Accumulator takes."""

    def __init__(self, values) -> None:
        self.values = values
        self.asked = None

    def stream(self, *args, **kwargs):
        self.asked = (args, kwargs)

        async def one(v):
            return v

        return iter([Future._from_coro(one(v)) for v in self.values])


def test_accumulator_folds_any_stream_of_futures_in_order():
    streams = _Streams([1, 2, 3])
    assert Accumulator(streams, [], lambda acc, r: acc + [r]).accumulate("a", k=1).get() == [1, 2, 3]
    assert streams.asked == (("a",), {"k": 1})
    assert Accumulator(_Streams([]), 42, max).accumulate().get() == 42
    assert asyncio.run(_await(Accumulator(_Streams([4, 5]), 0, lambda a, r: a + r).accumulate())) == 9


def test_names_xmesh_lacks_say_why_instead_of_attribute_error():
    import monarch.actor as m

    with pytest.raises(NotImplementedError, match="monarch.actor.not_a_name is not supported by xmesh"):
        m.not_a_name
    with pytest.raises(NotImplementedError, match="manual worker bootstrap.*monarch.job.SlurmJob"):
        m.run_worker_loop_until_shutdown
    with pytest.raises(NotImplementedError, match="OpenTelemetry"):
        m.traced
    for name in m.__all__:
        getattr(m, name)  # every listed name exists


# What Monarch 0.7's `monarch.actor` exports (its __all__).
MONARCH_0_7_NAMES = [
    "Accumulator", "Actor", "ActorError", "as_endpoint", "attach", "attach_to_workers", "Channel", "ChannelTransport",
    "concurrent_endpoint", "config", "context", "Context", "current_actor_name", "current_rank", "current_size",
    "debug_controller", "default_bootstrap_cmd", "enable_transport", "endpoint", "Endpoint", "Extent", "Future",
    "get_meter", "get_or_spawn_controller", "HostMesh", "MeshFailure", "Point", "Port", "PortReceiver", "ProcId",
    "ProcMesh", "returns_future", "run_worker_loop_forever", "run_worker_loop_until_shutdown", "send",
    "shutdown_context", "span", "start_worker_loop_forever", "this_host", "this_proc", "traced", "Uid",
    "unhandled_fault_hook", "ValueMesh",
]


def test_every_monarch_name_is_supported_or_says_why_not():
    import monarch.actor as m

    for name in MONARCH_0_7_NAMES:
        if name in m.__all__:
            continue
        with pytest.raises(NotImplementedError) as raised:
            getattr(m, name)
        assert "(supported:" not in str(raised.value), f"{name}: no reason given: {raised.value}"


SHUTDOWN_PROGRAM = """
import os, sys
sys.path.insert(0, {here!r})
from monarch.actor import Actor, endpoint, shutdown_context, this_host

class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

print("NOTHING", shutdown_context().get())  # no controller yet: nothing to do, one can start later
procs = this_host().spawn_procs(per_host={{"gpus": 2}})
pids = procs.spawn("pid", Pid).pid.call().get().values()
assert shutdown_context(host_timeout=5).get() is None
gone = []
for pid in pids:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        gone.append(pid)
print("GONE", len(gone))
print("AGAIN", shutdown_context().get())
try:
    this_host().spawn_procs(per_host={{"gpus": 1}})
except RuntimeError as e:
    print("REFUSED", e)
try:
    shutdown_context(host_timeout=-1)
except ValueError as e:
    print("BAD", e)
"""


def test_shutdown_context_stops_the_controller_for_good():
    import os

    from xmesh_testing import run_program

    r = run_program(SHUTDOWN_PROGRAM.format(here=os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
    assert "NOTHING None" in r.stdout and "GONE 2" in r.stdout and "AGAIN None" in r.stdout, r.stdout
    assert "REFUSED this program's xmesh controller was shut down (shutdown_context())" in r.stdout, r.stdout
    assert "BAD host_timeout must be a finite number of seconds >= 0" in r.stdout, r.stdout


FAULT_HOOK_PROGRAM = """
import sys, time
sys.path.insert(0, {here!r})
import monarch.actor
from monarch.actor import MeshFailure, SupervisionError, this_host
from actors_for_tests import Counter, Printer

seen = []

def my_hook(failure: MeshFailure) -> None:
    report, text = failure.report(), str(failure)
    seen.append((failure.kind, failure.mesh_name, failure.rank, "and all its descendants have failed" in report,
                 text.startswith(f"MeshFailure(mesh_name={{failure.mesh_name}}, crashed_ranks=")))

monarch.actor.unhandled_fault_hook = my_hook
procs = this_host().spawn_procs(per_host={{"gpus": 2}})
c = procs.spawn("b", Counter)
c.slice(gpus=1).fail.broadcast("my hook")  # nobody can receive the error: the actor fails
deadline = time.time() + 30
while len(seen) < 1 and time.time() < deadline:  # before its proc is crashed below
    time.sleep(0.05)
try:
    c.slice(gpus=1).incr.call_one().get()
except SupervisionError as e:
    print("DEAD", "ValueError: my hook on rank 1" in str(e), flush=True)
p = procs.spawn("printers", Printer)
p.slice(gpus=1).crash.broadcast("bye")
while len(seen) < 2 and time.time() < deadline:
    time.sleep(0.05)
print("SEEN", sorted(seen, key=str), flush=True)
print("ALIVE", c.slice(gpus=0).incr.call_one().get(), flush=True)
procs.stop()
"""

DEFAULT_HOOK_PROGRAM = """
import atexit, sys, time
sys.path.insert(0, {here!r})
from monarch.actor import this_host
from actors_for_tests import Counter

atexit.register(lambda: print("ATEXIT RAN", flush=True))
procs = this_host().spawn_procs(per_host={{"gpus": 1}})
procs.spawn("b", Counter).fail.broadcast("default hook")
time.sleep(30)
print("NOT STOPPED", flush=True)
"""


def test_unhandled_fault_hook_default_and_replaced():
    """Monarch's unhandled_fault_hook: an actor that fails with nobody to receive the error
    (a broadcast raised) is dead for later calls, and its failure reaches the hook the program
    assigned as a MeshFailure in Monarch's words, as does a proc's death; the other rank lives."""
    import os

    from xmesh_testing import run_program

    r = run_program(FAULT_HOOK_PROGRAM.format(here=os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
    assert "my hook" not in r.stderr, r.stderr  # the program's hook took that one
    assert "DEAD True" in r.stdout, r.stdout
    assert "SEEN [('actor', 'b', 1, True, True), ('proc', " in r.stdout, r.stdout
    assert ", 1, False, True)]" in r.stdout and "ALIVE 1" in r.stdout, r.stdout


def test_the_default_fault_hook_stops_a_script_as_in_monarch():
    """The shim's default hook, as Monarch's: a failure no owner handled is said and the script
    stops (KeyboardInterrupt in its main thread, so atexit handlers run); in the kernel it lives
    on (tests/kernel)."""
    import os

    from xmesh_testing import run_program

    r = run_program(DEFAULT_HOOK_PROGRAM.format(here=os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode != 0 and "NOT STOPPED" not in r.stdout, r.stdout
    assert "ValueError: default hook on rank 0" in r.stderr, r.stderr
    assert "stopping the program, as Monarch does" in r.stderr and "ATEXIT RAN" in r.stdout, (r.stdout, r.stderr)


def test_the_default_fault_hook_stops_a_script_started_with_sigint_ignored():
    """A program started with SIGINT ignored (a child of a process that ignores it, as pytest's
    workers or nohup make) is stopped all the same: a KeyboardInterrupt in its main thread at its
    next Python instruction, atexit handlers run (Monarch's test_unhandled_fault_hook_runs_atexit)."""
    import os
    import signal
    import subprocess
    import tempfile

    from xmesh_testing import PYTHON

    source = DEFAULT_HOOK_PROGRAM.format(here=os.path.dirname(os.path.abspath(__file__)))
    source = source.replace("time.sleep(30)", "for _ in range(300):\n    time.sleep(0.1)")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    r = subprocess.run([PYTHON, f.name], capture_output=True, text=True, timeout=90,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    os.unlink(f.name)
    assert r.returncode != 0 and "NOT STOPPED" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert "KeyboardInterrupt" in r.stderr, r.stderr
    assert "stopping the program, as Monarch does" in r.stderr and "ATEXIT RAN" in r.stdout, (r.stdout, r.stderr)


RAISING_HOOK_PROGRAM = """
import sys, time
sys.path.insert(0, {here!r})
import monarch.actor
from monarch.actor import this_host
from actors_for_tests import Counter

def stop(failure):
    sys.exit(1)  # Monarch's own default

monarch.actor.unhandled_fault_hook = stop
procs = this_host().spawn_procs(per_host={{"gpus": 1}})
procs.spawn("b", Counter).fail.broadcast("stop here")
time.sleep(30)
print("NOT STOPPED")
"""


def test_a_fault_hook_that_raises_stops_a_script_as_in_monarch():
    import os

    from xmesh_testing import run_program

    r = run_program(RAISING_HOOK_PROGRAM.format(here=os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode != 0 and "NOT STOPPED" not in r.stdout
    assert "the unhandled fault hook raised SystemExit: 1; stopping the program, as Monarch does" in r.stderr, r.stderr
    assert "KeyboardInterrupt" in r.stderr


LOGGING_PROGRAM = """
import logging, sys
import monarch.actor
from monarch.actor import Actor, context, endpoint, this_host

logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s", force=True)

class Named(Actor):
    @endpoint
    def report(self) -> str:
        logging.getLogger("mine").error("from the actor")
        return repr(context().actor_instance)

procs = this_host().spawn_procs(per_host={"f": 2})
print("REPR", procs.spawn("the_name", Named).slice(f=1).report.call_one().get(), flush=True)
logging.getLogger("mine").error("from the program")
monarch.actor.config.prefix_python_logs_with_actor = False
logging.getLogger("mine").error("without the prefix")
procs.stop().get()
"""


def test_log_records_carry_the_actor_as_in_monarch():
    """With the shim imported, Python logging records made in actors (and in the program) carry
    the actor, as Monarch's do, until config.prefix_python_logs_with_actor is turned off."""
    from xmesh_testing import run_program

    r = run_program(LOGGING_PROGRAM)
    assert r.returncode == 0, r.stderr
    assert "REPR <root>.<__main__.Named the_name{'f': 1/2}>" in r.stdout, r.stdout
    assert "[actor=<root>.<__main__.Named the_name{'f': 1/2}>] from the actor" in r.stdout + r.stderr, r
    assert "ERROR [actor=<root>] from the program" in r.stdout, r.stdout
    assert "ERROR without the prefix" in r.stdout, r.stdout


def test_monarch_config_keeps_monarchs_keys_and_refuses_others():
    import monarch.config as mc

    with pytest.raises(ValueError, match="unknown configuration key\\(s\\) not_a_key"):
        mc.configure(not_a_key=1)
    before = mc.get_runtime_config()
    with pytest.warns(UserWarning, match="xmesh keeps the value but does not act on it"):
        with mc.configured(message_delivery_timeout="5s") as merged:
            assert merged["message_delivery_timeout"] == "5s"
    assert mc.get_runtime_config() == before  # configured() put the previous layer back
