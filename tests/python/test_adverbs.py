"""call, call_one, choose, stream, broadcast, futures: against one mesh of 4 real procs."""
import asyncio
import os
import time

import pytest
from actors_for_tests import Counter

import xmesh
from xmesh import this_host


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs({"gpus": 4})
    yield pm
    pm.stop()


@pytest.fixture(scope="module")
def counters(procs):
    return procs.spawn("counters", Counter, 10)


def test_spawn_then_await_initialized(procs):
    """Invariant call.2 (docs/architecture/05-call-path.md)."""
    mesh = procs.spawn("c2", Counter)
    assert mesh.initialized.get(timeout=30) is mesh
    assert asyncio.run(_await(mesh)) is mesh


async def _await(x):
    return await x


def test_call_returns_value_mesh_in_rank_order(counters):
    vm = counters.get.call().get(timeout=30)
    assert isinstance(vm, xmesh.ValueMesh)
    assert list(vm.values()) == [10, 10, 10, 10]
    assert [p.rank for p, _ in vm.items()] == [0, 1, 2, 3]
    assert [p["gpus"] for p, _ in vm] == [0, 1, 2, 3]
    assert vm.item(gpus=2) == 10
    assert len(vm) == 4


def test_state_persists_between_calls(counters):
    counters.slice(gpus=1).incr.call_one(5).get(timeout=30)
    vm = counters.get.call().get(timeout=30)
    assert vm.item(gpus=1) == 15 and vm.item(gpus=0) == 10
    counters.slice(gpus=1).incr.call_one(-5).get(timeout=30)


def test_call_one_needs_exactly_one_actor(counters):
    with pytest.raises(ValueError, match="exactly one actor"):
        counters.get.call_one()
    assert counters.slice(gpus=3).whoami.call_one().get(timeout=30)["rank"] == 3


def test_choose_picks_one_actor_and_rotates(counters):
    ranks = {counters.whoami.choose().get(timeout=30)["rank"] for _ in range(8)}
    assert len(ranks) >= 2 and ranks <= {0, 1, 2, 3}


def test_stream_yields_as_results_arrive(counters):
    order = []
    for reply in counters.sleep.stream(0.0):  # Monarch's: a Future per reply
        order.append(reply.get(timeout=30))
    assert sorted(order) == [0, 1, 2, 3]
    # rank 0 answers at once, the others after 1.5 s: the first value comes before the rest.
    gen = iter(counters.slice(gpus=slice(1, 4)).sleep.stream(1.5))
    fast = counters.slice(gpus=0).sleep.call_one(0).get(timeout=30)
    assert fast == 0
    assert sorted(f.get(timeout=30) for f in gen) == [1, 2, 3]


def test_stream_replies_are_futures_of_the_next_arrival(counters):
    stream = counters.sleep.stream(0.0)
    assert len(stream) == 4
    replies = list(stream)
    assert len(replies) == 4 and not any(r.done() for r in replies)

    async def main():
        return [await r for r in reversed(replies)]  # each takes the next reply when waited on

    assert sorted(asyncio.run(main())) == [0, 1, 2, 3] and all(r.done() for r in replies)
    slow = list(counters.slice(gpus=0).sleep.stream(1.0))[0]
    with pytest.raises(TimeoutError, match="no further reply within 0.1 s"):
        slow.get(timeout=0.1)
    assert slow.get(timeout=30) == 0  # a timeout does not consume it
    [failing] = counters.slice(gpus=1).fail.stream("streamed")
    with pytest.raises(xmesh.ActorError, match="streamed on rank 1"):
        failing.get(timeout=30)


def test_async_stream(counters):
    async def main():
        got = []
        async for v in counters.aget.stream():
            got.append(v)
        return got

    assert asyncio.run(main()) == [10, 10, 10, 10]


def test_async_endpoints_and_await(counters):
    async def main():
        vm = await counters.aget.call()
        one = await counters.slice(gpus=0).asleep.call_one(0.01)
        return list(vm.values()), one

    assert asyncio.run(main()) == ([10, 10, 10, 10], 0)


def test_broadcast_does_not_wait_and_keeps_order(counters):
    """Invariant call.1 (docs/architecture/05-call-path.md)."""
    counters.incr.broadcast(1)
    counters.incr.broadcast(1)
    # Messages from one sender arrive in order: the get sees both increments.
    assert list(counters.get.call().get(timeout=30).values()) == [12, 12, 12, 12]
    counters.incr.broadcast(-2)
    assert list(counters.get.call().get(timeout=30).values()) == [10, 10, 10, 10]


def test_future_timeout_does_not_consume_and_result_is_cached(counters):
    fut = counters.slice(gpus=0).sleep.call_one(1.0)
    with pytest.raises(TimeoutError, match="ranks still running"):
        fut.get(timeout=0.05)
    assert fut.get(timeout=30) == 0
    assert fut.get() == 0  # cached
    assert fut.done()


