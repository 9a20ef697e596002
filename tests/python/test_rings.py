"""Same-host calls over shared-memory rings (issue 23, runtime/ring_links.*): calls and replies
between a controller and its procs switch to rings after the first exchange; a slow actor
behind a small ring never loses or reorders a message and its inbox stays bounded; arguments and
results far larger than a ring cross it whole; a proc killed while holding rings fails its calls
with a SupervisionError and its rings are reclaimed; a proc whose code scribbles on the rings'
shared headers neither crashes the controller nor strands the call in flight (it fails naming the
link, later calls go on and a new ring comes up); XMESH_RINGS=0 keeps ZeroMQ alone."""
import json
import os
import signal
import time

import pytest
from xmesh_testing import run_program, wait_until

import xmesh
from xmesh import ActorError, SupervisionError
from xmesh._runtime.process import get_runtime


class Probe(xmesh.Actor):
    def __init__(self) -> None:
        self.seen: list = []
        self.deepest = 0

    @xmesh.endpoint
    def echo(self, value):
        return value

    @xmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @xmesh.endpoint
    def stats(self) -> dict:
        s = get_runtime().node.stats()
        return {"rings_in": s.rings_in, "rings_out": s.rings_out, "ring_received": s.ring_received}

    @xmesh.endpoint
    def record(self, n: int, pad: bytes, delay: float) -> None:
        import threading

        self.seen.append((n, len(pad)))
        self.deepest = max(self.deepest, len(threading.current_thread().inbox))
        time.sleep(delay)

    @xmesh.endpoint
    def recorded(self) -> dict:
        return {"seen": self.seen, "deepest": self.deepest}

    @xmesh.endpoint
    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass

    @xmesh.endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"

    @xmesh.endpoint
    def scribble_later(self, delay: float, offset: int, value: int) -> int:
        """What a buggy native library of this proc might do: after `delay`, write `value` at
        `offset` of every ring header this process maps (both directions). How many it found."""
        import ctypes
        import threading

        starts = []
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "memfd:xmesh-link" in line:
                    starts.append(int(line.split("-", 1)[0], 16))

        def scribble() -> None:
            time.sleep(delay)
            for start in starts:
                ctypes.c_uint64.from_address(start + offset).value = value

        if delay > 0:
            threading.Thread(target=scribble, daemon=True).start()
        else:
            scribble()
        return len(starts)


def _stats():
    return get_runtime().node.stats()


def test_calls_and_replies_switch_to_rings():
    pm = xmesh.this_host().spawn_procs({"gpus": 2})
    probes = pm.spawn("ring_probe", Probe)
    assert list(probes.echo.call(1).get(timeout=60).values()) == [1, 1]
    before = _stats()
    for i in range(50):
        assert probes.slice(gpus=i % 2).echo.call_one(i).get(timeout=30) == i
    after = _stats()
    assert after.ring_sent - before.ring_sent >= 50  # the calls went over the rings
    assert after.ring_received - before.ring_received >= 50  # and so did the replies
    assert after.rings_out >= 2 and after.rings_in >= 2
    for s in probes.stats.call().get(timeout=30).values():
        assert s["rings_in"] >= 1 and s["rings_out"] >= 1 and s["ring_received"] >= 25  # each proc took half
    pm.stop()


def test_large_arguments_and_results_cross_the_rings_whole():
    pm = xmesh.this_host().spawn_procs({"gpus": 1})
    probe = pm.spawn("ring_big", Probe)
    probe.echo.call_one(0).get(timeout=60)
    before = _stats().ring_sent
    for size in (200_000, 3_000_000):  # past the ring's largest record (half of 256 KiB)
        blob = os.urandom(size)
        assert probe.echo.call_one(blob).get(timeout=60) == blob
    assert _stats().ring_sent > before
    pm.stop()


def test_a_proc_killed_while_holding_rings_fails_its_calls_and_its_rings_go():
    pm = xmesh.this_host().spawn_procs({"gpus": 2})
    probes = pm.spawn("ring_victims", Probe)
    pids = list(probes.pid.call().get(timeout=60).values())
    probes.echo.call(0).get(timeout=30)
    links = _stats().rings_out
    busy = probes.slice(gpus=0).spin.call_one(30)
    time.sleep(0.2)
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(SupervisionError):
        busy.get(timeout=20)
    with pytest.raises(SupervisionError):
        probes.slice(gpus=0).echo.call_one(1).get(timeout=5)
    assert probes.slice(gpus=1).echo.call_one(2).get(timeout=30) == 2
    # The dead proc's links are closed and forgotten; the other's stay.
    assert wait_until(lambda: _stats().rings_out == links - 1 and _stats().rings_in == links - 1, timeout=10)
    pm.stop()


