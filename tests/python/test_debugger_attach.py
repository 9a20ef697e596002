"""The mesh debugger's commands on stopped and running ranks, driven in this process (a scripted
prompt): one message each way per pdb command, `l` with code only the controller has, stepping,
async endpoints and what they await, `where` on ranks holding the GIL or churning frames,
post-mortem, bad commands, attaching to and pausing running ranks (also in a native wait), and a
rank dying while stopped."""
import linecache
import os
import signal
import textwrap
import time

import pytest
from actors_for_tests import Stopper
from xmesh_testing import wait_until

from xmesh import ActorError, SupervisionError, this_host
from xmesh._debug import controller as _debug


# -- in-process: this test process is the controller -------------------------------------------------
class ScriptedIO:
    """The user's side of a DebugPrompt: lines typed in order; everything shown is kept."""

    def __init__(self, lines):
        self.lines = list(lines)
        self.shown = []

    def write(self, text):
        self.shown.append(text)

    def show_table(self, sessions):
        from xmesh._debug.io import format_table

        self.write(format_table(sessions))

    def read(self, prompt):
        self.shown.append(prompt)
        if not self.lines:
            raise EOFError
        line = self.lines.pop(0)
        self.shown.append(line + "\n")
        return line

    @property
    def text(self):
        return "".join(self.shown)


@pytest.fixture(scope="module")
def stoppers():
    procs = this_host().spawn_procs({"gpus": 2})
    mesh = procs.spawn("stoppers", Stopper)
    mesh.initialized.get()
    yield procs, mesh
    _debug.controller().continue_all()
    procs.stop()


def stopped_sessions(n):
    ctrl = _debug.controller()
    assert wait_until(lambda: len(ctrl.stopped()) == n, timeout=20), ctrl.stopped()
    return ctrl.stopped()


def test_one_message_each_way_per_pdb_command(stoppers):
    procs, mesh = stoppers
    fut = mesh.step.call(1, stop_ranks=(0, 1))
    ctrl = _debug.controller()
    s0, s1 = stopped_sessions(2)
    events0, events1 = s0.events, s1.events
    sent = ctrl.commands_sent
    answers = ctrl.send([s0, s1], "!for i in range(200): print('line', i)")
    assert ctrl.commands_sent - sent == 2  # one command per rank
    assert s0.events - events0 == 1 and s1.events - events1 == 1  # one answer per rank, 200 lines each
    for text in answers.values():
        assert text.count("line ") == 200 and text.endswith("(Pdb) ")
    ctrl.continue_all()
    assert sorted(fut.get().values()) == [2, 3]


def test_l_shows_code_that_only_the_controller_has(stoppers):
    procs, mesh = stoppers
    # Code compiled from a string under a made-up file name, as notebooks do with cells: its
    # source exists only in the controller's linecache.
    name = "<cell-only-on-the-controller-7>"
    src = textwrap.dedent('''
        from xmesh import Actor, endpoint

        class FromACell(Actor):
            @endpoint
            def go(self):
                marker = "the source came from the controller"
                breakpoint()
                return marker
    ''')
    linecache.cache[name] = (len(src), None, src.splitlines(keepends=True), name)
    ns = {"__name__": "__main__"}
    exec(compile(src, name, "exec"), ns)
    actor = procs.slice(gpus=0).spawn("fromacell", ns["FromACell"])
    fut = actor.go.call_one()
    (s,) = stopped_sessions(1)
    assert s.file == name and s.function == "go"
    io = ScriptedIO(["attach fromacell 0", "ll", "detach", "c"])
    assert _debug.DebugPrompt(_debug.controller(), io).run() == "resumed"
    assert 'marker = "the source came from the controller"' in io.text
    assert fut.get() == "the source came from the controller"


def test_attached_pdb_steps_breaks_and_continues(stoppers):
    import inspect

    procs, mesh = stoppers
    fut = mesh.slice(gpus=0).walk.call_one()
    stopped_sessions(1)
    src, first = inspect.getsourcelines(Stopper.walk)
    ret_line = first + next(i for i, line in enumerate(src) if "return d" in line)
    io = ScriptedIO(["attach stoppers 0", "n", "p b", "n", "p c", f"b actors_for_tests.py:{ret_line}", "c",
                     "p d", "c", "c"])
    assert _debug.DebugPrompt(_debug.controller(), io).run() == "resumed"
    text = io.text.replace("[stoppers 0] (Pdb) ", "(Pdb) ")
    assert "-> b = a + 1" in text          # where it stopped, replayed on attach
    assert "n\n> " in text and "-> c = b * 10" in text and "p b\n2\n" in text
    assert "-> d = c + 1" in text and "p c\n20\n" in text
    assert "Breakpoint 1 at " in text and f"actors_for_tests.py:{ret_line}" in text
    assert "-> return d" in text and "p d\n21\n" in text
    assert "stoppers rank 0 is" in text    # the last `c` let it run: back at xmesh_dbg>
    assert fut.get() == 21