def test_future_rejects_a_timeout_that_is_not_seconds(counters):
    fut = counters.slice(gpus=0).get.call_one()
    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0 or None, got -1"):
        fut.get(timeout=-1)
    with pytest.raises(TypeError, match="timeout must be a number of seconds or None, got '5'"):
        fut.get(timeout="5")
    assert isinstance(fut.get(timeout=30), int)  # the future is intact


def test_cancel_sync_and_async(counters):
    fut = counters.slice(gpus=2).asleep.call_one(30)
    time.sleep(0.2)
    assert fut.cancel()
    with pytest.raises(asyncio.CancelledError):
        fut.get()
    fut2 = counters.slice(gpus=3).spin.call_one(30)
    time.sleep(0.2)
    fut2.cancel()
    with pytest.raises(asyncio.CancelledError):
        fut2.get()
    # The actors live on and are free again: without the cancellation they would still be busy
    # for 30 s and these calls would time out.
    assert counters.slice(gpus=2).get.call_one().get(timeout=10) == 10
    assert counters.slice(gpus=3).get.call_one().get(timeout=10) == 10


def test_a_cancelled_async_endpoint_answers_cancelled(counters):
    """The actor's own answer to a Cancel, without the caller failing the call first (as
    fut.cancel() does): an async endpoint cancelled in flight answers 'cancelled', not an
    endpoint error carrying concurrent.futures' CancelledError."""
    from xmesh import _core
    from xmesh._runtime.process import Kind, get_runtime

    fut = counters.slice(gpus=2).asleep.call_one(30)
    time.sleep(0.2)
    call = fut._call
    (index,) = call.missing()
    get_runtime().node.send(call.target_addr(index), int(Kind.Cancel),
                            _core.CancelBody(corr=call.id, index=index).to_dict(),
                            actor=fut.target(index).actor_id)
    with pytest.raises(asyncio.CancelledError):
        fut.get(timeout=10)
    assert counters.slice(gpus=2).get.call_one().get(timeout=10) == 10


def test_actor_mesh_and_endpoint_reprs(counters):
    assert "counters" in repr(counters) and "{'gpus': 4}" in repr(counters)
    assert "Counter.get" in repr(counters.get)
    with pytest.raises(TypeError, match="adverb"):
        counters.get()


def test_broadcast_exception_fails_the_actor_and_reaches_the_fault_hook():
    """An error nobody can receive (a broadcast's) fails its actor, as in Monarch: the program
    (xmesh's default hook) is told, both ranks' failures in one report, later calls raise
    SupervisionError saying why, and the program lives on."""
    import os

    from xmesh_testing import run_program

    r = run_program(
        "import sys, time\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "from actors_for_tests import Counter\nfrom xmesh import SupervisionError, this_host\n"
        "pm = this_host().spawn_procs({'gpus': 2})\nc = pm.spawn('b', Counter)\n"
        "c.fail.broadcast('nobody waits')\n"
        "try:\n    c.incr.call().get()\nexcept SupervisionError as e:\n"
        "    print('after broadcast:', str(e).splitlines()[0], flush=True)\n"
        "time.sleep(0.5)\nprint('lives on', flush=True)\n")
    assert r.returncode == 0, r.stderr
    assert "after broadcast: Endpoint call b.incr() failed, The actor Counter 'b' rank " in r.stdout, r.stdout
    assert "lives on" in r.stdout
    assert r.stderr.count("failed and nobody could receive the error (a broadcast, with no reply port)") == 1, r.stderr
    assert "2 failures of 'b' (ranks 0-1); the first:" in r.stderr
    assert "ValueError: nobody waits on rank 0" in r.stderr and "ValueError: nobody waits on rank 1" in r.stderr


BROADCAST_TO_A_STOPPED_PROC = """
import os, signal, sys
sys.path.insert(0, {here!r})
from actors_for_tests import Counter
from xmesh import this_host
pm = this_host().spawn_procs({{"gpus": 2}})
c = pm.spawn("c", Counter)
pid = {{v["rank"]: v["pid"] for v in c.whoami.call().get(timeout=30).values()}}[1]
os.kill(pid, signal.SIGSTOP)
try:
    for i in range(1000000):
        c.incr.broadcast()
    print("ALL SENT", flush=True)
except RuntimeError as e:
    print("RAISED", i, e, flush=True)
finally:
    os.kill(pid, signal.SIGCONT)
"""


def test_a_broadcast_that_cannot_be_sent_raises_instead_of_vanishing():
    """Issue 16, defect 8: past the send high-water mark broadcasts were dropped silently.

    Invariant protocol.3 (docs/architecture/02-protocol.md).
    """
    from xmesh_testing import run_program

    here = os.path.dirname(os.path.abspath(__file__))
    r = run_program(BROADCAST_TO_A_STOPPED_PROC.format(here=here), env={"XMESH_SEND_TIMEOUT_MS": "300"}, timeout=110)
    assert r.returncode == 0, r.stderr
    assert "RAISED" in r.stdout, r.stdout
    assert "incr.broadcast() did not reach Counter 'c' rank 1" in r.stdout and "timed out" in r.stdout
