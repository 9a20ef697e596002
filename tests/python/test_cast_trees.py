"""Cast trees (issue 23, runtime/cast_tree.*): a call or broadcast to more actors than
XMESH_CAST_FANOUT leaves the controller as at most that many messages; relay procs forward it and
gather the answers. Values come back by rank, each actor takes its caller's messages in the order
they were sent whichever way they came, explicit-port endpoints answer through the tree, and on
namespace hosts a relay that dies holding a message fails exactly the ranks behind it, which go
on taking later messages."""
import json
import os
import signal
import textwrap

import pytest
from netns_hosts import NetnsHosts, unavailable
from xmesh_testing import private_tmpdir, run_program, wait_until

import xmesh
from xmesh import _core
from xmesh._runtime.process import get_runtime

HERE = os.path.dirname(os.path.abspath(__file__))


class Recorder(xmesh.Actor):
    def __init__(self) -> None:
        self.seen: list = []

    @xmesh.endpoint
    def record(self, n: int) -> int:
        self.seen.append(n)
        return n * 10 + xmesh.context().actor_instance.rank.rank

    @xmesh.endpoint
    def recorded(self) -> list:
        return self.seen

    @xmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @xmesh.endpoint
    def relayed(self) -> int:
        return get_runtime().node.stats().relayed

    @xmesh.endpoint
    def order_stats(self) -> dict:
        s = get_runtime().node.stats()
        return {"held": s.order_held, "late": s.order_late, "dropped": s.order_dropped}

    @xmesh.endpoint
    def blob(self, sizes: dict) -> bytes:
        return b"x" * sizes.get(str(xmesh.context().actor_instance.rank.rank), 10)

    @xmesh.endpoint(explicit_response_port=True)
    def through_port(self, port, n: int) -> None:
        port.send(n + xmesh.context().actor_instance.rank.rank)


LOCAL = r"""
import json, sys
sys.path.insert(0, {here!r})
import xmesh
from test_cast_trees import Recorder
pm = xmesh.this_host().spawn_procs({{"gpus": 12}})
rec = pm.spawn("rec", Recorder)
first = rec.record.call(0).get(timeout=60)
out = {{"first": sorted(first.values())}}
before = sum(rec.relayed.call().get(timeout=60).values())
ops = 0
for i in range(1, 91):
    if i % 3 == 0:      # through the tree
        rec.record.broadcast(i)
        ops += 1
    else:               # straight to one actor, not waited for: it must not overtake the tree's
        rec.slice(gpus=i % 12).record.call_one(i)
after = sum(rec.relayed.call().get(timeout=60).values())
out["relayed"] = after - before
out["ops"] = ops + 1    # the second count is relayed before it is counted
out["seen"] = list(rec.recorded.call().get(timeout=60).values())
out["order"] = list(rec.order_stats.call().get(timeout=60).values())  # held, late, dropped: said on failure
out["port"] = sorted(rec.through_port.call(100).get(timeout=60).values())
out["stream"] = sorted(f.get(timeout=60) for f in rec.record.stream(1000))
# Answers up to the message limit (XMESH_MAX_MESSAGE_BYTES, 1 MB here) go up in several batches;
# one over it is answered with the error naming both sizes.
sizes = {{str(r): 700_000 for r in range(12)}}
sizes["5"] = 2_000_000
blobs = {{}}
for f in rec.blob.stream(sizes):
    try:
        blobs[len(blobs)] = len(f.get(timeout=60))
    except Exception as e:
        blobs["error"] = str(e)
out["blobs"] = blobs
print(json.dumps(out))
pm.stop()
"""


def test_a_tree_call_returns_every_value_by_rank_and_keeps_each_callers_order():
    # These procs share the controller's host: XMESH_CAST_TREE=all sends them through trees too.
    r = run_program(LOCAL.format(here=HERE), env={"XMESH_CAST_FANOUT": "4", "XMESH_CAST_TREE": "all",
                                                  "XMESH_MAX_MESSAGE_BYTES": "1000000"}, timeout=110)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["first"] == list(range(12))
    # 12 targets, fan-out 4: the controller sends 4 messages, relays the other 8.
    assert out["relayed"] == 8 * out["ops"]
    for rank, seen in enumerate(out["seen"]):
        assert seen == sorted(seen), f"rank {rank} took its messages out of order: {seen}; gate: {out['order'][rank]}"
        assert [n for n in seen if n % 3 == 0 and n] == list(range(3, 91, 3))
        assert [n for n in seen if n % 3 and n % 12 == rank] == [n for n in range(1, 91) if n % 3 and n % 12 == rank]
    assert out["port"] == list(range(100, 112))
    assert out["stream"] == [10000 + r for r in range(12)]
    blobs = out["blobs"]
    assert sorted(v for k, v in blobs.items() if k != "error") == [700_000] * 11
    assert "could not be sent" in blobs["error"] and "2000" in blobs["error"], blobs["error"]


def test_procs_of_this_host_get_one_message_each_by_default():
    program = (f"import sys; sys.path.insert(0, {HERE!r})\n"
               "import xmesh\nfrom test_cast_trees import Recorder\n"
               "pm = xmesh.this_host().spawn_procs({'gpus': 6})\nrec = pm.spawn('direct', Recorder)\n"
               "assert sorted(rec.record.call(1).get(timeout=60).values()) == list(range(10, 16))\n"
               "print(sum(rec.relayed.call().get(timeout=60).values()))\npm.stop()\n")
    r = run_program(program, env={"XMESH_CAST_FANOUT": "2"}, timeout=100)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"]  # fan-out 2, but the relays would be on this host: none


