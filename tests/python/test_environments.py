"""xmesh in a user's own environment (issue 43): procs, and the fork server they are forked
from, run the controller's interpreter, so a program run by a venv's Python has its procs in
that venv, seeing its packages."""
import json
import platform
import subprocess
import sys

import pytest
from xmesh_testing import PYTHON, run_program

from xmesh import _core
from xmesh._runtime.agents import check_agent_match

PROGRAM = """
import json, sys
from xmesh import Actor, endpoint, this_host

class Where(Actor):
    @endpoint
    def where(self) -> dict:
        import only_in_this_env
        return {"executable": sys.executable, "prefix": sys.prefix, "marker": only_in_this_env.MARKER}

procs = this_host().spawn_procs({"gpus": 2})
print(json.dumps(list(procs.spawn("where", Where).where.call().get(timeout=60).values())))
procs.stop()
"""


def make_venv(tmp_path):
    """A venv of Debian's Python holding a module the system's Python does not have (it sees the
    system's packages too: xmesh's dependencies, which pip brings into a venv of its own)."""
    env_dir = tmp_path / "env"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", "--system-site-packages", str(env_dir)], check=True,
                   timeout=60)
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    (site / "only_in_this_env.py").write_text("MARKER = 'from the venv'\n")
    return env_dir


def test_a_venvs_program_has_its_procs_in_that_venv(tmp_path, fresh_rundir):
    """Invariant env.1 (docs/architecture/12-environments.md): on the controller's machine."""
    env_dir = make_venv(tmp_path)
    python = str(env_dir / "bin" / "python")
    r = run_program(PROGRAM, python=python, env={"XMESH_RUNTIME_DIR": fresh_rundir}, timeout=90)
    assert r.returncode == 0, r.stderr
    answers = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(answers) == 2
    for a in answers:
        # The venv's interpreter (not the system's with the venv's directories on sys.path).
        assert a == {"executable": python, "prefix": str(env_dir), "marker": "from the venv"}, a


def test_an_agent_of_another_xmesh_or_python_is_refused_naming_both():
    """Invariant env.2 (docs/architecture/12-environments.md): the check a controller makes on an
    agent's Status reply when it connects (the connection path itself: tests/wheel)."""
    ours = platform.python_version()
    major_minor = ".".join(ours.split(".")[:2])

    def status(**fields):
        return _core.StatusReply.from_dict({"pid": 7, "allocations": [], "version": _core.version(),
                                            "python": "/envs/a/bin/python", "python_version": ours, **fields})

    check_agent_match(status(), "the host agent at tcp://h:7000")
    check_agent_match(status(python_version=f"{major_minor}.99"), "here")  # patch releases pickle alike
    check_agent_match(status(python="", python_version=""), "here")  # an agent that does not say: its procs run ours
    with pytest.raises(RuntimeError) as e:
        check_agent_match(status(version="0.0.9"), "the host agent at tcp://h:7000 (h)")
    assert str(e.value).startswith(f"the host agent at tcp://h:7000 (h) runs xmesh 0.0.9, this controller xmesh "
                                   f"{_core.version()}")
    with pytest.raises(RuntimeError) as e:
        check_agent_match(status(python_version="3.9.18"), "the host agent at tcp://h:7000 (h)")
    assert (f"runs Python 3.9.18 (/envs/a/bin/python), this controller Python {ours} ({sys.executable})"
            in str(e.value)), e.value
    # An agent on this machine runs procs with the controller's interpreter: its own is no matter.
    check_agent_match(status(python_version="3.9.18"), "the host agent for /run/x", python=False)
