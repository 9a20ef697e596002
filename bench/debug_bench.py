#!/usr/bin/python3
"""The debugger, xmesh beside its peers in one run on this machine: how long one pdb command
takes while attached (`p 1` to its answer), one command cast to 16 ranks, the time from
`breakpoint()` on 16 ranks to the complete table of stopped actors, the time from `attach` to
the pdb prompt of a rank spinning in Python (beside a local pdb started by a signal), and a
no-op call to the attached rank before and after (beside a rank never attached). Prints one
table and the ratios.

    /usr/bin/python3 bench/debug_bench.py [--quick]

Uses the installed xmesh (or PYTHONPATH=build/python). The xmesh figures go through the real
prompt (`DebugPrompt`, opened by a waiting get() as for a user; only its input and output are a
script here). Peers:
- plain pdb: a local `pdb.set_trace()` under pexpect on a terminal (the floor: no network);
- one blocking RPC per write: the design Monarch's debugger uses, simulated in the same runtime:
  each rank's pdb writes through a blocking actor call to a session actor in the controller and
  reads through a call that returns the next command.
"""
import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # bench_actors is importable by the procs too
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)

import pexpect  # noqa: E402

import bench_actors  # noqa: E402
from actor_rtt import timed_us  # noqa: E402
from bench_stats import samples_row  # noqa: E402
from xmesh import this_host, this_proc
from xmesh._debug import controller as _debug
from xmesh._debug import io as _debug_io  # noqa: E402

RANKS = 16
PYTHON = "/usr/bin/python3"


class ScriptIO:
    """The prompt's input and output for the benchmark: answers its reads from a list of
    commands, times each command from the read that returned it to the next read, and keeps
    what was written."""

    def __init__(self, commands):
        self.commands = list(commands)
        self.written = []
        self.first_write_at = None
        self.sent_at = None
        self.sent = None
        self.round_trips = []  # (command, seconds, what was written in between)
        self.mark = 0

    def write(self, text):
        if self.first_write_at is None:
            self.first_write_at = time.monotonic()
        self.written.append(text)

    def show_table(self, sessions):
        self.write(_debug_io.format_table(sessions))

    def read(self, prompt):
        now = time.monotonic()
        if self.sent is not None:
            self.round_trips.append((self.sent, now - self.sent_at, "".join(self.written[self.mark:])))
        if not self.commands:
            raise EOFError
        self.sent = self.commands.pop(0)
        self.mark = len(self.written)
        self.sent_at = time.monotonic()
        return self.sent


class scripted_prompt(_debug_io.TerminalFrontend):
    """While active, the prompt a waiting get() opens talks to io instead of a terminal (the
    debugger's front end, as the kernel replaces it)."""

    def __init__(self, io):
        self._io = io

    def io(self):
        return self._io

    def input_possible(self):
        return True

    def __enter__(self):
        self.saved = _debug_io.frontend()
        _debug_io.set_frontend(self)
        return self._io

    def __exit__(self, *exc):
        _debug_io.set_frontend(self.saved)


def answers(io, command, expected):
    times = []
    for cmd, seconds, text in io.round_trips:
        if cmd == command:
            if expected not in text:
                raise AssertionError(f"{command!r} answered {text!r}")
            times.append(seconds * 1000)
    return times


# -- xmesh ------------------------------------------------------------------------------------------
def xmesh_attached(targets, n):
    io = ScriptIO(["attach targets 0"] + ["p 1"] * n + ["detach", "continue"])
    with scripted_prompt(io):
        targets.slice(gpus=0).stop_here.call().get()
    return answers(io, "p 1", "1\n")


def xmesh_cast(targets, n):
    io = ScriptIO([f"cast targets ranks(0:{RANKS}) p 1"] * n + ["continue"])
    with scripted_prompt(io):
        targets.stop_here.call().get()
    return answers(io, f"cast targets ranks(0:{RANKS}) p 1", f"[targets ranks 0-{RANKS - 1}]\n1\n")


def xmesh_table(targets):
    """(seconds from the call to the 16th stop reaching the controller, to the table shown)."""
    io = ScriptIO(["continue"])
    ctrl = _debug.controller()
    t0 = time.monotonic()
    with scripted_prompt(io):
        targets.stop_here.call().get()
    table = io.written[0]
    rows = [line for line in table.splitlines() if line.startswith("| targets")]
    if len(rows) != RANKS:
        raise AssertionError(f"the table has {len(rows)} rows, not {RANKS}:\n{table}")
    return ctrl.last_stop_at - t0, io.first_write_at - t0


