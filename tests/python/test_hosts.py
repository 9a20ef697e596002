"""Several host agents on one machine (different runtime directories) as a `hosts` dimension."""
import os
import subprocess

import pytest
from actors_for_tests import Counter

import xmesh


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
