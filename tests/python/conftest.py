"""Shared fixtures: every pytest process gets its own runtime directory (so its own host
agent), short grace periods from the environment (see tests/CMakeLists.txt), and helpers to
run whole programs as a user would (xmesh_testing)."""
import os
import shutil
import sys

import pytest

from xmesh_testing import private_tmpdir, runtime_dir_of_its_own, stop_agent

_RUNDIR = private_tmpdir("xmt-")
os.environ["XMESH_RUNTIME_DIR"] = _RUNDIR


def pytest_sessionfinish(session, exitstatus):
    # The controller first: an agent lost under a live controller is a failure it reports (and
    # the monarch shim's default hook, imported by some tests, stops the program on one).
    if "xmesh" in sys.modules:
        sys.modules["xmesh"].shutdown_context().get()
    stop_agent(_RUNDIR)
    shutil.rmtree(_RUNDIR, ignore_errors=True)


@pytest.fixture
def rundir():
    return _RUNDIR


@pytest.fixture
def failures():
    """The program's fault hook, collecting the MeshFailures it gets (xmesh's default is put back
    after)."""
    from xmesh._runtime.process import set_unhandled_fault_hook

    got: list = []
    set_unhandled_fault_hook(got.append)
    yield got
    set_unhandled_fault_hook(None)


@pytest.fixture
def fresh_rundir():
    """A runtime directory of its own (its own host agent), stopped and removed afterwards."""
    with runtime_dir_of_its_own("xmf-") as d:
        yield d
