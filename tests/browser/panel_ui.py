"""What the browser tests of the xmesh panel share: the notebook cell that spawns the 2x4 mesh
"grid" with its test actor, the selector of its rank cells, a notebook halted in pdb with the
panel open, and screenshots kept in the test log folder (CI artifacts)."""
import os

from conftest import LOG_DIR
from jupyter_ui import NotebookPage, write_notebook

SPAWN = """
import sys, time, xmesh

class Slow(xmesh.Actor):
    @xmesh.endpoint
    def nap(self, seconds: float) -> int:
        print(f"nap of rank {xmesh.current_rank().rank}", flush=True)
        if xmesh.current_rank().rank == 5:
            time.sleep(seconds)
        return xmesh.current_rank().rank

    @xmesh.endpoint
    def churn(self, seconds: float) -> int:
        print(f"churn of rank {xmesh.current_rank().rank}", file=sys.stderr, flush=True)
        end = time.monotonic() + seconds
        while time.monotonic() < end and xmesh.current_rank().rank == 5:
            time.sleep(0.01)  # Python between short C calls: a pause stops it on its next line
        return xmesh.current_rank().rank

    @xmesh.endpoint
    def halt(self) -> int:
        y = 100 + xmesh.current_rank().rank
        if xmesh.current_rank().rank in (2, 6):
            breakpoint()
        return y

if "slow" not in globals():  # a press the browser took late may run this cell twice: one mesh of actors
    procs = xmesh.this_host().spawn_procs({"hosts": 2, "gpus": 4}, name="grid")
    slow = procs.spawn("slow", Slow)
"""
RANKS = '#xmesh-panel .xmesh-mesh[data-mesh="grid"] .xmesh-rank'


def states(page):
    return page.eval_on_selector_all(RANKS, "cells => cells.map(c => c.dataset.state)")


def shot(page, name):
    os.makedirs(os.path.join(LOG_DIR, "browser"), exist_ok=True)
    page.screenshot(path=os.path.join(LOG_DIR, "browser", f"panel-{name}.png"))


HALT = "r = slow.halt.call().get()\nprint('RESULT', sorted(r.values()))"


def halted_with_the_panel_open(server, page, notebook):
    """A notebook that spawns the grid, then a cell whose call stops ranks 2 and 6 in pdb and
    waits; the panel open, both listed as stopped. Returns the notebook's page."""
    write_notebook(os.path.join(server.root, notebook), [SPAWN, HALT])
    nb = NotebookPage(page, server, notebook)
    nb.run(0, timeout=90)
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="xmesh-panel"]')
    nb.run(1, wait=False)
    page.wait_for_selector("#xmesh-panel .xmesh-stopped-row[data-rank='6']", timeout=30000)
    page.wait_for_selector("#xmesh-panel .xmesh-stopped-row[data-rank='2']", timeout=10000)
    return nb