def test_an_async_endpoint_stops_too(stoppers):
    procs, mesh = stoppers
    fut = mesh.slice(gpus=1).astep.call_one(5)
    (s,) = stopped_sessions(1)
    assert (s.actor, s.rank, s.function) == ("stoppers", 1, "astep")
    assert _debug.controller().send([s], "p y")[s].startswith("105\n")
    _debug.controller().continue_all()
    assert fut.get() == 105


def test_where_shows_what_an_async_endpoint_awaits(stoppers):
    """A thread dump shows an awaiting endpoint only as the loop's select(); `where` shows
    its chain of suspended coroutines beside the ranks stopped in pdb."""
    procs, mesh = stoppers
    napping = mesh.slice(gpus=1).await_nap.call_one(3.0)
    stopped = mesh.slice(gpus=0).step.call_one(4, stop_ranks=(0,))
    stopped_sessions(1)
    ctrl = _debug.controller()
    assert wait_until(lambda: "awaiting" in ctrl.format_stacks(), timeout=10)
    text = ctrl.format_stacks()
    assert "1 rank (rank 0) stopped in pdb (breakpoint):" in text
    awaiting = text.split("1 rank (rank 1) awaiting:\n")[1]
    lines = awaiting.splitlines()
    assert "in await_nap" in lines[0] and "await self._nap(seconds)" in lines[1]
    assert "in _nap" in lines[2] and "await asyncio.sleep(seconds)" in lines[3]
    ctrl.continue_all()
    assert stopped.get() == 8 and napping.get() == 1


def test_where_keeps_apart_two_meshes_spawned_with_one_name(stoppers):
    """A spawn run twice (a notebook cell run again) puts two meshes named alike on the procs:
    `where` lists each with its own ranks, by its id, never one mesh of twice the ranks."""
    procs, mesh = stoppers
    again = procs.spawn("stoppers", Stopper)
    again.initialized.get()
    text = _debug.controller().format_stacks()
    titles = [line for line in text.splitlines() if "stoppers" in line]  # other tests' meshes may live on
    assert len(titles) == 2 and all(t.endswith(" named 'stoppers'): 2 ranks") for t in titles), text
    assert "stoppers: 4 ranks" not in text
    only = _debug.controller().format_stacks(only=("stoppers", [1]))
    assert only.count("1 rank (rank 1) idle") == 2, only
    again.stop().get()


def test_where_sees_a_rank_whose_proc_holds_the_gil_and_stops_outlive_supervision(stoppers):
    """Rank 1's proc holds its GIL in a C call: its stack still comes (dumped by the proc's I/O
    thread), and rank 0 stays stopped past the host timeout with nothing declared dead."""
    procs, mesh = stoppers
    stopped = mesh.slice(gpus=0).step.call_one(3, stop_ranks=(0,))
    stopped_sessions(1)
    holding = mesh.slice(gpus=1).hold_gil.call_one(4)
    time.sleep(0.5)  # rank 1 is inside sleep() now
    text = _debug.controller().format_stacks()
    assert "1 rank (rank 0) stopped in pdb (breakpoint):" in text
    held = text.split("1 rank (rank 1) running:\n")[1]
    assert "in hold_gil" in held and "ctypes.PyDLL(None).sleep(int(seconds))" in held, text
    timeout_s = int(os.environ.get("XMESH_HOSTD_TIMEOUT_MS", "4000")) / 1000
    time.sleep(timeout_s + 0.5)  # longer than supervision waits for a silent host
    assert holding.get() == 1
    (s,) = stopped_sessions(1)
    assert s.rank == 0 and _debug.controller().send([s], "p x * 3")[s].startswith("9\n")
    _debug.controller().continue_all()
    assert stopped.get() == 6


def test_post_mortem_stops_at_the_raising_frame(stoppers):
    procs, mesh = stoppers
    _debug.debug.post_mortem(True)
    try:
        fut = mesh.slice(gpus=0).fail.call_one(5)
        (s,) = stopped_sessions(1)
        assert (s.reason, s.function) == ("exception", "fail")
        assert _debug.controller().send([s], "p local_value")[s].startswith("15\n")
        _debug.controller().continue_all()
        with pytest.raises(ActorError, match="bad input 15"):
            fut.get()
    finally:
        _debug.debug.post_mortem(False)
    # Off again: the error comes straight back.
    with pytest.raises(ActorError, match="bad input 6"):
        mesh.slice(gpus=0).fail.call_one(2).get()


