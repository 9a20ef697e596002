"""Helpers shared by the pytest suites (tests/python, tests/kernel): paths, running programs as
a user would, and waiting on processes."""
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time

from xmesh._base.pids import pid_alive  # noqa: F401 (the package's own: zombies and vanishing pids)

PYTHON = "/usr/bin/python3"
SOURCE_DIR = os.environ.get("XMESH_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
EXAMPLES = os.path.join(SOURCE_DIR, "examples")


def package_modules() -> dict:
    """The xmesh package's modules, {dotted name under xmesh ("_api.future", "cli", "__init__"
    for the package itself, "_api.__init__" for a subpackage's): path}."""
    import xmesh
    root = os.path.dirname(xmesh.__file__)
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), root)[:-3]
                found[rel.replace(os.sep, ".")] = os.path.join(folder, f)
    return found


def private_tmpdir(prefix):
    """A 0700 directory with a short path (ipc socket paths must fit in 107 bytes), removed when
    the test process ends (if its test did not remove it)."""
    d = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(d, 0o700)
    atexit.register(shutil.rmtree, d, True)
    return d


@contextlib.contextmanager
def runtime_dir_of_its_own(prefix):
    """A runtime directory (so a host agent) of its own; the agent is stopped and the directory
    removed afterwards."""
    d = private_tmpdir(prefix)
    try:
        yield d
    finally:
        stop_agent(d)
        shutil.rmtree(d, ignore_errors=True)


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


def run_program(source=None, path=None, env=None, timeout=60, args=(), stdin=None, python=PYTHON):
    """Runs a Python program as a user would (with Debian's python3 unless `python` names
    another interpreter); returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    if path is None:
        fd, path = tempfile.mkstemp(suffix=".py", prefix="xmprog-")
        with os.fdopen(fd, "w") as f:
            f.write(source)
    return subprocess.run([python, path, *args], env=full_env, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(path), stdin=stdin)


def wait_until(pred, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def write(path, text, mode=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    if mode is not None:
        os.chmod(path, mode)


def read(path):
    with open(path) as f:
        return f.read()


def terminal_stdin():
    """(master, slave) of a pseudo-terminal without echo: a program given the slave as stdin
    reads lines typed at the master as at a terminal (its debugger prompt opens there, as for a
    user; a pipe makes it continue stopped ranks, saying no input is possible)."""
    import pty
    import termios

    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return master, slave