SLOW_ACTOR = r"""
import json, sys
sys.path.insert(0, {here!r})
import xmesh
from test_rings import Probe
pm = xmesh.this_host().spawn_procs({{"gpus": 1}})
probe = pm.spawn("slow", Probe)
for i in range(3):  # the links are up once the first exchanges are answered
    probe.echo.call_one(i).get(timeout=60)
for n in range(1500):
    pad = b"x" * (5000 if n % 50 == 0 else 10)   # some past the 4 KiB ring's largest record
    probe.record.broadcast(n, pad, 0.002 if n < 100 else 0.0)
out = probe.recorded.call_one().get(timeout=100)
from xmesh._runtime.process import get_runtime
out["ring_sent"] = get_runtime().node.stats().ring_sent
print(json.dumps(out))
pm.stop()
"""


def test_a_slow_actor_behind_a_small_ring_loses_and_reorders_nothing_and_stays_bounded():
    here = os.path.dirname(os.path.abspath(__file__))
    r = run_program(SLOW_ACTOR.format(here=here), env={"XMESH_RING_BYTES": "4096", "XMESH_INBOX_LIMIT": "20"},
                    timeout=110)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [n for n, _ in out["seen"]] == list(range(1500))
    assert [size for _, size in out["seen"]][:51:50] == [5000, 5000]
    assert out["ring_sent"] >= 1500
    assert out["deepest"] <= 21  # the ring held the caller back; the inbox never grew past the limit


# Where the shared header keeps what: the capacity at byte 8, the writer's position at 64, the
# reader's at 128 (runtime/transport/shm_ring.cpp).
@pytest.mark.parametrize("field,offset,value", [("writer position", 64, 1 << 62), ("reader position", 128, 1 << 40)])
def test_a_ring_scribbled_on_fails_the_call_in_flight_and_calls_go_on(field, offset, value):
    pm = xmesh.this_host().spawn_procs({"gpus": 1})
    probe = pm.spawn("scribbled", Probe)
    for i in range(5):
        assert probe.echo.call_one(i).get(timeout=60) == i
    assert probe.scribble_later.call_one(0.3, offset, value).get(timeout=30) >= 2
    in_flight = probe.sleep.call_one(1.5)
    with pytest.raises(ActorError, match="shared-memory link .* broke"):
        in_flight.get(timeout=30)  # failed naming why, never stranded
    # Both directions were scribbled on: a call sent before the proc found its side broken was on
    # that ring too, and fails the same way. None hangs; once both ends know, calls go on.
    for attempt in range(5):
        try:
            assert probe.echo.call_one("after").get(timeout=30) == "after"
            break
        except ActorError as e:
            assert "shared-memory link" in str(e) and "broke" in str(e), e
    else:
        raise AssertionError("calls kept failing after the break")
    before = _stats().ring_sent
    assert [probe.echo.call_one(i).get(timeout=30) for i in range(30)] == list(range(30))
    # A new ring comes up (its switch rides on a call after the proc accepted it).
    assert wait_until(lambda: probe.echo.call_one(1).get(timeout=30) == 1 and _stats().rings_out == 1, timeout=10)
    assert _stats().ring_sent > before
    pm.stop()


def test_a_ring_capacity_rewritten_by_the_proc_bounds_nothing():
    pm = xmesh.this_host().spawn_procs({"gpus": 1})
    probe = pm.spawn("resized", Probe)
    probe.echo.call_one(0).get(timeout=60)
    assert probe.scribble_later.call_one(0.0, 8, 1 << 30).get(timeout=30) >= 2
    before = _stats().ring_sent
    for size in (10, 100_000, 3_000_000):  # records round the 256 KiB ring many times over
        blob = os.urandom(size)
        assert probe.echo.call_one(blob).get(timeout=60) == blob
    assert _stats().ring_sent > before  # still over the same rings: each side kept its own capacity
    pm.stop()


def test_rings_off_keeps_zeromq():
    here = os.path.dirname(os.path.abspath(__file__))
    program = (f"import sys; sys.path.insert(0, {here!r})\n"
               "import xmesh\nfrom test_rings import Probe\nfrom xmesh._runtime.process import get_runtime\n"
               "pm = xmesh.this_host().spawn_procs({'gpus': 1})\np = pm.spawn('off', Probe)\n"
               "assert [p.echo.call_one(i).get(timeout=60) for i in range(20)] == list(range(20))\n"
               "s = get_runtime().node.stats()\nprint(s.ring_sent, s.rings_out, s.rings_in)\npm.stop()\n")
    r = run_program(program, env={"XMESH_RINGS": "0"}, timeout=100)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0", "0"]
