"""The xmesh panel in JupyterLab (jupyter_ext/, issue 22): its sidebar lists the notebook's mesh
with a grid of 8 ranks, idle; while a cell is blocked in a call that one rank has not answered,
exactly that rank shows "in a call" (with the endpoint on hover), and it is idle again when the
cell ends. Ranks stopped in breakpoint() while their cell waits turn "stopped" and are listed in
the panel's debugger section; a `cast` and `continue` from the panel answer there and release
the cell, which ends with its result. Screenshots of each state go to the test log folder."""
import os
import re

from jupyter_ui import NotebookPage, write_notebook
from panel_ui import HALT, RANKS, SPAWN, halted_with_the_panel_open, shot as _shot, states as _states

def test_the_panel_shows_the_ranks_of_a_blocked_cell(server, page):
    write_notebook(os.path.join(server.root, "panel.ipynb"), [SPAWN, "sorted(slow.nap.call(8).get().values())"])
    nb = NotebookPage(page, server, "panel.ipynb")
    nb.run(0, timeout=90)
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="xmesh-panel"]')
    page.wait_for_function(f"document.querySelectorAll('{RANKS}').length === 8", timeout=15000)
    assert _states(page) == ["idle"] * 8
    facts = page.text_content('#xmesh-panel .xmesh-mesh[data-mesh="grid"] .xmesh-mesh-facts')
    assert "hosts=2 x gpus=4" in facts and "8/8 procs alive" in facts and "kernel pid" in facts, facts
    _shot(page, "idle")
    # Polls update the cells in place: the element under the pointer stays (its hover text too).
    page.eval_on_selector(f'{RANKS}[data-rank="3"]', "c => { c.xmeshMark = true; }")
    page.wait_for_timeout(2500)  # two polls
    assert page.eval_on_selector(f'{RANKS}[data-rank="3"]', "c => c.xmeshMark === true")
    nb.run(1, wait=False)
    # The other ranks answer at once (a moment later under load): then only rank 5 is in the call.
    page.wait_for_function(f"[...document.querySelectorAll('{RANKS}')].map(c => c.dataset.state).join() === "
                           "'idle,idle,idle,idle,idle,call,idle,idle'", timeout=10000)
    title = page.get_attribute(f'{RANKS}[data-rank="5"]', "title")
    assert title.startswith("rank 5 (hosts=1, gpus=1) on ") and "in a call: nap" in title, title
    _shot(page, "in-a-call")
    # `where` while the cell hangs: the stacks of every rank, grouped, the busy one in nap (the
    # debugger section is folded while nothing is stopped: opened first).
    page.click("#xmesh-panel .xmesh-debugger-title")
    page.click("#xmesh-panel .xmesh-debug-button[data-action='where']")
    page.wait_for_function("document.querySelector('#xmesh-panel .xmesh-debug-output').textContent.includes('nap')",
                           timeout=15000)
    where = page.text_content("#xmesh-panel .xmesh-debug-output")
    assert "7 ranks (ranks 0-4,6-7) idle" in where and "1 rank (rank 5) running" in where, where
    assert "in nap" in where and "time.sleep(seconds)" in where, where
    _shot(page, "where")
    nb.wait_done(1, timeout=60)
    page.wait_for_function(f"[...document.querySelectorAll('{RANKS}')].every(c => c.dataset.state === 'idle')",
                           timeout=10000)
    # The logs view, filtered to one rank, shows only that rank's lines, with their times.
    page.click('#xmesh-panel .xmesh-mesh[data-mesh="grid"] .xmesh-mesh-action[data-action="logs"]')
    page.fill("#xmesh-panel .xmesh-logs-rank", "6")
    page.dispatch_event("#xmesh-panel .xmesh-logs-rank", "change")
    page.wait_for_function("document.querySelector('#xmesh-panel .xmesh-logs-note').textContent.startsWith('1 of 1')",
                           timeout=10000)
    (line,) = page.text_content("#xmesh-panel .xmesh-logs-output").splitlines()
    assert line.endswith(" [6] nap of rank 6") and line[2] == ":" and line[8] == ".", line
    _shot(page, "logs")
    # "insert attach" writes the attach into a new cell of the notebook.
    page.click('#xmesh-panel .xmesh-mesh[data-mesh="grid"] .xmesh-mesh-action[data-action="attach"]')
    page.wait_for_function("document.querySelector('.jp-Notebook').textContent.includes('grid = xmesh.attach(\"grid\")')",
                           timeout=10000)
    # "stop" asks first; confirmed, the mesh's procs end and it leaves the list.
    page.click('#xmesh-panel .xmesh-mesh[data-mesh="grid"] .xmesh-mesh-action[data-action="stop"]')
    page.wait_for_selector(".jp-Dialog", timeout=10000)
    assert "Stop grid?" in page.text_content(".jp-Dialog")
    _shot(page, "stop-dialog")
    page.click(".jp-Dialog button.jp-mod-warn")
    page.wait_for_selector('#xmesh-panel .xmesh-mesh[data-mesh="grid"]', state="detached", timeout=20000)


