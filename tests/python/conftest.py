"""Shared fixtures: every pytest process gets its own runtime directory (so its own host
agent), short grace periods from the environment (see tests/CMakeLists.txt), and helpers to
run whole programs as a user would (xmesh_testing)."""
import os
import shutil

import pytest

from xmesh_testing import private_tmpdir, runtime_dir_of_its_own, stop_agent

_RUNDIR = private_tmpdir("xmt-")
os.environ["XMESH_RUNTIME_DIR"] = _RUNDIR


def pytest_sessionfinish(session, exitstatus):
    stop_agent(_RUNDIR)
    shutil.rmtree(_RUNDIR, ignore_errors=True)


@pytest.fixture
def rundir():
    return _RUNDIR


@pytest.fixture
def fresh_rundir():
    """A runtime directory of its own (its own host agent), stopped and removed afterwards."""
    with runtime_dir_of_its_own("xmf-") as d:
        yield d
