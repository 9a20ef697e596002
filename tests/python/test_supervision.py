"""A proc that dies fails every pending and later call on it, promptly, naming rank, host and
cause; the other ranks stay usable through slices."""
import os
import signal
import time

import pytest
from actors_for_tests import Counter

from xmesh import ActorError, SupervisionError, this_host


def test_kill_9_mid_call_fails_that_rank_promptly():
    """Invariant call.3 (docs/architecture/05-call-path.md)."""
    pm = this_host().spawn_procs({"gpus": 3})
    c = pm.spawn("victims", Counter)
    pids = [v["pid"] for v in c.whoami.call().get(timeout=30).values()]
    fut = c.spin.call(30)
    time.sleep(0.3)
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(SupervisionError) as info:
        fut.get(timeout=20)
    # The error came while the other ranks were still running: it did not wait for them.
    assert sorted(fut.running_ranks()) == [0, 2]
    assert fut.cancel()
    e = info.value
    assert e.rank == 1 and e.coords == {"gpus": 1}
    text = str(e)
    assert "SIGKILL" in text and os.uname().nodename.split(".")[0] in text and str(pids[1]) in text
    # Later calls on the dead rank fail at once; the others still answer.
    with pytest.raises(SupervisionError):
        c.slice(gpus=1).get.call_one().get(timeout=5)
    assert [v for v in c.slice(gpus=slice(0, 3, 2)).get.call().get(timeout=30).values()] == [0, 0]
    with pytest.raises(SupervisionError):
        c.get.call().get(timeout=5)
    pm.stop()


def test_exit_code_in_an_endpoint_is_reported():
    pm = this_host().spawn_procs({"gpus": 2})
    c = pm.spawn("quitters", Counter)
    with pytest.raises(SupervisionError, match="exited with code 3"):
        c.slice(gpus=0).die.call_one(3).get(timeout=20)
    assert c.slice(gpus=1).incr.call_one().get(timeout=30) == 1
    pm.stop()


def test_death_between_calls_fails_the_next_call():
    pm = this_host().spawn_procs({"gpus": 1})
    c = pm.spawn("between", Counter)
    pid = c.whoami.call_one().get(timeout=30)["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            c.get.call_one().get(timeout=5)
        except SupervisionError as e:
            assert "exited" in str(e) or "SIGTERM" in str(e)
            break
        time.sleep(0.05)
    else:
        pytest.fail("the call on a dead proc did not fail")
    assert isinstance(SupervisionError("x"), ActorError)
    pm.stop()


def test_proc_startup_failure_is_reported(tmp_path):
    # A proc whose interpreter cannot start: readiness fails with the exit, never hangs.
    pm = this_host().spawn_procs({"gpus": 1}, env={"PYTHONPATH": "/nonexistent", "XMESH_SYS_PATH": "[]",
                                                   "PYTHONHOME": "/nonexistent"})
    with pytest.raises(SupervisionError, match="exited with code"):
        pm.initialized.get(timeout=30)


def test_host_agent_killed_fails_calls_and_its_procs_die(fresh_rundir):
    """Invariant call.3 (docs/architecture/05-call-path.md)."""
    import xmesh
    from xmesh_testing import pid_alive, wait_until

    pm = xmesh.hosts([fresh_rundir]).spawn_procs({"gpus": 2})
    c = pm.spawn("orphans", Counter)
    pids = [v["pid"] for v in c.whoami.call().get(timeout=30).values()]
    fut = c.spin.call(60)
    hostd = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    os.kill(hostd, signal.SIGKILL)
    # Procs die with their agent (parent-death signal); the controller sees the agent's process
    # end (issue 16: not after XMESH_HOSTD_TIMEOUT_MS of silence) and fails the calls at once.
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=10)
    with pytest.raises(SupervisionError, match=rf"host agent {hostd} .* ended without shutting down \(killed"):
        fut.get(timeout=30)
    with pytest.raises(SupervisionError):
        c.get.call().get(timeout=30)


