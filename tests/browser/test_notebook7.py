"""Notebook 7 in Chromium (served by the same server): the kernel is the default, cells run,
remote output lands in its cell, and the debugger's prompt works in the input box."""
import json
import os

from jupyter_ui import NotebookPage, write_notebook
from test_lab_debugger import TRAINER


def test_notebook7_runs_cells_and_the_debugger(server, page):
    write_notebook(os.path.join(server.root, "nb7.ipynb"), [
        TRAINER, "r = trainer.step.call(5).get()\nprint('RESULT', sorted(r.values()))"])
    nb = NotebookPage(page, server, "nb7.ipynb", ui="notebook")
    nb.run(0, timeout=90)
    nb.run(1, wait=False)
    assert nb.input_prompt().strip() == "xmesh_dbg>"
    nb.answer("cast trainer ranks(0:2) p y")
    nb.wait_output(1, lambda t: "[trainer rank 0]\n10" in t and "[trainer rank 1]\n11" in t)
    nb.answer("c")
    nb.wait_done(1)
    assert "RESULT [10, 11]" in nb.output(1)


def test_the_server_knows_the_kernel_with_its_logo(server):
    specs = json.loads(server.get("api/kernelspecs"))
    assert specs["default"] == "xmesh"
    resources = specs["kernelspecs"]["xmesh"]["resources"]
    assert {"logo-32x32", "logo-64x64", "logo-svg"} <= set(resources), resources
    assert server.get(resources["logo-64x64"].lstrip("/")).startswith(b"\x89PNG")
