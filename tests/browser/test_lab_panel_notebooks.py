"""The xmesh panel with several notebooks (issue 46, points 1-3): each kernel's meshes are named by
its notebook; the debugger section talks to the kernel of the notebook in front, says where else
ranks are stopped, and can be aimed at another kernel (and stays there); a broadcast's ranks show
busy; a stopped rank's row is two short lines at the sidebar's width."""
import os

from jupyter_ui import NotebookPage, write_notebook
from panel_ui import HALT, SPAWN, shot as _shot

LOOPER = """
import time, xmesh

class Looper(xmesh.Actor):
    @xmesh.endpoint
    def loop(self, seconds: float) -> None:
        time.sleep(seconds)

loopers = xmesh.this_host().spawn_procs({"gpus": 2}).spawn("loopers", Looper)
loopers.initialized.get()
"""
DEBUGGER = "#xmesh-panel .xmesh-debugger"


def debugger_title(page):
    return page.text_content(f"{DEBUGGER} .xmesh-debugger-title")


def wait_debugger_title(page, text, timeout=15000):
    page.wait_for_function(f"document.querySelector('{DEBUGGER} .xmesh-debugger-title').textContent === {text!r}",
                           timeout=timeout)


def test_the_debugger_follows_the_notebook_in_front_and_names_meshes_by_notebook(server, page):
    write_notebook(os.path.join(server.root, "train.ipynb"), [SPAWN, HALT])
    write_notebook(os.path.join(server.root, "sweep.ipynb"), [LOOPER, "loopers.loop.broadcast(20)\nprint('sent')"])
    train = NotebookPage(page, server, "train.ipynb")
    train.run(0, timeout=90)
    train.run(1, wait=False)  # ranks 2 and 6 stop in pdb; the cell waits
    sweep = NotebookPage(page, server, "sweep.ipynb")  # train.ipynb's tab closes, its kernel lives on
    sweep.run(0, timeout=90)
    sweep.run(1)
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="xmesh-panel"]')
    # The broadcast's ranks are busy (they were shown idle: only .call() was tracked).
    looper_cells = '#xmesh-panel .xmesh-mesh[data-mesh-id] .xmesh-rank'
    page.wait_for_function(
        "[...document.querySelectorAll('#xmesh-panel .xmesh-mesh')].some(m => "
        "m.querySelector('.xmesh-mesh-title').textContent === 'unnamed mesh of sweep.ipynb' && "
        "[...m.querySelectorAll('.xmesh-rank')].every(c => c.dataset.state === 'call'))", timeout=20000)
    titles = page.eval_on_selector_all(looper_cells, "cs => cs.map(c => c.title)")
    assert any("in a call: loop (broadcast)" in t for t in titles), titles
    facts = page.eval_on_selector_all("#xmesh-panel .xmesh-mesh-facts", "fs => fs.map(f => f.textContent)")
    assert any("notebook train.ipynb (kernel pid" in f for f in facts), facts
    assert any("notebook sweep.ipynb (kernel pid" in f for f in facts), facts
    # The notebook in front is sweep.ipynb: the debugger talks to its kernel, and says that ranks
    # are stopped in train.ipynb (not in a kernel that has no `loop`: issue 46, point 1).
    wait_debugger_title(page, "Debugger · sweep.ipynb")
    other = page.locator(f"{DEBUGGER} .xmesh-debug-other")
    other.wait_for(timeout=15000)
    assert other.text_content() == "2 ranks stopped in train.ipynb: show"
    _shot(page, "notebooks-sweep")
    other.click()
    wait_debugger_title(page, "Stopped in pdb (2) · train.ipynb")
    assert page.eval_on_selector(f"{DEBUGGER} .xmesh-debug-target", "s => s.selectedOptions[0].textContent") \
        == "train.ipynb · 2 stopped"
    # Each stopped rank is two short lines at the sidebar's default width (it wrapped to 7).
    page.wait_for_selector(f"{DEBUGGER} .xmesh-stopped-row[data-rank='6']", timeout=10000)
    heights = page.eval_on_selector_all(
        f"{DEBUGGER} .xmesh-stopped-row .xmesh-stopped-text",
        "ts => ts.map(t => t.getBoundingClientRect().height / t.firstChild.getBoundingClientRect().height)")
    assert heights and all(h < 2.6 for h in heights), heights
    who = page.eval_on_selector_all(f"{DEBUGGER} .xmesh-stopped-who", "ws => ws.map(w => w.textContent)")
    assert who == ["slow rank 2 (hosts=0, gpus=2)", "slow rank 6 (hosts=1, gpus=2)"], who
    _shot(page, "notebooks-train")
    # The choice stays while sweep.ipynb is in front; commands go to train.ipynb's kernel.
    page.wait_for_timeout(2000)
    assert debugger_title(page) == "Stopped in pdb (2) · train.ipynb"
    page.fill(f"{DEBUGGER} .xmesh-debug-command", "cast slow ranks(6) p y")
    page.press(f"{DEBUGGER} .xmesh-debug-command", "Enter")
    page.wait_for_function(f"document.querySelector('{DEBUGGER} .xmesh-debug-output').textContent.includes('106')",
                           timeout=15000)
    # Picked back in the list: sweep.ipynb's kernel, whose ranks run a broadcast, and `where`
    # there shows them in `loop`.
    page.select_option(f"{DEBUGGER} .xmesh-debug-target", label="sweep.ipynb")
    wait_debugger_title(page, "Debugger · sweep.ipynb")
    assert page.text_content(f"{DEBUGGER} .xmesh-debug-output") == ""  # the other kernel's answers went
    page.click(f"{DEBUGGER} .xmesh-debug-button[data-action='where']")
    page.wait_for_function(f"document.querySelector('{DEBUGGER} .xmesh-debug-output').textContent.includes('in loop')",
                           timeout=20000)
    # train.ipynb again, continued from the panel: its cell ends with the result.
    page.select_option(f"{DEBUGGER} .xmesh-debug-target", label="train.ipynb · 2 stopped")
    wait_debugger_title(page, "Stopped in pdb (2) · train.ipynb")
    page.click(f"{DEBUGGER} .xmesh-debug-button[data-action='continue']")
    wait_debugger_title(page, "Debugger · train.ipynb", timeout=20000)
    assert not page.eval_on_selector(DEBUGGER, "d => d.open")  # folded once nothing is stopped
