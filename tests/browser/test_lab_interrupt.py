"""JupyterLab 4 in Chromium: the toolbar's interrupt stops a cell blocked in get(), naming the
ranks still running; the kernel and the mesh live on."""
import os

from jupyter_ui import NotebookPage, write_notebook

SPINNER = '''
import time
from xmesh import Actor, endpoint, this_host

class Spinner(Actor):
    @endpoint
    def spin(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        return "spun"

procs = this_host().spawn_procs({"gpus": 2})
spinner = procs.spawn("spinner", Spinner)
spinner.initialized.get()
'''

CELLS = [SPINNER, "fut = spinner.spin.call(60)\nprint('waiting', flush=True)\nfut.get()",
         "print(sorted(spinner.spin.call(0).get(timeout=60).values()) if fut.cancel() else 'not cancelled')"]


def interrupt_a_blocked_cell(server, page, name):
    write_notebook(os.path.join(server.root, name), CELLS)
    nb = NotebookPage(page, server, name)
    nb.run(0, timeout=90)
    nb.run(1, wait=False)
    nb.wait_output(1, lambda t: "waiting" in t)
    nb.toolbar("notebook:interrupt-kernel")
    nb.wait_done(1, timeout=30)
    text = nb.output(1)
    assert "KeyboardInterrupt" in text and "ranks still running: [0, 1]" in text, text
    nb.run(2, timeout=60)  # the kernel lives; cancelling frees the actors
    assert "['spun', 'spun']" in nb.output(2), nb.output(2)


def test_the_toolbars_interrupt_stops_a_cell_blocked_in_get(server, page):
    interrupt_a_blocked_cell(server, page, "interrupt.ipynb")
