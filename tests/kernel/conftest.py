"""Kernel tests: real xmesh kernels started through jupyter_client from the build tree's
kernelspec (JUPYTER_PATH, see tests/CMakeLists.txt), each test with its own runtime directory
(its own host agent)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

from xmesh_testing import runtime_dir_of_its_own  # noqa: E402
from kernel_session import KernelSession  # noqa: E402


@pytest.fixture
def kernel_rundir():
    with runtime_dir_of_its_own("xmk-") as d:
        yield d


@pytest.fixture
def kernel(kernel_rundir):
    """A started xmesh kernel; shut down (its unnamed meshes with it) at the end."""
    k = KernelSession(kernel_rundir)
    yield k
    k.close()
