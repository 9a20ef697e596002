"""Named allocations from a plain program: a clear error for bad names, for a missing
allocation and a missing actor mesh; a named allocation outlives the program that spawned it."""
import os
import socket
import subprocess

import pytest
from xmesh_testing import PYTHON, pid_alive, run_program, wait_until

import xmesh


def test_bad_names_and_missing_allocations_are_named(fresh_rundir):
    hosts = xmesh.hosts([fresh_rundir])
    with pytest.raises(ValueError, match="needs the allocation's name"):
        xmesh.attach("")
    with pytest.raises(KeyError, match="no live allocation named 'ghost'"):
        xmesh.attach("ghost", hosts=hosts)
    with pytest.raises(ValueError, match="without '/'"):
        hosts.spawn_procs({"gpus": 1}, name="a/b")
    r = subprocess.run([PYTHON, "-m", "xmesh.cli", "stop", "ghost", "--runtime-dir", fresh_rundir],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no live allocation named 'ghost'" in r.stderr


def test_a_named_allocation_outlives_its_program_and_lists_its_actors(fresh_rundir):
    env = {"XMESH_RUNTIME_DIR": fresh_rundir}
    r = run_program("import sys\nsys.path.insert(0, %r)\n" % os.path.dirname(__file__) +
                    "from xmesh import this_host\nfrom actors_for_tests import Counter\n"
                    "procs = this_host().spawn_procs({'gpus': 2}, name='kept')\n"
                    "procs.spawn('counter', Counter).incr.call().get()\nprint(procs.pids)\n", env=env)
    assert r.returncode == 0, r.stderr
    pids = eval(r.stdout.strip().splitlines()[-1])
    assert all(pid_alive(p) for p in pids)
    # Listed with host names (issue 17: the runtime directory was shown as the host).
    (listed,) = [a for a in xmesh.allocations([fresh_rundir]) if a["name"] == "kept"]
    assert listed["hosts"] == [socket.gethostname()] and listed["runtime_dirs"] == [fresh_rundir], listed
    procs = xmesh.attach("kept", hosts=xmesh.hosts([fresh_rundir]))
    assert sorted(procs.pids) == sorted(pids)
    assert set(procs.actors()) == {"counter"}
    assert list(procs.actors("counter").incr.call().get().values()) == [2, 2]
    with pytest.raises(KeyError, match=r"no live actor mesh named 'nope'.*\['counter'\]"):
        procs.actors("nope")
    procs.stop()
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=15)


KILLED_OWNER = """
import sys, time, xmesh
procs = xmesh.this_host().spawn_procs({'gpus': 1}, name=sys.argv[1])
procs.initialized.get(timeout=60)
print("READY", flush=True)
time.sleep(120)
"""


def _eventfds(pid: int) -> int:
    return sum(1 for fd in os.listdir(f"/proc/{pid}/fd") if "eventfd" in os.readlink(f"/proc/{pid}/fd/{fd}"))


def test_a_sigkilled_owner_shows_detached_at_once_and_leaves_nothing_open_in_the_agent(fresh_rundir, tmp_path):
    """Issue 41, finding 8: each SIGKILLed controller left an eventfd (its connection) open in the
    agent, and its named allocation showed `attached` for seconds."""
    from xmesh._base.pids import running_agent_pid

    path = tmp_path / "owner.py"
    path.write_text(KILLED_OWNER)
    counts = []
    for i in range(3):
        prog = subprocess.Popen([PYTHON, str(path), f"killed{i}"], env=dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir),
                                stdout=subprocess.PIPE, text=True)
        assert prog.stdout.readline().strip() == "READY"
        prog.kill()
        prog.wait()
        (row,) = [a for a in xmesh.allocations([fresh_rundir]) if a["name"] == f"killed{i}"]
        assert row["attached"] is False, row  # its process is gone: said at once
        agent = running_agent_pid(fresh_rundir)
        # Its connection is closed once a second of silence makes the agent look.
        assert wait_until(lambda: not counts or _eventfds(agent) <= counts[0], timeout=10), (counts, _eventfds(agent))
        counts.append(_eventfds(agent))
    assert counts[-1] <= counts[0], counts
    for i in range(3):
        xmesh.attach(f"killed{i}", hosts=xmesh.hosts([fresh_rundir])).stop()
