"""What the panel does to ranks, as a user meets it (issue 46, points 4-6): a click on a busy rank
pauses it and opens a console on it, whose `detach` lets it run on (as `detach` does in the cell)
and whose `continue` says it runs on; the cell's input box the panel took over is closed; the
logs view takes rank ranges, names a rank past the mesh's end and colours stderr; a call
cancelled inside a C call is said to run on and shows busy; a mesh stopped from the panel is
said to be stopped by the panel, in the cell that last used it."""
import os
import re

from jupyter_ui import NotebookPage, write_notebook
from panel_ui import HALT, RANKS, SPAWN, shot as _shot

DEBUGGER = "#xmesh-panel .xmesh-debugger"
CONSOLE = "#xmesh-panel .xmesh-console"
LOGS = "#xmesh-panel .xmesh-logs"


def rank_state(page, rank):
    return page.get_attribute(f'{RANKS}[data-rank="{rank}"]', "data-state")


def wait_rank(page, rank, state, timeout=20000):
    page.wait_for_function(f"document.querySelector('{RANKS}[data-rank=\"{rank}\"]')?.dataset.state === '{state}'",
                           timeout=timeout)


def test_ranks_attached_from_their_cells_continue_and_detach_as_in_the_cell(server, page):
    write_notebook(os.path.join(server.root, "pause.ipynb"), [
        SPAWN, HALT,
        "r = slow.churn.call(8).get()\nprint('RESULT', sorted(r.values()))", "import time\ntime.sleep(3)\nprint('a later cell')"])
    nb = NotebookPage(page, server, "pause.ipynb")
    nb.run(0, timeout=90)
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="xmesh-panel"]')
    nb.run(1, wait=False)  # ranks 2 and 6 stop in pdb: the cell opens its xmesh_dbg> input box
    assert nb.input_prompt().strip() == "xmesh_dbg>"
    wait_rank(page, 2, "stopped")
    # A click on a stopped rank: attach. The panel takes the debugger over from the cell, which
    # says so (not "above"), and the box it no longer reads is closed.
    page.click(f'{RANKS}[data-rank="2"]')
    page.locator(".xmesh-rank-menu .lm-Menu-item:has-text('Attach to rank 2')").click()
    page.wait_for_selector(f"{CONSOLE}[data-rank='2'] .xmesh-console-current", timeout=20000)
    text = nb.wait_output(1, lambda t: "input box is no longer read" in t, timeout=20)
    assert "above" not in text
    page.wait_for_function("document.querySelectorAll('.jp-Stdin-input').length === 0", timeout=10000)
    # continue: the console says the rank runs on (it said "none of slow rank 2 is stopped").
    page.click(f"{CONSOLE} .xmesh-console-button[data-command='c']")
    page.wait_for_selector(f"{CONSOLE}[data-state='running']", timeout=15000)
    said = page.text_content(f"{CONSOLE} .xmesh-console-output")
    assert "slow rank 2 runs on" in said and "none of" not in said, said
    page.click(f"{DEBUGGER} .xmesh-debug-button[data-action='continue']")
    nb.wait_done(1, timeout=60)
    assert "RESULT [100, 101, 102, 103, 104, 105, 106, 107]" in nb.output(1)
    # A click on a busy rank: pause it and attach; detach lets it run on from where it was (as
    # `detach` does in the cell and in `xmesh debug`), and its cell ends with the result.
    nb.run(2, wait=False)
    wait_rank(page, 5, "call")
    page.click(f'{RANKS}[data-rank="5"]')
    page.locator(".xmesh-rank-menu .lm-Menu-item:has-text('Pause and attach to rank 5')").click()
    page.wait_for_selector(f"{CONSOLE}[data-rank='5'] .xmesh-console-current", timeout=20000)
    assert "time.sleep(0.01)" in page.text_content(f"{CONSOLE} .xmesh-console-source")  # where it was
    _shot(page, "paused-console")
    page.click(f"{CONSOLE} .xmesh-console-close")
    nb.wait_done(2, timeout=60)
    assert "RESULT [0, 1, 2, 3, 4, 5, 6, 7]" in nb.output(2)
    # The logs: a range of ranks, a rank past the end named, stderr in its colour.
    page.click('#xmesh-panel .xmesh-mesh[data-mesh="grid"] .xmesh-mesh-action[data-action="logs"]')
    page.fill(f"{LOGS} .xmesh-logs-rank", "2-3")
    page.dispatch_event(f"{LOGS} .xmesh-logs-rank", "change")
    page.wait_for_function(f"document.querySelector('{LOGS} .xmesh-logs-note').textContent.startsWith('2 of 2')",
                           timeout=10000)
    lines = page.text_content(f"{LOGS} .xmesh-logs-output").splitlines()
    assert sorted(line.split(" ", 2)[1] for line in lines) == ["[2]", "[3]"], lines  # in time order
    page.fill(f"{LOGS} .xmesh-logs-rank", "9")
    page.dispatch_event(f"{LOGS} .xmesh-logs-rank", "change")
    page.wait_for_function(f"document.querySelector('{LOGS} .xmesh-logs-note').textContent.includes('has no rank 9')",
                           timeout=10000)
    assert "its ranks are 0-7" in page.text_content(f"{LOGS} .xmesh-logs-note")
    page.fill(f"{LOGS} .xmesh-logs-rank", "")
    page.dispatch_event(f"{LOGS} .xmesh-logs-rank", "change")
    page.wait_for_selector(f"{LOGS} .xmesh-log-stderr", timeout=10000)
    assert "churn of rank" in page.text_content(f"{LOGS} .xmesh-log-stderr")
    # Stopped from the panel: the notebook hears who stopped it, naming the cell that last used
    # the mesh (that cell ended with nothing left running: no display of its own to write in).
    page.click('#xmesh-panel .xmesh-mesh[data-mesh="grid"] .xmesh-mesh-action[data-action="stop"]')
    page.click(".jp-Dialog button.jp-mod-warn")
    page.wait_for_selector('#xmesh-panel .xmesh-mesh[data-mesh="grid"]', state="detached", timeout=20000)
    nb.run(3)
    text = nb.output(3)
    # One line for the procs that ended together (two if their exits came apart, under load).
    told = re.findall(r"\[xmesh\] about In \[3\]: 'grid' \(ranks? ([0-9,-]+)\): each proc was stopped: "
                      r"by the xmesh panel", text)
    ranks = {r for part in ",".join(told).split(",") for r in (range(int(part.split("-")[0]),
                                                                     int(part.split("-")[-1]) + 1))}
    assert ranks == set(range(8)), text
    assert "exited with code 143" not in text