def test_a_stopped_agent_comes_back_with_its_procs(fresh_rundir):
    """Issue 16, defect 6: an agent stopped longer than the heartbeat timeout (or busy that long)
    was lost for good: meshes failed, and its procs were stopped as orphans once it resumed.

    Invariant call.3 (docs/architecture/05-call-path.md).
    """
    import xmesh

    pm = xmesh.hosts([fresh_rundir]).spawn_procs({"gpus": 2})
    c = pm.spawn("paused", Counter)
    pids = sorted(v["pid"] for v in c.whoami.call().get(timeout=30).values())
    hostd = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    os.kill(hostd, signal.SIGSTOP)
    try:
        # past the heartbeat timeout and the orphan grace of the tests' environment
        time.sleep((int(os.environ["XMESH_HOSTD_TIMEOUT_MS"]) / 1000) + float(os.environ["XMESH_ORPHAN_GRACE"]) + 1)
        assert sorted(c.incr.call().get(timeout=30).values()) == [1, 1]  # procs answer directly meanwhile
    finally:
        os.kill(hostd, signal.SIGCONT)
    time.sleep(2)  # the agent catches up with what queued while it was stopped
    assert sorted(v["pid"] for v in c.whoami.call().get(timeout=30).values()) == pids
    assert sorted(c.incr.call().get(timeout=30).values()) == [2, 2]
    pm.stop()


STOPPED_PROC = """
import os, signal, subprocess, sys
sys.path.insert(0, {here!r})
from actors_for_tests import Counter
from xmesh import this_host
from xmesh._debug.controller import controller
pm = this_host().spawn_procs({{"gpus": 2}})
c = pm.spawn("c", Counter)
pids = {{v["rank"]: v["pid"] for v in c.whoami.call().get(timeout=30).values()}}
print("PID", pids[1], flush=True)
os.kill(pids[1], signal.SIGSTOP)
while open(f"/proc/{{pids[1]}}/stat").read().rsplit(")", 1)[1].split()[0] != "T":  # delivered
    pass
print("REPR", repr(pm), flush=True)
print("STATUS", subprocess.run([sys.executable, "-m", "xmesh.cli", "status"], capture_output=True, text=True).stdout,
      flush=True)
print("WHERE", controller().format_stacks(), flush=True)
try:
    c.incr.call().get(timeout=3)
except TimeoutError:
    print("TIMED OUT", flush=True)
os.kill(pids[1], signal.SIGCONT)
print("AFTER", sorted(c.incr.call().get(timeout=30).values()), flush=True)
"""


def test_a_stopped_proc_is_named_where_users_look():
    """Issue 16, defect 9: a SIGSTOPped proc made a get() wait silently while `xmesh status` said
    "alive" and `where` showed a socket address."""
    from xmesh_testing import run_program

    here = os.path.dirname(os.path.abspath(__file__))
    r = run_program(STOPPED_PROC.format(here=here), env={"XMESH_WAIT_NOTICE_S": "1"}, timeout=90)
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.split("PID ", 1)[1].split()[0])
    assert "1/2 running" in r.stdout.split("REPR", 1)[1].splitlines()[0]
    assert f"rank 1 (pid {pid}): stopped" in r.stdout.split("STATUS", 1)[1]
    assert "proc rank 1 of" in r.stdout.split("WHERE", 1)[1] and f"(pid {pid}): stopped (SIGSTOP" in r.stdout
    assert "TIMED OUT" in r.stdout and "AFTER [2, 2]" in r.stdout
    # the waiting call said why, once, while it waited
    notices = [line for line in r.stderr.splitlines() if "is still waiting: proc rank 1 of" in line]
    assert len(notices) == 1 and f"(pid {pid}): stopped (SIGSTOP, or held by a debugger): `kill -CONT {pid}`" in notices[0]
