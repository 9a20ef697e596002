"""The mesh-aware debugger from scripts (DESIGN §7): the prompt on a real terminal (pexpect),
headless runs, a controller attaching later. The commands on stopped and running ranks, driven
in-process: test_debugger_attach.py."""
import contextlib
import os
import subprocess
import sys
import textwrap
import time

import pexpect
import pytest
from xmesh_testing import PYTHON, run_program


HERE = os.path.dirname(os.path.abspath(__file__))


PROGRAM = textwrap.dedent('''
    import sys
    sys.path.insert(0, {here!r})
    from actors_for_tests import Stopper
    from xmesh import this_host
    import xmesh

    procs = this_host().spawn_procs({{"gpus": 4}})
    s = procs.spawn("stopper", Stopper)
    s.initialized.get()
    fut = s.step.call(10, stop_ranks=(0, 2, 3), sleep=2.0)
    {body}
''')


def program(body):
    return PROGRAM.format(here=HERE, body=textwrap.dedent(body).strip())


@contextlib.contextmanager
def terminal_program(body, env=None):
    """The program with body at its end, running on a terminal of its own (pexpect)."""
    path = os.path.join(HERE, f".dbg-prog-{os.getpid()}.py")
    with open(path, "w") as f:
        f.write(program(body))
    full_env = dict(os.environ, **(env or {}))
    child = pexpect.spawn(PYTHON, [path], env=full_env, encoding="utf-8", timeout=30, dimensions=(50, 200))
    try:
        yield child
    finally:
        child.close(force=True)
        os.unlink(path)


def attach_cast_where(term):
    """One session at an `xmesh_dbg>` prompt (a program's own terminal or an `xmesh debug`
    client) with stopper ranks 0, 2, 3 stopped: attach and print, cast, where."""
    term.sendline("attach stopper 2")
    term.expect(r"\[stopper 2\] \(Pdb\) ")
    assert "-> return y + z - z" in term.before
    term.sendline("p y, z")
    term.expect(r"\[stopper 2\] \(Pdb\) ")
    assert "(22, 23)" in term.before
    term.sendline("p y * 100 + z")
    term.expect(r"\[stopper 2\] \(Pdb\) ")
    assert "2223" in term.before
    term.sendline("detach")
    term.expect("xmesh_dbg> ")
    for selector in ("ranks(0:4)", "ranks(0,3)"):
        term.sendline(f"cast stopper {selector} p y")
        term.expect("xmesh_dbg> ")
        out = term.before.replace("\r\n", "\n")
        assert "[stopper rank 0]\n20\n" in out and "[stopper rank 3]\n23\n" in out
    term.sendline("cast stopper ranks(0:2) p y")
    term.expect("xmesh_dbg> ")
    assert "not stopped, skipped: stopper rank 1" in term.before
    term.sendline("where")
    term.expect("xmesh_dbg> ")
    out = term.before.replace("\r\n", "\n")
    assert "3 ranks (ranks 0,2-3) stopped in pdb (breakpoint):" in out
    assert "1 rank (rank 1) running:" in out and "time.sleep(sleep)" in out  # in a C call, no GIL needed


def test_the_terminal_a_script_runs_in_becomes_the_prompt():
    with terminal_program('''
        print("RESULT", sorted(fut.get().values()))
        breakpoint()  # the controller's own breakpoint(): plain pdb
        print("after the controller's pdb")
    ''') as child:
        child.expect("xmesh_dbg> ")
        table = child.before
        for rank in (0, 2, 3):
            assert f"| stopper    | {rank}    | gpus={rank} |" in table
        assert "| stopper    | 1 " not in table
        attach_cast_where(child)
        child.sendline("help")
        child.expect("xmesh_dbg> ")
        assert "cast <actor> ranks(...) <cmd>" in child.before
        child.sendline("continue")
        child.expect(r"RESULT \[20, 21, 22, 23\]")
        child.expect(r"\(Pdb\) ")  # the controller's breakpoint(): ordinary pdb on this terminal
        child.sendline("c")
        child.expect("after the controller's pdb")
        child.expect(pexpect.EOF)


def test_other_ranks_output_waits_until_the_prompt_closes():
    with terminal_program('''
        chat = procs.spawn("chatty", Stopper)
        chat.initialized.get()
        c = chat.slice(gpus=1).chatter.call_one(30, 0.05)
        print("RESULT", sorted(fut.get().values()))
        c.get()
    ''') as child:
        child.expect("xmesh_dbg> ")
        before_prompt = child.before.replace("\r\n", "\n")
        import time
        time.sleep(1.0)  # rank 1 of chatty prints meanwhile
        child.sendline("list")
        child.expect("xmesh_dbg> ")
        assert "chatter" not in child.before
        child.sendline("c")
        child.expect(pexpect.EOF)
        after = child.before.replace("\r\n", "\n")  # everything after the prompt
        assert "RESULT [20, 21, 22, 23]" in after
        # every line once, none while the prompt was open: some before it, the rest after it
        assert all(f"[1] chatter {i}\n" in before_prompt + after for i in range(30)), before_prompt + after
        assert "[1] chatter 29\n" in after


