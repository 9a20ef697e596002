"""JupyterLab 4 in Chromium: a mesh spawned and called from cells, each cell's remote output in
that cell (also output that comes after the cell ended), a summary of ranks' lines alike that
unfolds to them, and progress bars of several ranks ending as one final bar per rank."""
import os

from jupyter_ui import NotebookPage, write_notebook

ACTORS = '''
import sys, time
from xmesh import Actor, endpoint, this_host, current_rank

class Worker(Actor):
    @endpoint
    def hello(self, text):
        print(f"{text} from {current_rank().rank}")
        return current_rank().rank

    @endpoint
    def later(self, delay):
        time.sleep(delay)
        print(f"late line {current_rank().rank}", flush=True)

    @endpoint
    def bars(self, steps):
        from tqdm import tqdm
        for _ in tqdm(range(steps), mininterval=0, desc="train", ncols=60):
            time.sleep(0.02 * (1 + current_rank().rank))

procs = this_host().spawn_procs({"gpus": 4})
workers = procs.spawn("workers", Worker)
workers.initialized.get()
print("spawned")
'''


def test_output_lands_in_the_cell_that_made_the_call(server, page):
    write_notebook(os.path.join(server.root, "cells.ipynb"), [
        ACTORS,
        "fut = workers.later.call(2.0)\nprint('cell one')",
        "print(sorted(workers.hello.call('hi').get().values()))",
        "fut.get()\nprint('waited')",
    ])
    nb = NotebookPage(page, server, "cells.ipynb")
    nb.run(0, timeout=90)
    assert "spawned" in nb.output(0)
    nb.run(1)
    nb.run(2)
    assert "[0, 1, 2, 3]" in nb.output(2)
    # Aggregated: rank 0's own line, and which ranks printed one like it (issue 46: a summary,
    # never a line nobody printed).
    assert "[0] hi from 0  [similar on ranks 1-3]" in nb.output(2), nb.output(2)
    assert "{0:0" not in nb.output(2)
    # The summary unfolds (a click on it) to each rank's own line.
    assert "[3] hi from 3" not in nb.output(2)
    nb.cell(2).locator(".jp-OutputArea details > summary").first.click()
    nb.wait_output(2, lambda t: all(f"[{r}] hi from {r}" in t for r in range(4)), timeout=10)
    # The late lines go into cell one's output (updated in place), never into cells two or three.
    text = nb.wait_output(1, lambda t: "[0] late line 0  [similar on ranks 1-3]" in t or
                          all(f"[{r}] late line {r}" in t for r in range(4)))
    assert "cell one" in text
    nb.run(3)
    assert "late line" not in nb.output(2) + nb.output(3)


def test_progress_bars_of_four_ranks_end_as_one_bar_each(server, page):
    write_notebook(os.path.join(server.root, "bars.ipynb"), [ACTORS, "workers.bars.call(15).get()\nprint('done')"])
    nb = NotebookPage(page, server, "bars.ipynb")
    nb.run(0, timeout=90)
    nb.run(1)
    text = nb.output(1)
    lines = [ln for ln in text.splitlines() if "train:" in ln]
    assert sorted(ln.split("]")[0] for ln in lines) == ["[0", "[1", "[2", "[3"], text  # one line per rank
    assert all("100%" in ln and "15/15" in ln for ln in lines), text
    assert "done" in text and "\r" not in text
