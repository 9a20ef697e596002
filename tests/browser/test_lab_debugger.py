"""JupyterLab 4 in Chromium: a cell waiting on actors stopped in breakpoint() becomes the
debugger's prompt in the input box; attach, cast and continue lead to the cell's result."""
import os

from jupyter_ui import NotebookPage, write_notebook

TRAINER = '''
from xmesh import Actor, endpoint, this_host, current_rank

class Trainer(Actor):
    @endpoint
    def step(self, x):
        y = x * 2 + current_rank().rank
        breakpoint()
        return y

procs = this_host().spawn_procs({"gpus": 2})
trainer = procs.spawn("trainer", Trainer)
trainer.initialized.get()
'''


def test_the_debugger_prompt_in_the_input_box(server, page):
    write_notebook(os.path.join(server.root, "debug.ipynb"), [
        TRAINER, "r = trainer.step.call(10).get()\nprint('RESULT', sorted(r.values()))", "print('after')"])
    nb = NotebookPage(page, server, "debug.ipynb")
    nb.run(0, timeout=90)
    nb.run(1, wait=False)
    assert nb.input_prompt().strip() == "xmesh_dbg>"
    table = nb.wait_output(1, lambda t: "2 actors stopped in pdb" in t)
    assert "trainer" in table and "breakpoint" in table
    nb.answer("attach trainer 1")
    assert nb.input_prompt().strip() == "[trainer 1] (Pdb)"
    nb.answer("p y")
    nb.wait_output(1, lambda t: "\n21\n" in t)
    nb.answer("detach")
    assert nb.input_prompt().strip() == "xmesh_dbg>"
    nb.answer("cast trainer ranks(0:2) p y * 100")
    nb.wait_output(1, lambda t: "[trainer rank 0]\n2000" in t and "[trainer rank 1]\n2100" in t)
    nb.answer("continue")
    nb.wait_done(1)
    assert "RESULT [20, 21]" in nb.output(1)
    nb.run(2)
    assert nb.output(2).strip() == "after"


def test_a_leftover_input_box_does_not_hold_other_cells(server, page):
    """Checked in JupyterLab 4.6 (the README said otherwise): interrupting the prompt ends the
    cell but the front end keeps its input box; other cells run all the same, and Enter in the
    box closes it (the kernel drops that late answer)."""
    write_notebook(os.path.join(server.root, "leftover.ipynb"), [
        TRAINER, "fut = trainer.step.call(1)\nfut.get()", "print('other cell ran')",
        "print(sorted(trainer.step.call(2).get().values()))"])
    nb = NotebookPage(page, server, "leftover.ipynb")
    nb.run(0, timeout=90)
    nb.run(1, wait=False)
    assert nb.input_prompt().strip() == "xmesh_dbg>"
    nb.toolbar("notebook:interrupt-kernel")
    nb.wait_done(1)
    assert "KeyboardInterrupt" in nb.output(1)
    leftover = page.locator(".jp-Stdin-input")
    assert leftover.count() == 1  # the box stays
    nb.run(2, timeout=30)  # and does not hold this cell
    assert "other cell ran" in nb.output(2)
    leftover.first.press("Enter")
    leftover.first.wait_for(state="detached", timeout=10000)
    nb.run(3, wait=False)
    assert nb.input_prompt().strip() == "xmesh_dbg>"  # the late answer was not taken as a command
    nb.answer("continue")
    nb.wait_done(3)
    assert "[4, 5]" in nb.output(3)