def test_a_rank_that_dies_while_stopped_leaves_the_table_with_a_note():
    procs = this_host().spawn_procs({"gpus": 2})
    try:
        mesh = procs.spawn("doomed", Stopper)
        pids = mesh.pid.call().get()
        fut = mesh.step.call(1, stop_ranks=(0, 1))
        stopped_sessions(2)
        os.kill(pids.item(gpus=0), signal.SIGKILL)
        ctrl = _debug.controller()
        assert wait_until(lambda: len(ctrl.stopped()) == 1, timeout=20)
        io = ScriptedIO(["list", "c"])
        _debug.DebugPrompt(ctrl, io).run()
        assert "doomed rank 0 died while stopped in pdb" in io.text
        assert "| doomed     | 1 " in io.text and "| doomed     | 0 " not in io.text
        with pytest.raises(SupervisionError):
            fut.get()
    finally:
        procs.stop()


def test_bad_commands_keep_the_prompt(stoppers):
    procs, mesh = stoppers
    fut = mesh.step.call(1, stop_ranks=(1,), sleep=0)
    stopped_sessions(1)
    time.sleep(0.3)  # rank 0 has answered: idle
    io = ScriptedIO(["attach stoppers 0", "attach stoppers x", "attach nobody 1", "cast stoppers ranks(1", "cast stoppers ranks(gpu=1) p y",
                     "cast stoppers ranks(1)", "detach", "jump", "c"])
    assert _debug.DebugPrompt(_debug.controller(), io).run() == "resumed"
    text = io.text
    assert "stoppers rank 0 is not stopped in pdb and runs no call now" in text, text
    assert "'x' is not a rank" in text
    assert "no actor mesh named 'nobody' lives on this program's procs; live ones:" in text, text
    assert "has no closing parenthesis" in text
    assert "this mesh has no dimension 'gpu' (its dimensions: gpus)" in text
    assert "cast needs a pdb command after the ranks" in text
    assert "not attached to any rank" in text
    assert "unknown command 'jump'" in text
    assert sorted(fut.get().values()) == [2, 3]


def running_in(actor, rank, function, how="running"):
    """Whether `where` shows that rank running (or `how`: "awaiting") inside that function."""
    stacks = _debug.controller().stacks()[0].get(actor, [])
    return any(r == rank and state == how and any(f[2] == function for f in frames)
               for r, state, frames in stacks)


def test_attach_stops_a_running_rank_where_it_is_and_detach_lets_it_run_on(stoppers):
    """Issue 18: `attach` on a rank that runs (a Python loop) stops it at its next line in the
    user's code; pdb works there; `detach` lets it run on, and the call's result is unchanged."""
    from actors_for_tests import busy_result

    procs, mesh = stoppers
    work = 12_000_000
    fut = mesh.busy.call(work)
    assert wait_until(lambda: running_in("stoppers", 1, "busy_result"), timeout=20)
    io = ScriptedIO(["attach stoppers 1", "p (i > 0, total < until_total)", "n", "p 'still here'", "detach"])
    _debug.DebugPrompt(_debug.controller(), io).run(leave_when_resumed=False)
    text = io.text
    assert "[xmesh] attached to stoppers rank 1" in text, text
    assert "(True, True)" in text and "'still here'" in text, text
    assert "detached from stoppers rank 1; it runs on" in text, text
    assert list(fut.get(timeout=60).values()) == [busy_result(work)] * 2


def test_pause_several_ranks_and_a_rank_in_a_native_wait(stoppers):
    """`pause` stops running ranks (they join the table, reason `attached`); a rank in
    time.sleep stops once it returns to Python; `continue` lets every one go."""
    procs, mesh = stoppers
    ctrl = _debug.controller()
    fut = mesh.step.call(1, stop_ranks=(), sleep=2.0)
    assert wait_until(lambda: running_in("stoppers", 0, "step") and running_in("stoppers", 1, "step"), timeout=20)
    io = ScriptedIO(["pause stoppers ranks(0:2)"])
    _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
    assert "inside a C call or a blocking system call" in io.text, io.text
    sessions = stopped_sessions(2)  # once time.sleep returned
    assert {s.reason for s in sessions} == {"attached"} and {s.rank for s in sessions} == {0, 1}
    assert all(s.function == "step" for s in sessions), [(s.function, s.line) for s in sessions]
    ctrl.continue_all()
    assert sorted(fut.get(timeout=30).values()) == [2, 3]
    # An idle actor: `attach` says so and leaves it be; `pause` stops it at the start of its next call.
    io = ScriptedIO(["attach stoppers 0", "pause stoppers ranks(0)"])
    _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
    assert "stoppers rank 0 is not stopped in pdb and runs no call now" in io.text, io.text
    assert "stoppers rank 0 is idle: it stops at the start of its next call" in io.text, io.text
    fut = mesh.slice(gpus=0).walk.call_one()
    (s,) = stopped_sessions(1)
    assert s.reason == "attached" and s.function == "walk"
    ctrl.continue_all()
    stopped_sessions(1)  # walk's own breakpoint()
    ctrl.continue_all()
    assert fut.get(timeout=30) == 21


