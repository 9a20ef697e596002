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


def test_notebook7_opens_the_xmesh_panel_from_its_view_menu(server, page):
    write_notebook(os.path.join(server.root, "nb7-panel.ipynb"), [
        "import xmesh\nprocs = xmesh.this_host().spawn_procs({'gpus': 4}, name='nb7-mesh')\nprocs.initialized.get()"])
    nb = NotebookPage(page, server, "nb7-panel.ipynb", ui="notebook")
    nb.run(0, timeout=90)
    page.click("text=View")
    page.click(".lm-Menu-itemLabel:text-is('xmesh Meshes')")
    ranks = '#xmesh-panel .xmesh-mesh[data-mesh="nb7-mesh"] .xmesh-rank'
    page.wait_for_function(f"document.querySelectorAll('{ranks}').length === 4", timeout=15000)
    assert page.eval_on_selector_all(ranks, "cs => cs.map(c => c.dataset.state)") == ["idle"] * 4
