"""The same interrupt from the toolbar when the Jupyter server was started as `nohup ... &`
would start it: its kernels inherit SIGINT ignored (issue 17, defect 1)."""
import pytest
from conftest import start_server
from test_lab_interrupt import interrupt_a_blocked_cell


@pytest.fixture(scope="module")
def nohup_server(workdir):
    s = start_server(workdir, "nohup", sigint_ignored=True)
    assert s.sigint_ignored()  # what its kernels inherit
    yield s
    s.stop()


def test_the_toolbars_interrupt_works_with_sigint_inherited_ignored(nohup_server, page):
    interrupt_a_blocked_cell(nohup_server, page, "interrupt-nohup.ipynb")
