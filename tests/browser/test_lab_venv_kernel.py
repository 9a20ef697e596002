"""JupyterLab on a venv's kernel (issue 43): the kernelspec `python -m xmesh.kernel install`
wrote in a venv of CPython 3.13 holding the wheel (tests/wheel), listed by the server beside the
system's; a notebook on it runs cells in the venv, its procs' output lands in the cell, and the
debugger's prompt works in the input box."""
import os
import subprocess
import sys

import pytest
from conftest import shutdown_agent, start_server
from jupyter_ui import NotebookPage, write_notebook
from test_lab_debugger import TRAINER

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "wheel"))
from wheel_envs import clean_env, shared_venv, wheel, wheel_versions  # noqa: E402

NAME = "xmesh-venv-lab"


@pytest.fixture(scope="module")
def venv_server(workdir):
    python = shared_venv(wheel_versions(wheel())[-1])
    kernels = os.path.join(workdir, "kernels")
    # The server runs with the build tree's PYTHONPATH (its panel's sidecar imports xmesh from
    # there): the venv's kernel is given an empty one, as a venv's Python needs none.
    subprocess.run([python, "-m", "xmesh.kernel", "install", "--prefix", kernels, "--name", NAME,
                    "--display-name", "xmesh (venv)", "--env", "PYTHONPATH", ""], check=True, env=clean_env(),
                   capture_output=True, timeout=120)
    s = start_server(workdir, __name__, more_kernels=os.path.join(kernels, "share", "jupyter"))
    s.python = python
    yield s
    s.stop()
    shutdown_agent(workdir)


def test_a_notebook_on_the_venvs_kernel_runs_there_with_its_debugger(venv_server, page):
    server = venv_server
    write_notebook(os.path.join(server.root, "venv.ipynb"), [
        "import sys\nprint('PREFIX', sys.prefix)",
        TRAINER,
        "r = trainer.step.call(5).get()\nprint('RESULT', sorted(r.values()))"], kernel_name=NAME)
    nb = NotebookPage(page, server, "venv.ipynb", kernel_name=NAME)
    nb.run(0, timeout=60)
    assert f"PREFIX {os.path.dirname(os.path.dirname(server.python))}" in nb.output(0)
    nb.run(1, timeout=90)
    nb.run(2, wait=False)
    assert nb.input_prompt().strip() == "xmesh_dbg>"
    nb.answer("cast trainer ranks(0:2) p y, __import__('sys').executable")
    nb.wait_output(2, lambda t: "[trainer rank 0]\n(10, " in t and "[trainer rank 1]\n(11, " in t)
    assert nb.output(2).count(server.python) == 2, nb.output(2)  # the procs run the venv's Python
    nb.answer("c")
    nb.wait_done(2)
    assert "RESULT [10, 11]" in nb.output(2)
