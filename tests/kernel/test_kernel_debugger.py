"""The mesh-aware debugger in the notebook (DESIGN §7): a cell waiting on actors that stop in
pdb becomes the `xmesh_dbg>` prompt, driven here through the Jupyter stdin channel as a front
end's input box would."""
import re
import time

import pytest
from cells import TRAINER, table_rows


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


@pytest.mark.parametrize("loop", ["f.get() for f", "v async for v"])
def test_a_cell_iterating_a_stream_becomes_the_debugger_too(kernel, loop):
    """Defect: only get() and await ran the debugger; a stream over stopped ranks hung.

    Invariant call.5 (docs/architecture/05-call-path.md).
    """
    kernel.ok(TRAINER)
    code = (f"r = [{loop} in trainer.step.stream(10)]\nprint('RESULT', sorted(r))")
    conv = kernel.converse(code)
    prompt, out = conv.expect_prompt()
    assert prompt == "xmesh_dbg> "
    assert sorted(int(r[1]) for r in table_rows(out)) == [0, 2, 3]
    conv.answer("continue")
    r = conv.finish()
    assert r.status == "ok", r.error_text
    assert "RESULT [20, 21, 22, 23]" in r.stdout


def test_quit_fails_the_cell_and_the_magic_reopens_the_prompt(kernel):
    kernel.ok(TRAINER)
    kernel.ok("fut = trainer.step.call(1)")
    conv = kernel.converse("fut.get()")
    prompt, out = conv.expect_prompt()
    assert "| trainer    | 3 " in out
    conv.answer("quit")
    r = conv.finish()
    assert r.status == "error" and r.error["ename"] == "DebuggerQuit"
    assert "trainer ranks 0,2-3" in r.error["evalue"]

    conv = kernel.converse("%xmesh_debug")
    prompt, out = conv.expect_prompt()
    assert prompt == "xmesh_dbg> " and "| trainer    | 0 " in out
    conv.answer("c")
    r = conv.finish()
    assert r.status == "ok" and "no actor is stopped in pdb any more" in r.stdout
    assert kernel.value("sorted(fut.get().values())") == "[2, 3, 4, 5]"


def test_interrupting_the_prompt_raises_keyboardinterrupt_and_continues(kernel):
    kernel.ok(TRAINER)
    conv = kernel.converse("fut = trainer.step.call(1)\nfut.get()")
    conv.expect_prompt()
    kernel.interrupt()
    r = conv.finish()
    assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt", r.error_text
    # every session was continued: the call completes
    assert kernel.value("sorted(fut.get().values())") == "[2, 3, 4, 5]"
    assert kernel.value("__import__('xmesh').debug.sessions()") == "[]"


def test_an_answer_typed_late_into_an_interrupted_prompt_is_not_taken_by_the_next(kernel):
    """The front end keeps the input box of an interrupted prompt; what the user types there
    later answers a request that is gone, and must not become the next prompt's command."""
    kernel.ok(TRAINER)
    conv = kernel.converse("fut = trainer.step.call(1)\nfut.get()")
    conv.expect_prompt()
    abandoned = conv.request
    kernel.interrupt()
    assert conv.finish().error["ename"] == "KeyboardInterrupt"
    conv.answer("frobnicate", request=abandoned)  # typed into the old box, after the fact
    conv = kernel.converse("fut = trainer.step.call(2)\nprint('RESULT', sorted(fut.get().values()))")
    prompt, out = conv.expect_prompt()
    prompt, out = conv.say("list")
    assert "| trainer    | 3 " in out
    conv.answer("c")
    r = conv.finish()
    assert r.status == "ok", r.error_text
    assert "frobnicate" not in r.stdout and "RESULT [4, 5, 6, 7]" in r.stdout


@pytest.mark.parametrize("window", ["3", "None"], ids=["aggregated", "window-off"])
def test_other_output_waits_while_the_prompt_owns_the_cell(kernel, window):
    kernel.ok(TRAINER + f'''
procs.logging_option(aggregate_window_sec={window})

class Chatty(Actor):
    @endpoint
    def chat(self, n):
        for i in range(n):
            print("chatter", i, flush=True)
            time.sleep(0.05)

chatty = procs.spawn("chatty", Chatty)
chatty.initialized.get()
''')
    conv = kernel.converse("c = chatty.chat.call(20)\nr = trainer.step.call(1).get()\nc.get()\nprint('DONE')")
    prompt, out = conv.expect_prompt()
    # while the prompt is open the chatter keeps coming from the procs, but is held back
    import time
    time.sleep(1.2)
    prompt, out = conv.say("list")
    assert "chatter" not in out, out
    conv.answer("c")
    r = conv.finish()
    assert r.status == "ok", r.error_text
    before_prompt, after_prompt = r.stdout.split("no actor is stopped in pdb any more")
    # The chatter held back comes after the prompt (the first lines may precede it: the chat
    # starts before the breakpoint). Ranks that drift apart under load merge into lines such
    # as "[ranks 0-3] chatter {1,1,1,0}", so look at the numbers, not the line shapes; every
    # line is whole (print writes a line at once, never "chatter" then " 0").
    def numbers(text):
        return {int(n) for line in re.findall(r"chatter (.*)", text) for n in re.findall(r"\d+", line)}
    assert 19 in numbers(after_prompt) and len(numbers(after_prompt)) >= 10, r.stdout
    assert numbers(before_prompt) | numbers(after_prompt) == set(range(20)), r.stdout
    assert not re.search(r"chatter\s*\n", r.stdout), r.stdout


def test_a_broadcast_that_stops_every_rank_names_them_all(kernel):
    """Issue 17, defect 8: the notice of stops no call waits for named one rank of four."""
    kernel.ok(TRAINER.replace("if current_rank().rank != 1:", "if True:"))
    msg_id = kernel.send("trainer.step.broadcast(10)\nimport time\ntime.sleep(3)\nprint('slept')")
    said = kernel.wait_for_output(msg_id, lambda t: "slept" in t, timeout=30)
    notices = [ln for ln in said.splitlines() if "stopped in pdb at" in ln]
    assert len(notices) == 1, said
    assert "trainer ranks 0-3 stopped in pdb at" in notices[0] and "no call waits for them" in notices[0], said
    kernel.collect(msg_id)
    kernel.ok("procs.stop()")