def test_quit_leaves_ranks_stopped_and_debug_reopens_the_prompt():
    with terminal_program('''
        try:
            fut.get()
        except Exception as e:
            print("WAIT FAILED:", type(e).__name__, e)
        xmesh.debug()
        print("RESULT", sorted(fut.get().values()))
    ''') as child:
        child.expect("xmesh_dbg> ")
        child.sendline("quit")
        child.expect("WAIT FAILED: DebuggerQuit ([^\r\n]*)\r\n")
        assert "stopper ranks 0,2-3" in child.match.group(1)
        child.expect("xmesh_dbg> ")  # xmesh.debug()
        assert "| stopper    | 0 " in child.before, (child.match.group(0), child.before)
        child.sendline("c")
        child.expect(r"RESULT \[20, 21, 22, 23\]")
        child.expect(pexpect.EOF)


def test_interrupting_the_prompt_continues_every_session():
    with terminal_program('''
        try:
            fut.get()
        except KeyboardInterrupt as e:
            print("INTERRUPTED:", e)
        print("RESULT", sorted(fut.get().values()))
    ''') as child:
        child.expect("xmesh_dbg> ")
        child.sendintr()
        child.expect("INTERRUPTED: ")
        child.expect(r"RESULT \[20, 21, 22, 23\]")
        child.expect(pexpect.EOF)


def test_a_run_without_input_shows_the_stops_and_continues():
    r = run_program(program('print("RESULT", sorted(fut.get().values()))'),
                    stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "cannot take input" in r.stdout
    assert "| stopper    | 3    | gpus=3 |" in r.stdout
    assert "3 ranks (ranks 0,2-3) stopped in pdb (breakpoint):" in r.stdout
    assert "RESULT [20, 21, 22, 23]" in r.stdout


def test_streams_honour_the_debugger_like_get():
    """Defect: stream() and `async for` waited forever on ranks stopped in breakpoint(): only
    get() and await ran the debugger. Every wait goes through the one wait now.

    Invariant call.5 (docs/architecture/05-call-path.md).
    """
    r = run_program(program('''
        print("STREAM", sorted(f.get() for f in s.step.stream(10, stop_ranks=(0, 2, 3), sleep=0.5)))
        import asyncio

        async def main():
            return sorted([v async for v in s.step.stream(10, stop_ranks=(1,), sleep=0.5)])

        print("ASYNC", asyncio.run(main()))
        print("FUT", sorted(fut.get().values()))
    '''), stdin=subprocess.DEVNULL, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "STREAM [20, 21, 22, 23]" in r.stdout, r.stdout
    assert "ASYNC [20, 21, 22, 23]" in r.stdout, r.stdout
    assert "FUT [20, 21, 22, 23]" in r.stdout, r.stdout
    assert "| stopper    | 1    | gpus=1 |" in r.stdout  # the async stream's stop was shown


def test_a_controller_that_attaches_later_finds_the_ranks_stopped_in_pdb():
    """A kernel restart: the controller that started the call is gone, its named allocation
    lives on with ranks stopped in pdb; the next controller to attach is told of them."""
    first = textwrap.dedent(f'''
        import sys, time
        sys.path.insert(0, {HERE!r})
        from actors_for_tests import Stopper
        from xmesh import this_host
        from xmesh._debug import controller as _debug

        procs = this_host().spawn_procs({{"gpus": 2}}, name="dbg-survivor")
        s = procs.spawn("stopper", Stopper)
        s.initialized.get()
        fut = s.step.call(7, stop_ranks=(1,))
        while not _debug.controller().stopped():
            time.sleep(0.05)
        print("STOPPED", [x["rank"] for x in _debug.debug.sessions()])
    ''')
    r = run_program(first, stdin=subprocess.DEVNULL, timeout=60)
    assert "STOPPED [1]" in r.stdout, r.stdout + r.stderr
    second = textwrap.dedent('''
        import time
        import xmesh
        from xmesh._debug import controller as _debug

        procs = xmesh.attach("dbg-survivor")
        deadline = time.monotonic() + 20
        while not xmesh.debug.sessions() and time.monotonic() < deadline:
            time.sleep(0.05)
        print("SESSIONS", [(x["actor"], x["rank"], x["function"], x["coords"]) for x in xmesh.debug.sessions()])
        xmesh.debug()  # no terminal here: shows the table and the stacks, and continues
        print("LEFT", xmesh.debug.sessions())
        procs.stop()
    ''')
    r = run_program(second, stdin=subprocess.DEVNULL, timeout=60)
    assert "SESSIONS [('stopper', 1, 'step', {'gpus': 1})]" in r.stdout, r.stdout + r.stderr
    assert "| stopper    | 1    | gpus=1 |" in r.stdout
    assert "1 rank (rank 1) stopped in pdb (breakpoint):" in r.stdout
    assert "LEFT []" in r.stdout


def test_xmesh_debug_error_fails_the_wait_naming_the_ranks():
    body = '''
        try:
            fut.get()
        except Exception as e:
            print("FAILED:", type(e).__name__, e)
    '''
    r = run_program(program(body),
                    stdin=subprocess.DEVNULL, env={"XMESH_DEBUG": "error"}, timeout=60)
    assert "FAILED: ActorsStopped XMESH_DEBUG=error with actors stopped in pdb: stopper ranks 0,2-3" in r.stdout, \
        r.stdout + r.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

