"""The xmesh command."""
import json
import os
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


def test_another_users_runtime_directory_is_named_as_such(tmp_path):
    """Issue 16, defect 11: `xmesh debug` / `xmesh logs` on another user's directory misled
    ("no program runs", "no logs")."""
    other = tmp_path / "theirs"
    other.mkdir(mode=0o700)
    os.chown(other, 65534, 65534)
    for cmd in (["logs", "job"], ["debug"]):
        r = subprocess.run([PYTHON, "-m", "xmesh.cli", *cmd, "--runtime-dir", str(other)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1
        assert f"permission denied: the runtime directory {other} is owned by uid 65534" in r.stderr, r.stderr
