"""What the browser tests of the xmesh panel share: the notebook cell that spawns the 2x4 mesh
"grid" with its test actor, the selector of its rank cells, and screenshots kept in the test log
folder (CI artifacts)."""
import os

from conftest import LOG_DIR

SPAWN = """
import time, xmesh

class Slow(xmesh.Actor):
    @xmesh.endpoint
    def nap(self, seconds: float) -> int:
        print(f"nap of rank {xmesh.current_rank().rank}", flush=True)
        if xmesh.current_rank().rank == 5:
            time.sleep(seconds)
        return xmesh.current_rank().rank

    @xmesh.endpoint
    def halt(self) -> int:
        y = 100 + xmesh.current_rank().rank
        if xmesh.current_rank().rank in (2, 6):
            breakpoint()
        return y

procs = xmesh.this_host().spawn_procs({"hosts": 2, "gpus": 4}, name="grid")
slow = procs.spawn("slow", Slow)
"""
RANKS = '#xmesh-panel .xmesh-mesh[data-mesh="grid"] .xmesh-rank'


def states(page):
    return page.eval_on_selector_all(RANKS, "cells => cells.map(c => c.dataset.state)")


def shot(page, name):
    os.makedirs(os.path.join(LOG_DIR, "browser"), exist_ok=True)
    page.screenshot(path=os.path.join(LOG_DIR, "browser", f"panel-{name}.png"))