def xmesh_attach_running(targets, n, workdir):
    """ms from `attach targets 0` to its pdb prompt, rank 0 spinning in Python (detached, so
    running again, between two)."""
    go = os.path.join(workdir, "go")
    fut = targets.slice(gpus=0).spin_until.call_one(go)
    ctrl = _debug.controller()
    deadline = time.monotonic() + 30
    while not any(r == 0 and state == "running" for r, state, _ in ctrl.stacks()[0].get("targets", [])):
        if time.monotonic() > deadline:
            raise AssertionError("rank 0 never ran spin_until")
        time.sleep(0.05)
    io = ScriptIO(["attach targets 0", "detach"] * n)
    _debug.DebugPrompt(ctrl, io).run(leave_when_resumed=False)
    open(go, "w").close()
    if fut.get(timeout=60) <= 0:
        raise AssertionError("spin_until never looked")
    if answers(io, "detach", "it runs on") == []:
        raise AssertionError("no detach answered")
    return answers(io, "attach targets 0", "attached to targets rank 0")


def noop_rounds(targets, rounds, n):
    """Median µs of a no-op call_one to rank 0 and to rank 1, in alternating rounds."""
    r0, r1 = targets.slice(gpus=0), targets.slice(gpus=1)
    a, b = [], []
    for _ in range(rounds):
        a += timed_us(lambda: r0.noop.call_one().get(), n, 20)
        b += timed_us(lambda: r1.noop.call_one().get(), n, 20)
    return statistics.median(a), statistics.median(b)


# -- one blocking RPC per write ----------------------------------------------------------------------
def sim_sessions():
    here = this_proc()
    return [here.spawn(f"sim{r}", bench_actors.SimDebugSession, r) for r in range(RANKS)]


def sim_attached(targets, sessions, n):
    fut = targets.slice(gpus=0).stop_with_rpc_per_write.call(sessions)
    s = bench_actors.SIM_SESSIONS[0]
    s.wait_reading()
    times = []
    for _ in range(n):
        t = time.monotonic()
        s.send("p 1")
        text = s.wait_reading()
        times.append((time.monotonic() - t) * 1000)
        if text != "1\n(Pdb) ":
            raise AssertionError(f"p 1 answered {text!r}")
    s.send("c")
    fut.get()
    return times


def sim_stop_all(targets, sessions):
    t0 = time.monotonic()
    fut = targets.stop_with_rpc_per_write.call(sessions)
    for r in range(RANKS):
        bench_actors.SIM_SESSIONS[r].wait_reading()
    return time.monotonic() - t0, fut


def sim_cast(targets, sessions, n):
    _, fut = sim_stop_all(targets, sessions)
    times = []
    for _ in range(n):
        t = time.monotonic()
        for r in range(RANKS):
            bench_actors.SIM_SESSIONS[r].send("p 1")
        for r in range(RANKS):
            if bench_actors.SIM_SESSIONS[r].wait_reading() != "1\n(Pdb) ":
                raise AssertionError("a rank answered p 1 wrongly")
        times.append((time.monotonic() - t) * 1000)
    for r in range(RANKS):
        bench_actors.SIM_SESSIONS[r].send("c")
    fut.get()
    return times


def sim_table(targets, sessions):
    seconds, fut = sim_stop_all(targets, sessions)
    for r in range(RANKS):
        bench_actors.SIM_SESSIONS[r].send("c")
    fut.get()
    return seconds


# -- plain pdb ----------------------------------------------------------------------------------------
def local_pdb(n):
    code = "import pdb\ndef f():\n    x = 1\n    pdb.set_trace()\n    return x\nf()\n"
    child = pexpect.spawn(PYTHON, ["-c", code], encoding="utf-8", timeout=30, env=dict(os.environ, PYTHONSTARTUP=""))
    child.delaybeforesend = None  # pexpect sleeps 50 ms before each send by default
    try:
        child.expect_exact("(Pdb) ")
        times = []
        for _ in range(n):
            t = time.monotonic()
            child.sendline("p 1")
            child.expect_exact("\r\n1\r\n(Pdb) ")
            times.append((time.monotonic() - t) * 1000)
        child.sendline("c")
        child.expect(pexpect.EOF)
        return times
    finally:
        child.close(force=True)


def local_signal_pdb(n):
    """ms from SIGUSR1 to the pdb prompt of a local process spinning in Python whose handler
    starts pdb in the interrupted frame (how a running local program is usually broken into)."""
    code = ("import pdb, signal\n"
            "signal.signal(signal.SIGUSR1, lambda s, f: pdb.Pdb().set_trace(f))\n"
            "print('ready', flush=True)\n"
            "looks = 0\n"
            "while True:\n"
            "    looks += 1\n")
    child = pexpect.spawn(PYTHON, ["-c", code], encoding="utf-8", timeout=30, env=dict(os.environ, PYTHONSTARTUP=""))
    child.delaybeforesend = None
    try:
        child.expect_exact("ready")
        times = []
        for _ in range(n):
            t = time.monotonic()
            child.kill(signal.SIGUSR1)
            child.expect_exact("(Pdb) ")
            times.append((time.monotonic() - t) * 1000)
            child.sendline("c")
            child.expect_exact("c\r\n")
        return times
    finally:
        child.close(force=True)