def test_continue_before_a_native_wait_ends_withdraws_the_pause(stoppers):
    """A rank in time.sleep cannot stop before it returns to Python; `continue` meanwhile
    withdraws the pause: it finishes its call without stopping, and its next call too."""
    procs, mesh = stoppers
    ctrl = _debug.controller()
    fut = mesh.step.call(1, stop_ranks=(), sleep=2.0)
    assert wait_until(lambda: running_in("stoppers", 0, "step"), timeout=20)
    io = ScriptedIO(["attach stoppers 0", "continue"])
    _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
    assert "stoppers rank 0 is inside a C call or a blocking system call" in io.text, io.text
    assert "time.sleep(sleep)" in io.text, io.text  # where it waits
    assert sorted(fut.get(timeout=30).values()) == [2, 3]
    assert mesh.slice(gpus=0).step.call_one(5, stop_ranks=(), sleep=0).get(timeout=30) == 10
    assert ctrl.stopped() == []


def test_attach_stops_an_async_endpoint_in_its_own_coroutine_only(stoppers):
    """An async endpoint runs on its actor's own loop thread: attach stops it at its next line
    in its own coroutine (never another actor's), detach lets it run on with its result
    unchanged; one awaiting something long is said to be awaiting, with its stack, and stops
    when its coroutine runs again."""
    procs, mesh = stoppers
    others = procs.spawn("others", Stopper)
    others.initialized.get()
    ctrl = _debug.controller()
    theirs = others.count_async.call(40, 0.02)  # lines on the same loop all along
    mine = mesh.count_async.call(40, 0.02)
    assert wait_until(lambda: running_in("stoppers", 0, "count_async", "awaiting"), timeout=20)
    io = ScriptedIO(["attach stoppers 0", "p 0 <= done < 40", "n", "detach"])
    _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
    assert "[xmesh] attached to stoppers rank 0" in io.text and "True" in io.text, io.text
    assert "detached from stoppers rank 0; it runs on" in io.text, io.text
    assert list(mine.get(timeout=30).values()) == [40, 40] and list(theirs.get(timeout=30).values()) == [40, 40]
    assert not any(s.actor == "others" for s in ctrl.sessions.values())

    # Two actors of one proc paused in async endpoints: each stops in its own coroutine, on its
    # own loop (neither holds the other's); the one left stopped is the other actor.
    theirs = others.slice(gpus=0).count_async.call_one(40, 0.02)
    mine = mesh.slice(gpus=0).count_async.call_one(40, 0.02)
    assert wait_until(lambda: running_in("stoppers", 0, "count_async", "awaiting")
                      and running_in("others", 0, "count_async", "awaiting"), timeout=20)
    io = ScriptedIO(["pause stoppers ranks(0)", "pause others ranks(0)", "attach stoppers 0", "detach"])
    _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
    table = io.text.split("xmesh_dbg> pause others ranks(0)")[1].split("xmesh_dbg> attach")[0]
    assert "| others " in table and "| stoppers " in table, io.text  # both stopped at once
    (s,) = stopped_sessions(1)
    assert (s.actor, s.rank, s.function) == ("others", 0, "count_async"), io.text
    ctrl.continue_all()
    assert mine.get(timeout=30) == 40 and theirs.get(timeout=30) == 40

    long_nap = mesh.slice(gpus=1).count_async.call_one(2, 3.0)
    assert wait_until(lambda: running_in("stoppers", 1, "count_async", "awaiting"), timeout=20), \
        (ctrl.stopped(), ctrl.format_stacks())
    io = ScriptedIO(["attach stoppers 1"])
    _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
    assert "stoppers rank 1 is in an async endpoint awaiting something" in io.text, io.text
    assert "count_async" in io.text and "await asyncio.sleep(nap)" in io.text, io.text  # where it awaits
    (s,) = stopped_sessions(1)  # when the nap ends
    assert (s.actor, s.rank, s.reason, s.function) == ("stoppers", 1, "attached", "count_async")
    ctrl.continue_all()
    assert long_nap.get(timeout=30) == 2
    others.stop()


