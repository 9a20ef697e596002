"""The xmesh panel's sync view and the logs' held-back counts (jupyter_ext/, issue 22), in
JupyterLab: a notebook syncs a workspace with watch=True and the panel shows the last sync per
host and the running watcher, and a file a later cell writes as what the watcher sent; a rank that floods its
cell past the display limit (set low for this server's kernels) has its held-back lines counted
in the logs view, which holds every line."""
import os
import re

import pytest
from conftest import shutdown_agent, start_server
from jupyter_ui import NotebookPage, write_notebook
from panel_ui import shot

SETUP = """
import os, tempfile, xmesh
ws = tempfile.mkdtemp(prefix="xmws-")
with open(os.path.join(ws, "mod_a.py"), "w") as f:
    f.write("A = 1\\n")

class Talker(xmesh.Actor):
    @xmesh.endpoint
    def talk(self) -> None:
        for i in range(30 if xmesh.current_rank().rank == 0 else 300):
            print(f"line {i}", flush=True)

procs = xmesh.this_host().spawn_procs({"gpus": 2}, name="flood")
watcher = procs.sync_workspace(ws, watch=True)
"""
EDIT = """
with open(os.path.join(ws, "mod_b.py"), "w") as f:
    f.write("B = 2\\n")
"""
FLOOD = 'procs.spawn("t", Talker).talk.call().get()'


@pytest.fixture(scope="module")
def server(request, workdir):
    """This module's server: its kernels show at most 20 lines a second of remote output."""
    saved = dict(os.environ)
    os.environ.update(XMESH_LOG_DISPLAY_RATE="20", XMESH_LOG_DISPLAY_BURST="20")
    try:
        s = start_server(workdir, request.module.__name__)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield s
    s.stop()
    shutdown_agent(workdir)


def test_the_sync_view_and_the_held_back_counts(server, page):
    write_notebook(os.path.join(server.root, "sync.ipynb"), [SETUP, EDIT, FLOOD])
    nb = NotebookPage(page, server, "sync.ipynb")
    nb.run(0, timeout=90)
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="xmesh-panel"]')
    host = "#xmesh-panel .xmesh-sync-host"
    page.wait_for_selector(host, timeout=15000)
    assert re.search(r": 1 added, 0 changed, 0 deleted, received .* · at \d\d:\d\d:\d\d", page.text_content(host))
    assert page.get_attribute(host, "title") == "sent: mod_a.py"
    watcher = "#xmesh-panel .xmesh-sync-watcher[data-state='watching']"
    assert re.search(r"^watching /tmp/xmws-\w+: \d+ syncs?$", page.text_content(watcher)), page.text_content(watcher)
    nb.run(1)  # the watcher sends the new file: the host's row says so
    page.wait_for_function(f"document.querySelector('{host}').title === 'sent: mod_b.py'", timeout=15000)
    # The watcher's row is drawn from its own update, which may come a moment after the host's.
    page.wait_for_function(f"/: ([2-9]|\\d\\d+) syncs$/.test(document.querySelector(\"{watcher}\").textContent)",
                           timeout=15000)
    assert int(re.search(r": (\d+) syncs$", page.text_content(watcher)).group(1)) >= 2
    shot(page, "sync")
    nb.run(2, timeout=60)
    page.click('#xmesh-panel .xmesh-mesh[data-mesh="flood"] .xmesh-mesh-action[data-action="logs"]')
    held = "#xmesh-panel .xmesh-logs-held"
    page.wait_for_selector(held, state="visible", timeout=15000)
    text = page.text_content(held)
    m = re.fullmatch(r"the cells' output held back ([\d,]+) lines of a flood \((.*)\); every line is here", text)
    assert m and int(m.group(1).replace(",", "")) >= 200 and "rank 1: " in m.group(2), text
    page.wait_for_function("document.querySelector('#xmesh-panel .xmesh-logs-note').textContent"
                           ".startsWith('330 of 330')", timeout=15000)
    shot(page, "logs-held-back")
