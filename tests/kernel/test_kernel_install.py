"""`python -m xmesh.kernel install` (issue 43): ipykernel's flags and meanings, a kernelspec whose
argv is the installing interpreter, `jupyter kernelspec list` showing it, and bad input named:
a place it cannot write, a bad name, a missing connection file, a kernelspec whose interpreter
is gone. (The same installer in venvs of other Pythons: tests/wheel/test_wheel_kernel.py.)"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from jupyter_client.manager import start_new_kernel

from xmesh.kernel.install import install as install_kernelspec

BUILD_PYTHON = os.path.join(os.environ.get("XMESH_BUILD_DIR", ""), "python")


def install(*args, env=None, user=None):
    full = dict(os.environ, PYTHONPATH=BUILD_PYTHON, **(env or {}))
    prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] if user else []
    return subprocess.run(prefix + [sys.executable, "-m", "xmesh.kernel", "install", *args], capture_output=True,
                          text=True, timeout=60, env=full)


def spec_at(directory):
    with open(os.path.join(directory, "kernel.json")) as f:
        return json.load(f)


def test_prefix_and_user_installs_write_a_spec_that_runs_this_python(tmp_path):
    r = install("--prefix", str(tmp_path / "p"), "--name", "XM-Test", "--display-name", "My xmesh",
                "--env", "FOO", "bar")
    assert r.returncode == 0, r.stderr
    where = tmp_path / "p" / "share" / "jupyter" / "kernels" / "xm-test"
    assert r.stdout.strip() == f"Installed kernelspec xm-test in {where}"
    spec = spec_at(where)
    assert spec["argv"] == [sys.executable, "-m", "xmesh.kernel", "-f", "{connection_file}"]
    assert spec["display_name"] == "My xmesh" and spec["env"] == {"FOO": "bar"}
    assert spec["interrupt_mode"] == "signal" and spec["metadata"] == {"debugger": True}
    assert sorted(os.listdir(where)) == ["kernel.json", "logo-32x32.png", "logo-64x64.png", "logo-svg.svg"]
    # Installing again replaces it whole.
    assert install("--prefix", str(tmp_path / "p"), "--name", "xm-test").returncode == 0
    assert spec_at(where)["display_name"] == "Python 3 (xmesh)"
    r = install("--user", env={"JUPYTER_DATA_DIR": str(tmp_path / "data")})
    assert r.returncode == 0, r.stderr
    assert spec_at(tmp_path / "data" / "kernels" / "xmesh")["argv"][0] == sys.executable
    listed = subprocess.run(["jupyter", "kernelspec", "list", "--json"], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, JUPYTER_PATH=str(tmp_path / "p" / "share" / "jupyter")))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["kernelspecs"]["xm-test"]["resource_dir"] == str(where)


def test_flags_that_conflict_or_names_that_are_paths_are_refused(tmp_path):
    r = install("--user", "--prefix", str(tmp_path))
    assert r.returncode == 2 and "not allowed with argument" in r.stderr, r.stderr
    r = install("--prefix", str(tmp_path), "--name", "../evil")
    assert r.returncode == 1 and "a kernel's name is a plain directory name, not '../evil'" in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "share" / "jupyter" / "evil")


def test_a_place_it_cannot_write_is_named():
    locked = tempfile.mkdtemp(prefix="xmesh-locked-", dir="/tmp")  # root's, readable: nobody may not write
    os.chmod(locked, 0o755)
    try:
        r = install("--prefix", locked, user=65534)
    finally:
        shutil.rmtree(locked)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"cannot write the kernelspec in {locked}/share: permission denied" in r.stderr, r.stderr
    assert "with --user, or into this environment with --sys-prefix" in r.stderr


def test_a_kernel_without_its_connection_file_says_so():
    r = subprocess.run([sys.executable, "-m", "xmesh.kernel", "-f", "/nonexistent/kernel-1.json"],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=BUILD_PYTHON))
    assert r.returncode == 2 and "no connection file at /nonexistent/kernel-1.json" in r.stderr, r.stderr


def test_a_kernelspec_whose_interpreter_is_gone_fails_naming_it(tmp_path, monkeypatch):
    gone = str(tmp_path / "env" / "bin" / "python")
    install_kernelspec(prefix=str(tmp_path), name="gone", python=gone)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    with pytest.raises(FileNotFoundError) as e:
        start_new_kernel(kernel_name="gone", startup_timeout=30)
    assert gone in str(e.value)
