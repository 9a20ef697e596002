"""A proc that dies fails every pending and later call on it, promptly, naming rank, host and
cause; the other ranks stay usable through slices."""
import os
import signal
import time

import pytest
from actors_for_tests import Counter

from xmesh import ActorError, SupervisionError, this_host


def test_kill_9_mid_call_fails_that_rank_promptly():
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
    import xmesh
    from xmesh_testing import pid_alive, wait_until

    pm = xmesh.hosts([fresh_rundir]).spawn_procs({"gpus": 2})
    c = pm.spawn("orphans", Counter)
    pids = [v["pid"] for v in c.whoami.call().get(timeout=30).values()]
    fut = c.spin.call(60)
    hostd = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    os.kill(hostd, signal.SIGKILL)
    # Procs die with their agent (parent-death signal); the controller learns it from the
    # missing heartbeats (XMESH_HOSTD_TIMEOUT_MS) and fails the calls instead of hanging.
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=10)
    with pytest.raises(SupervisionError, match="stopped answering heartbeats"):
        fut.get(timeout=30)
    with pytest.raises(SupervisionError):
        c.get.call().get(timeout=30)
