"""The xmesh command."""
import json
import subprocess

from xmesh_testing import PYTHON

from xmesh import this_host


def xmesh(*args):
    return subprocess.run([PYTHON, "-m", "xmesh.cli", *args], capture_output=True, text=True, timeout=60)


def test_status_lists_allocations():
    pm = this_host().spawn_procs({"gpus": 2}, name="clitest")
    pm.initialized.get(timeout=30)
    r = xmesh("status")
    assert r.returncode == 0, r.stderr
    assert "clitest" in r.stdout and "2/2 procs alive" in r.stdout
    st = json.loads(xmesh("status", "--json").stdout)
    [alloc] = [a for a in st["allocations"] if a["name"] == "clitest"]
    assert [p["pid"] for p in alloc["procs"]] == pm.pids
    pm.stop()


def test_version_and_help():
    r = xmesh("--version")
    assert r.returncode == 0 and "protocol" in r.stdout
    assert xmesh().returncode == 2
