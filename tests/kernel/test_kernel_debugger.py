"""The mesh-aware debugger in the notebook (DESIGN §7): a cell waiting on actors that stop in
pdb becomes the `xmesh_dbg>` prompt, driven here through the Jupyter stdin channel as a front
end's input box would."""
import re

TRAINER = '''
import time
from xmesh import Actor, endpoint, this_host, current_rank

class Trainer(Actor):
    @endpoint
    def step(self, x):
        y = x * 2 + current_rank().rank
        z = y + 1
        if current_rank().rank != 1:
            breakpoint()
        else:
            time.sleep(2)
        return y

procs = this_host().spawn_procs({"gpus": 4})
trainer = procs.spawn("trainer", Trainer)
trainer.initialized.get()
'''


def table_rows(text):
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and "Actor Name" not in line]


def test_breakpoints_on_several_ranks_make_the_cell_the_debugger(kernel):
    kernel.ok(TRAINER)
    conv = kernel.converse("r = trainer.step.call(10).get()\nprint('RESULT', sorted(r.values()))")
    prompt, out = conv.expect_prompt()
    assert prompt == "xmesh_dbg> "
    rows = table_rows(out)
    assert [(r[0], r[1], r[2], r[4], r[5]) for r in rows] == [
        ("trainer", "0", "gpus=0", "step", "13"), ("trainer", "2", "gpus=2", "step", "13"),
        ("trainer", "3", "gpus=3", "step", "13")]

    prompt, out = conv.say("attach trainer 2")
    assert prompt == "[trainer 2] (Pdb) " and "-> return y" in out
    prompt, out = conv.say("p y")
    assert out.strip() == "22"
    prompt, out = conv.say("p z * 10")
    assert out.strip() == "230"
    prompt, out = conv.say("ll")
    assert "breakpoint()" in out and "def step(self, x):" in out  # source of a cell-defined actor
    prompt, out = conv.say("detach")
    assert prompt == "xmesh_dbg> "

    prompt, out = conv.say("cast trainer ranks(0,2:4) p y - 2 * 10")
    assert "[trainer rank 0]\n0" in out and "[trainer rank 2]\n2" in out and "[trainer rank 3]\n3" in out
    prompt, out = conv.say("cast trainer ranks(gpus=(0,3)) p z - y")
    assert "[trainer ranks 0,3]\n1\n" in out  # identical answers once, with their rank set

    prompt, out = conv.say("where")
    assert re.search(r"3 ranks \(ranks 0,2-3\) stopped in pdb", out)
    assert "return y" in out

    prompt, out = conv.say("attach trainer 1")
    assert "trainer rank 1 is not stopped in pdb" in out and prompt == "xmesh_dbg> "
    prompt, out = conv.say("cast trainer ranks(7) p y")
    assert "rank 7 is out of range" in out
    prompt, out = conv.say("frobnicate")
    assert "unknown command 'frobnicate'" in out

    conv.answer("continue")
    r = conv.finish()
    assert r.status == "ok", r.error_text
    assert "RESULT [20, 21, 22, 23]" in r.stdout