def test_cast_tree_off_relays_nothing():
    program = (f"import sys; sys.path.insert(0, {HERE!r})\n"
               "import xmesh\nfrom test_cast_trees import Recorder\n"
               "pm = xmesh.this_host().spawn_procs({'gpus': 6})\nrec = pm.spawn('off', Recorder)\n"
               "assert sorted(rec.record.call(1).get(timeout=60).values()) == list(range(10, 16))\n"
               "from xmesh._runtime.process import get_runtime\nprint(get_runtime().node.cast_fanout, "
               "sum(rec.relayed.call().get(timeout=60).values()))\npm.stop()\n")
    r = run_program(program, env={"XMESH_CAST_FANOUT": "2", "XMESH_CAST_TREE": "off"}, timeout=100)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0"]
    # A value that is none of hosts, all, off is named, and the default kept.
    r = run_program(program, env={"XMESH_CAST_FANOUT": "2", "XMESH_CAST_TREE": "sideways"}, timeout=100)
    assert r.returncode == 0, r.stderr
    assert "XMESH_CAST_TREE=sideways is not one of hosts, all, off" in r.stderr
    assert r.stdout.split() == ["2", "0"]


WHY_NOT = unavailable()


@pytest.mark.skipif(WHY_NOT is not None, reason=f"namespace hosts unavailable: {WHY_NOT}")
def test_a_dead_relay_on_a_namespace_host_fails_exactly_the_ranks_behind_it():
    tmp = private_tmpdir("xmesh-tree-")
    key = os.path.join(tmp, "cluster.key")
    _core.write_new_key_file(key)
    with NetnsHosts(2, hidden=[_core.runtime_dir()]) as net:
        agents = []
        try:
            for i, host in enumerate(net.hosts):
                rundir = os.path.join(tmp, f"rt-{i}")
                os.makedirs(rundir, mode=0o700)
                log = open(os.path.join(tmp, f"agent-{i}.log"), "w")
                agents.append(host.popen([os.environ["XMESH_HOSTD"], "--runtime-dir", rundir, "--listen",
                                          f"tcp://{host.addr}:7000", "--key-file", key], stdout=log, stderr=log))
            for i in range(2):
                assert wait_until(lambda: "serving" in open(os.path.join(tmp, f"agent-{i}.log")).read(), 20)
            program = textwrap.dedent(f"""
                import json, os, signal, sys, time
                sys.path.insert(0, {HERE!r})
                import xmesh
                from test_cast_trees import Recorder
                hm = xmesh.hosts({[f"{h.addr}:7000" for h in net.hosts]!r}, key_file={key!r})
                pm = hm.spawn_procs({{"gpus": 6}})
                rec = pm.spawn("rec", Recorder)
                pids = list(rec.pid.call().get(timeout=60).values())
                rec.record.call(1).get(timeout=60)
                # 12 ranks on two hosts, fan-out 3: one message per host, to ranks 0 and 6;
                # rank 6 relays to its host's ranks 7, 9 and 11, which relay to 8 and 10.
                os.kill(pids[6], signal.SIGSTOP)   # it stops reading: the next call waits in it
                # kill() returns before every thread has stopped (on a loaded VM a thread ran on
                # long enough to take the next call): wait until all of them show 'T'.
                def stopped(pid):
                    for t in os.listdir(f"/proc/{{pid}}/task"):
                        with open(f"/proc/{{pid}}/task/{{t}}/stat") as f:
                            if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                                return False
                    return True
                while not stopped(pids[6]):
                    time.sleep(0.001)
                stream = rec.record.stream(2)
                time.sleep(0.5)
                os.kill(pids[6], signal.SIGKILL)
                ok_ranks, errors = [], []
                for f in stream:
                    try:
                        ok_ranks.append(f.get(timeout=60) - 20)
                    except xmesh.SupervisionError as e:
                        errors.append(str(e))
                # The ranks behind the dead relay never got message 2; they take message 3.
                behind = rec.slice(hosts=1, gpus=slice(1, 6))
                later = sorted(behind.record.call(3).get(timeout=60).values())
                order = list(behind.order_stats.call().get(timeout=60).values())
                print(json.dumps({{"ok": sorted(ok_ranks), "errors": errors, "later": later, "order": order}}))
                pm.stop()
            """)
            r = run_program(program, env={"XMESH_CAST_FANOUT": "3", "XMESH_ORDER_WAIT_MS": "600000"}, timeout=110)
            # (the agents' logs with a failure: a first connection that went unanswered was seen
            # once in CI and never again; what the agents saw is the way to its cause)
            assert r.returncode == 0, r.stderr + "".join(
                f"\n--- agent {i} ({net.hosts[i].addr}) log:\n" + open(os.path.join(tmp, f"agent-{i}.log")).read()
                for i in range(2))
            out = json.loads(r.stdout.strip().splitlines()[-1])
            assert out["ok"] == [0, 1, 2, 3, 4, 5], out
            assert len(out["errors"]) == 6, out["errors"]  # rank 6 itself and the five behind it
            assert sum("relay of its cast tree" in text for text in out["errors"]) == 5, out["errors"]
            assert out["later"] == [37, 38, 39, 40, 41]
            assert all(o["held"] == 0 and o["late"] == 0 for o in out["order"]), out["order"]
        finally:
            for p in agents:
                p.terminate()
            for p in agents:
                p.wait(timeout=10)
