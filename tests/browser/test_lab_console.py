"""The xmesh panel's console on one stopped rank (jupyter_ext/, issue 22), in JupyterLab: `attach`
on a stopped row shows that rank's source with its current line and pdb's answers to typed
commands and to the next/continue buttons, while the notebook's cell waits on the call; ticked
rows are continued alone, and the cell then ends with its result."""
from panel_ui import halted_with_the_panel_open, shot as _shot


def test_one_rank_in_a_console_and_ticked_ranks_continued(server, page):
    """`attach` on a stopped row opens a console on that rank: its source with the current line,
    pdb's answers, step/next/continue; ticking a row and `continue ticked` continues only it."""
    nb = halted_with_the_panel_open(server, page, "console.ipynb")
    page.click("#xmesh-panel .xmesh-stopped-row[data-rank='2'] .xmesh-stopped-attach")
    console = "#xmesh-panel .xmesh-console"
    page.wait_for_selector(f"{console} .xmesh-console-current", timeout=15000)
    assert "return y" in page.text_content(f"{console} .xmesh-console-current")
    assert page.text_content(f"{console} .xmesh-console-title").startswith("slow rank 2 (hosts=0, gpus=2)")
    page.fill(f"{console} .xmesh-console-command", "p y")
    page.press(f"{console} .xmesh-console-command", "Enter")
    page.wait_for_function(f"document.querySelector('{console} .xmesh-console-output').textContent.includes('102')",
                           timeout=15000)
    _shot(page, "console")
    page.click(f"{console} .xmesh-console-button[data-command='n']")  # at the return: pdb says so
    page.wait_for_function(f"document.querySelector('{console} .xmesh-console-output').textContent"
                           ".includes('--Return--')", timeout=15000)
    page.click(f"{console} .xmesh-console-button[data-command='c']")
    page.wait_for_selector(f"{console}[data-state='running']", timeout=15000)
    page.wait_for_selector("#xmesh-panel .xmesh-stopped-row[data-rank='2']", state="detached", timeout=10000)
    # Rank 6 is still stopped and the cell still waits: tick it and continue the ticked ranks.
    page.check("#xmesh-panel .xmesh-stopped-row[data-rank='6'] .xmesh-stopped-tick")
    page.click("#xmesh-panel .xmesh-debug-button[data-action='continue-selected']")
    nb.wait_done(1, timeout=60)
    assert "RESULT [100, 101, 102, 103, 104, 105, 106, 107]" in nb.output(1)
