"""examples/ as written (Monarch imports), second half."""
import pytest
from examples_runner import EXPECTED, check_example

NAMES = sorted(EXPECTED)[5:]


@pytest.mark.parametrize("name", NAMES)
def test_example(name, tmp_path):
    check_example(name, tmp_path, "monarch")


@pytest.mark.parametrize("name", NAMES)
def test_example_with_xmesh_imports(name, tmp_path):
    check_example(name, tmp_path, "xmesh")