CANCEL = """
import time, xmesh

class Sleeper(xmesh.Actor):
    @xmesh.endpoint
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)  # one C call: a cancel cannot stop it
        return "rested"

sleepers = xmesh.this_host().spawn_procs({"gpus": 2}).spawn("sleepers", Sleeper)
sleepers.initialized.get()
"""


def test_a_cancel_that_cannot_stop_a_c_call_says_so_and_the_ranks_stay_busy(server, page):
    write_notebook(os.path.join(server.root, "cancel.ipynb"), [
        CANCEL, "fut = sleepers.nap.call(12)\nprint('waiting', flush=True)\nfut.get()",
        "print(sorted(sleepers.nap.call(0).get(timeout=60).values()))"])
    nb = NotebookPage(page, server, "cancel.ipynb")
    nb.run(0, timeout=90)
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="xmesh-panel"]')
    nb.run(1, wait=False)
    nb.wait_output(1, lambda t: "waiting" in t)
    nb.toolbar("notebook:interrupt-kernel")
    nb.wait_done(1, timeout=30)
    assert "call .cancel() on the call's Future" in nb.output(1)
    nb.toolbar("notebook:interrupt-kernel")  # idle: cancels
    text = nb.wait_output(1, lambda t: "still running nap.call()" in t, timeout=20)
    assert "cancelled nap.call() on ranks 0-1" in text and "inside a C call" in text, text
    cells = "#xmesh-panel .xmesh-mesh .xmesh-rank[data-state='call']"
    page.wait_for_function(f"[...document.querySelectorAll(\"{cells}\")].some(c => "
                           "c.title.includes('nap (cancelled, still running)'))", timeout=10000)
    _shot(page, "cancelled-still-running")
    nb.run(2, timeout=60)  # waits behind the sleep, and says so
    out = nb.output(2)
    assert "['rested', 'rested']" in out and "(cancelled, but still inside a C call" in out, out
