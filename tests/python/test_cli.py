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


def test_keygen_writes_a_private_key_file_and_refuses_to_overwrite_it(tmp_path):
    """Issue 20's key file: 0600, a valid CURVE pair, never silently replaced; a copy others can
    read is refused wherever it is read."""
    from xmesh import _core

    path = tmp_path / "cluster.key"
    r = xmesh("keygen", str(path))
    assert r.returncode == 0, r.stderr
    assert "Whoever holds this file can run code on every host" in r.stdout
    assert os.stat(path).st_mode & 0o777 == 0o600
    public = _core.key_file_public_key(str(path))
    assert len(public) == 40 and public in r.stdout
    again = xmesh("keygen", str(path))
    assert again.returncode == 1 and "exists already (--force replaces it)" in again.stderr
    assert _core.key_file_public_key(str(path)) == public  # untouched
    assert xmesh("keygen", "--force", str(path)).returncode == 0
    assert _core.key_file_public_key(str(path)) != public
    os.chmod(path, 0o640)
    try:
        _core.key_file_public_key(str(path))
        raise AssertionError("a key file others can read was accepted")
    except _core.KeyFileError as e:
        assert "open to other users (mode 0640)" in str(e) and f"chmod 600 {path}" in str(e)
