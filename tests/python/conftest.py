"""Shared fixtures: every pytest process gets its own runtime directory (so its own host
agent), short grace periods from the environment (see tests/CMakeLists.txt), and helpers to
run whole programs as a user would."""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

PYTHON = "/usr/bin/python3"
SOURCE_DIR = os.environ.get("XMESH_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
EXAMPLES = os.path.join(SOURCE_DIR, "examples")

# A short path: ipc socket paths must fit in 107 bytes.
_RUNDIR = tempfile.mkdtemp(prefix="xmt-", dir="/tmp")
os.chmod(_RUNDIR, 0o700)
os.environ["XMESH_RUNTIME_DIR"] = _RUNDIR


def stop_agent(rundir):
    try:
        pid = int(open(os.path.join(rundir, "hostd.pid")).read())
    except (FileNotFoundError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)


def pytest_sessionfinish(session, exitstatus):
    stop_agent(_RUNDIR)
    shutil.rmtree(_RUNDIR, ignore_errors=True)


@pytest.fixture
def rundir():
    return _RUNDIR


@pytest.fixture
def fresh_rundir():
    """A runtime directory of its own (its own host agent), stopped and removed afterwards."""
    d = tempfile.mkdtemp(prefix="xmf-", dir="/tmp")
    os.chmod(d, 0o700)
    yield d
    stop_agent(d)
    shutil.rmtree(d, ignore_errors=True)


def run_program(source=None, path=None, env=None, timeout=60, args=()):
    """Runs a Python program with Debian's python3 as a user would; returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    if path is None:
        fd, path = tempfile.mkstemp(suffix=".py", prefix="xmprog-")
        with os.fdopen(fd, "w") as f:
            f.write(source)
    return subprocess.run([PYTHON, path, *args], env=full_env, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(path))


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
    return True


def wait_until(pred, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()