def test_the_status_bar_says_when_ranks_stop_with_the_panel_closed(server, page):
    write_notebook(os.path.join(server.root, "badge.ipynb"), [SPAWN, HALT])
    nb = NotebookPage(page, server, "badge.ipynb")
    nb.run(0, timeout=90)
    nb.run(1, wait=False)
    page.wait_for_selector(".xmesh-status-badge:text-is('xmesh: 2 ranks stopped in pdb')", timeout=20000)
    page.click(".xmesh-status-badge")  # opens the panel
    page.wait_for_selector("#xmesh-panel .xmesh-stopped-row[data-rank='2']", timeout=10000)
    page.click("#xmesh-panel .xmesh-debug-button[data-action='continue']")
    nb.wait_done(1, timeout=60)


def test_ranks_stopped_in_pdb_are_listed_and_continued_from_the_panel(server, page):
    nb = halted_with_the_panel_open(server, page, "halt.ipynb")
    rows = page.eval_on_selector_all("#xmesh-panel .xmesh-stopped-row", "rs => rs.map(r => r.title)")
    assert len(rows) == 2 and all(re.match(r"slow rank [26] \(hosts=\d, gpus=2\) at halt line \d+ \(breakpoint\) "
                                           r"on \S+ · grid, pid \d+", r) for r in rows), rows
    page.wait_for_function(f"[...document.querySelectorAll('{RANKS}')].map(c => c.dataset.state).join() === "
                           "'idle,idle,stopped,idle,idle,idle,stopped,idle'", timeout=10000)
    assert page.text_content(".xmesh-status-badge") == "xmesh: 2 ranks stopped in pdb"
    _shot(page, "stopped")
    page.fill("#xmesh-panel .xmesh-debug-command", "cast slow ranks(2, 6) p y")
    page.press("#xmesh-panel .xmesh-debug-command", "Enter")
    page.wait_for_function("document.querySelector('#xmesh-panel .xmesh-debug-output').textContent.includes('106')",
                           timeout=15000)
    out = page.text_content("#xmesh-panel .xmesh-debug-output")
    assert "[slow rank 2]\n102" in out and "[slow rank 6]\n106" in out, out
    page.click("#xmesh-panel .xmesh-debug-button[data-action='continue']")
    page.wait_for_function("document.querySelector('#xmesh-panel .xmesh-debug-output').textContent"
                           ".includes('continued 2 sessions')", timeout=15000)
    nb.wait_done(1, timeout=60)
    assert "RESULT [100, 101, 102, 103, 104, 105, 106, 107]" in nb.output(1)
    page.wait_for_selector(".xmesh-status-badge", state="hidden", timeout=10000)