# -- report -------------------------------------------------------------------------------------------
def row(name, ms):
    return samples_row(name, ms, 90, name_width=26, count_width=6)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    args = ap.parse_args()
    n, casts, stops = (50, 10, 2) if args.quick else (300, 40, 5)
    attaches, noop_n = (10, 300) if args.quick else (40, 2000)
    os.environ.setdefault("XMESH_DEBUG", "")  # the prompt, never the error mode

    procs = this_host().spawn_procs({"gpus": RANKS})
    try:
        targets = procs.spawn("targets", bench_actors.DebugTarget)
        targets.initialized.get()
        sessions = sim_sessions()
        for s in sessions:
            s.initialized.get()

        noop_before = noop_rounds(targets, 4, noop_n // 4)
        with tempfile.TemporaryDirectory() as workdir:
            xm_attach = xmesh_attach_running(targets, attaches, workdir)
        noop_after = noop_rounds(targets, 4, noop_n // 4)
        plain_attach = local_signal_pdb(attaches)
        plain = local_pdb(n)
        xm_attached = xmesh_attached(targets, n)
        sim_att = sim_attached(targets, sessions, n)
        xm_cast = xmesh_cast(targets, casts)
        sim_c = sim_cast(targets, sessions, casts)
        xm_tables, sim_tables = [], []
        for _ in range(stops):
            xm_tables.append(xmesh_table(targets))
            sim_tables.append(sim_table(targets, sessions))
    finally:
        procs.stop()

    print(f"xmesh debugger benchmark on {os.uname().nodename}, {os.cpu_count()} cores, "
          f"{'quick' if args.quick else 'full'} run")
    print("one pdb command while attached (`p 1` to its answer and the next prompt), ms")
    print(f"  {'':<26}{'runs':>6}{'median':>10}{'p90':>10}{'max':>10}")
    print(row("plain local pdb (pexpect)", plain))
    print(row("xmesh", xm_attached))
    print(row("blocking RPC per write", sim_att))
    print(f"`p 1` cast to {RANKS} ranks, answers grouped, ms")
    print(row("xmesh", xm_cast))
    print(row("blocking RPC per write", sim_c))
    stopped = [a * 1000 for a, _ in xm_tables]
    shown = [b * 1000 for _, b in xm_tables]
    sim_ms = [s * 1000 for s in sim_tables]
    print(f"breakpoint() on {RANKS} ranks: from the call to every stop known / to the table shown, ms")
    print(row("xmesh, all stops known", stopped))
    print(row("xmesh, table shown", shown))
    print(row("blocking RPC per write", sim_ms))
    print("attach to a rank spinning in Python, to its pdb prompt, ms")
    print(row("local pdb on SIGUSR1", plain_attach))
    print(row("xmesh attach", xm_attach))
    print(f"a no-op call_one, median µs: rank 0 / rank 1 (never attached), before any attach "
          f"{noop_before[0]:.1f} / {noop_before[1]:.1f}, after {attaches} attaches to rank 0 "
          f"{noop_after[0]:.1f} / {noop_after[1]:.1f}")
    print()
    print(f"attach to a running rank: xmesh median {statistics.median(xm_attach):.1f} ms (target < 50 ms), "
          f"a local pdb on SIGUSR1: {statistics.median(plain_attach):.1f} ms")
    before, after = noop_before[0] / noop_before[1], noop_after[0] / noop_after[1]
    print(f"no-op call on the attached rank relative to the untouched one: {before:.2f} before, {after:.2f} "
          f"after (no trace stays behind: the ratio stays near 1)")
    print(f"attached command: xmesh median {statistics.median(xm_attached):.2f} ms (target < 5 ms), "
          f"{statistics.median(sim_att) / statistics.median(xm_attached):.1f}x faster than a blocking RPC per write, "
          f"plain local pdb on a terminal: {statistics.median(plain):.2f} ms")
    print(f"cast to {RANKS}: xmesh {statistics.median(xm_cast):.1f} ms, "
          f"{statistics.median(sim_c) / statistics.median(xm_cast):.1f}x faster than a blocking RPC per write")
    print(f"table of {RANKS} ranks: xmesh {statistics.median(shown):.0f} ms to the table (target < 300 ms; "
          f"{_debug.SETTLE_QUIET_S * 1000:.0f} ms of it waits for stops to pause), every stop known after "
          f"{statistics.median(stopped):.0f} ms; a blocking RPC per write: {statistics.median(sim_ms):.0f} ms")


if __name__ == "__main__":
    main()
