"""JupyterLab 4 in Chromium: a named allocation outlives a kernel restart from the toolbar, and
`xmesh.attach` in the restarted kernel gets the same procs and actors back."""
import os

from jupyter_ui import NotebookPage, write_notebook

CELLS = [
    '''
import xmesh
from xmesh import Actor, endpoint, this_host

class Counter(Actor):
    def __init__(self):
        self.n = 0

    @endpoint
    def incr(self):
        self.n += 1
        return self.n

procs = this_host().spawn_procs({"gpus": 2}, name="kept")
counters = procs.spawn("counters", Counter)
print("PIDS", sorted(procs.pids), sorted(counters.incr.call().get().values()))
''',
    '''
import xmesh
procs = xmesh.attach("kept")
print("PIDS", sorted(procs.pids), sorted(procs.actors("counters").incr.call().get().values()))
procs.stop()
''',
]


def test_a_restart_and_attach_find_the_same_procs(server, page):
    write_notebook(os.path.join(server.root, "restart.ipynb"), CELLS)
    nb = NotebookPage(page, server, "restart.ipynb")
    nb.run(0, timeout=90)
    before = nb.output(0)
    assert "[1, 1]" in before, before
    pids = before.split("PIDS", 1)[1].split("]")[0]
    nb.toolbar("notebook:restart-kernel")
    nb.accept_dialog()
    page.wait_for_timeout(500)
    nb.wait_idle()
    page.wait_for_function("() => document.querySelector('.jp-StatusBar-TextItem') !== null")
    nb.run(1, timeout=90)
    after = nb.output(1)
    assert after.split("PIDS", 1)[1].split("]")[0] == pids, (before, after)  # the same procs
    assert "[2, 2]" in after, after  # and the same actors, with their state
