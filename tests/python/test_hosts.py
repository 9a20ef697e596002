"""Several host agents on one machine (different runtime directories) as a `hosts` dimension."""
import os
import subprocess

import pytest
from actors_for_tests import Counter

import xmesh
from xmesh import _core
from xmesh._base.pids import pid_alive, running_agent_pid


def test_two_agents_make_a_hosts_dimension(fresh_rundir, tmp_path):
    other = str(tmp_path / "h1")
    os.makedirs(other, mode=0o700)
    try:
        hm = xmesh.hosts([fresh_rundir, other])
        assert hm.sizes == {"hosts": 2}
        pm = hm.spawn_procs({"gpus": 2})
        assert pm.sizes == {"hosts": 2, "gpus": 2}
        c = pm.spawn("multi", Counter)
        infos = list(c.whoami.call().get(timeout=30).values())
        assert [i["hostd_dir"] for i in infos] == [fresh_rundir] * 2 + [other] * 2
        assert [i["coords"] for i in infos][2] == {"hosts": 1, "gpus": 0}
        # Per-host work through slicing by host.
        assert [v["rank"] for v in c.slice(hosts=1).whoami.call().get(timeout=30).values()] == [2, 3]
        # Each agent really is a separate daemon owning its procs.
        pids = [int(open(os.path.join(d, "hostd.pid")).read()) for d in (fresh_rundir, other)]
        assert pids[0] != pids[1]
        for i in infos:
            ppid = int(open(f"/proc/{i['pid']}/stat").read().split()[3])
            assert ppid == pids[0 if i["hostd_dir"] == fresh_rundir else 1]
        pm.stop()
    finally:
        subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "shutdown", "--runtime-dir", other],
                       capture_output=True, timeout=30)


def test_hosts_argument_errors():
    with pytest.raises(TypeError):
        xmesh.hosts("/tmp/x")
    with pytest.raises(TypeError):
        xmesh.hosts([])


def _start_agent_elsewhere(rundir, named=None):
    """Starts the agent of rundir from another controller (and a named allocation of one proc
    when named), which then exits: this process has not talked to that agent yet."""
    code = ("import sys, xmesh; from xmesh._runtime.agents import agent; d = sys.argv[1]; agent(d)\n"
            "if len(sys.argv) > 2: xmesh.hosts([d]).spawn_procs({'gpus': 1}, name=sys.argv[2]).initialized.get(30)\n")
    subprocess.run(["/usr/bin/python3", "-c", code, rundir] + ([named] if named else []), check=True, timeout=60)


def _replace_cookie_file(rundir):
    """The agent keeps the cookie it started with; the file now says another: a controller
    presents the wrong credentials and is refused, as by an agent of another protocol version."""
    path = _core.layout_cookie_file(rundir)
    with open(path, "w") as f:
        f.write("0" * 64)


def test_an_idle_agent_that_refuses_this_controller_is_replaced(fresh_rundir):
    """Invariant transport.1 (docs/architecture/03-transport-and-links.md)."""
    _start_agent_elsewhere(fresh_rundir)
    old = running_agent_pid(fresh_rundir)
    _replace_cookie_file(fresh_rundir)
    pm = xmesh.hosts([fresh_rundir]).spawn_procs({"gpus": 1})  # refused, the idle agent is replaced
    pm.initialized.get(timeout=30)
    assert running_agent_pid(fresh_rundir) not in (None, old) and not pid_alive(old)
    pm.stop()


def test_a_refusing_agent_that_owns_procs_is_left_running_with_the_way_out_named(tmp_path):
    other = str(tmp_path / "busy")
    os.makedirs(other, mode=0o700)
    try:
        _start_agent_elsewhere(other, named="keepme")
        busy = running_agent_pid(other)
        _replace_cookie_file(other)
        with pytest.raises(RuntimeError, match=r"refused.*xmesh shutdown --runtime-dir " + other):
            xmesh.hosts([other]).spawn_procs({"gpus": 1})
        assert running_agent_pid(other) == busy  # its procs were not killed under it
    finally:
        subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "shutdown", "--runtime-dir", other],
                       capture_output=True, timeout=30)