def test_a_pause_stops_in_the_users_code_not_in_the_library_it_calls():
    """A paused rank whose lines call isinstance on an ABC stopped in `<frozen abc>`'s
    __instancecheck__ (no source for the console): it stops on the user's next line."""
    from actors_for_tests import Churner

    procs = this_host().spawn_procs({"gpus": 1})
    try:
        mesh = procs.spawn("churners", Churner)
        mesh.initialized.get()
        fut = mesh.churn.call(8)
        time.sleep(0.5)
        ctrl = _debug.controller()
        assert ctrl.pause("churners", [0]) == {0: "stopped"}
        (s,) = [s for s in ctrl.stopped() if s.actor == "churners"]
        assert (s.function, s.reason) == ("churn", "attached") and s.file.endswith("actors_for_tests.py"), \
            (s.function, s.file)
        ctrl.continue_all()
        assert list(fut.get(timeout=30).values()) == [0]
    finally:
        procs.stop()


def test_pause_three_ranks_of_four_then_continue():
    """`pause` on ranks 0-2 of a 4-rank mesh: those three join the table where they run, rank 3
    is not disturbed and finishes; `continue` lets them finish with their results unchanged."""
    from actors_for_tests import busy_result

    procs = this_host().spawn_procs({"gpus": 4})
    try:
        mesh = procs.spawn("spinners", Stopper)
        mesh.initialized.get()
        ctrl = _debug.controller()
        work = 60_000_000
        fut = mesh.busy.call(work)
        assert wait_until(lambda: all(running_in("spinners", r, "busy_result") for r in range(3)), timeout=20)
        io = ScriptedIO(["pause spinners ranks(0:3)", "cast spinners ranks(0:3) p i > 0 and total < until_total"])
        _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
        assert "[spinners ranks 0-2]\nTrue\n" in io.text, io.text  # cast works on paused ranks
        stopped = [s for s in ctrl.stopped() if s.actor == "spinners"]
        assert sorted(s.rank for s in stopped) == [0, 1, 2], io.text
        assert {s.reason for s in stopped} == {"attached"} and {s.function for s in stopped} == {"busy_result"}
        assert wait_until(lambda: not running_in("spinners", 3, "busy_result"), timeout=60)  # rank 3 finished
        assert len([s for s in ctrl.stopped() if s.actor == "spinners"]) == 3
        ctrl.continue_all()
        assert list(fut.get(timeout=60).values()) == [busy_result(work)] * 4
    finally:
        procs.stop()


def test_attach_names_an_unknown_actor_a_rank_past_the_end_and_a_dead_rank(stoppers):
    from actors_for_tests import Printer

    ctrl = _debug.controller()
    io = ScriptedIO(["attach nosuch 0", "attach stoppers 5", "pause stoppers ranks(7)"])
    _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
    assert "no actor mesh named 'nosuch' lives on this program's procs; live ones: " in io.text, io.text
    assert "stoppers" in io.text.split("live ones: ")[1].splitlines()[0], io.text
    assert "stoppers has 2 ranks (0-1): no rank 5" in io.text, io.text
    assert "rank 7 is out of range" in io.text, io.text  # the selector itself
    procs = this_host().spawn_procs({"gpus": 2})
    try:
        doomed = procs.spawn("doomed", Printer)
        doomed.initialized.get()
        with pytest.raises(Exception):
            doomed.slice(gpus=1).crash.call_one("bye").get(timeout=30)
        io = ScriptedIO(["attach doomed 1"])
        _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
        assert "doomed rank 1 is dead:" in io.text and "exit" in io.text, io.text
    finally:
        procs.stop()


def test_where_never_breaks_a_proc_whose_frames_churn(stoppers):
    """Defect: the stack dump read other threads' frames without the GIL, and a proc whose
    threads pushed and popped frames meanwhile was killed by SIGSEGV (in every run of this test
    before the fix).
    The dump now takes the GIL, and goes without it only when the GIL stays held (a thread in C,
    a deadlock: frames that do not move)."""
    procs, mesh = stoppers
    others = procs.spawn("churners", Stopper)
    others.initialized.get()
    ctrl = _debug.controller()
    futs = [mesh.churn.call(4.0), others.churn.call(4.0)]
    dumps = 0
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        ctrl.stacks()
        dumps += 1
    assert dumps > 100
    for fut in futs:
        assert list(fut.get(timeout=30).values()) == [True, True]
    others.stop()

