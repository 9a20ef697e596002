"""The mesh panel's view of a controller (issue 22, xmesh/_panel/view.py): a program blocked in a call
answers snapshots on its `.panel` socket: the ranks still in the call (and which endpoint), the
idle ones, a killed one dead with why; bad requests are answered with an error, never a hang."""
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from xmesh_testing import PYTHON, terminal_stdin, wait_until

import xmesh
from xmesh._panel import view as _panel

PROGRAM = """
import os, time, xmesh

class Worker(xmesh.Actor):
    @xmesh.endpoint
    def work(self, seconds: float) -> int:
        if xmesh.current_rank().rank in (1, 2):
            time.sleep(seconds)
        return xmesh.current_rank().rank

    @xmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

procs = xmesh.this_host().spawn_procs({"hosts": 2, "gpus": 4}, name="panel-mesh")
w = procs.spawn("w", Worker)
print("PIDS", list(w.pid.call().get().values()), flush=True)
w.work.call(120).get()  # blocks here, as a notebook cell waiting on a call
"""


def _state_of(snap: dict, name: str) -> dict:
    (alloc,) = [a for a in snap.get("allocations", []) if a["name"] == name]
    return {r["rank"]: r for r in alloc["ranks"]}


def _wait_for(rundir: str, pid: int, pred, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    snap: dict = {}
    while time.monotonic() < deadline:
        snap = next((s for s in _panel.snapshots(rundir) if s.get("pid") == pid), {})
        if snap.get("allocations") and pred(_state_of(snap, "panel-mesh")):
            return snap
        time.sleep(0.1)
    raise AssertionError(f"the panel never showed it: {snap}")


def test_a_blocked_program_shows_its_ranks_in_the_call_idle_and_dead(fresh_rundir):
    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir)
    prog = subprocess.Popen([PYTHON, "-c", PROGRAM], env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = prog.stdout.readline()
        assert line.startswith("PIDS"), line
        pids = json.loads(line.split(" ", 1)[1])
        # The other ranks answer at once (a moment later under load): then only 1 and 2 are in it.
        snap = _wait_for(fresh_rundir, prog.pid,
                         lambda r: sorted(k for k, v in r.items() if v["state"] != "idle") == [1, 2])
        ranks = _state_of(snap, "panel-mesh")
        alloc = snap["allocations"][0]
        assert alloc["labels"] == ["hosts", "gpus"] and alloc["sizes"] == [2, 4]
        assert sorted(r for r, v in ranks.items() if v["state"] == "call") == [1, 2]
        assert ranks[1]["endpoints"] == ["work"] and 0 < ranks[1]["since"] <= time.time()
        assert [ranks[r]["state"] for r in (0, 3, 4, 5, 6, 7)] == ["idle"] * 6
        assert [ranks[r]["pid"] for r in range(8)] == pids
        # The sidecar's list: the agent's allocation, owned by the program, with the same states.
        listed = _panel.meshes(fresh_rundir)
        (mesh,) = [m for m in listed["meshes"] if m["name"] == "panel-mesh"]
        assert mesh["controller_pid"] == prog.pid and mesh["attached"] and mesh["procs_alive"] == 8
        assert [r["state"] for r in mesh["ranks"]].count("call") == 2
        assert mesh["ranks"][6]["coords"] == {"hosts": 1, "gpus": 2}
        os.kill(pids[5], signal.SIGKILL)
        snap = _wait_for(fresh_rundir, prog.pid, lambda r: r[5]["state"] == "dead")
        ranks = _state_of(snap, "panel-mesh")
        assert "signal 9" in ranks[5]["why"] or "SIGKILL" in ranks[5]["why"], ranks[5]
        assert ranks[1]["state"] == "call"  # the others go on
    finally:
        prog.kill()
        prog.wait()


def test_bad_requests_get_an_error_and_the_connection_goes_on(fresh_rundir):
    from xmesh import _core
    from xmesh._runtime.process import get_runtime

    get_runtime()  # this process is a controller: it serves its own panel socket
    path = _panel.socket_path(_core.runtime_dir(), os.getpid())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        f = s.makefile("rb")
        for request, error in ((b"not json\n", "one JSON object per line"), (b'{"op": "rm -rf"}\n', "unknown request"),
                               (b"x" * 10000 + b"\n", "at most 4096 bytes")):
            s.sendall(request)
            assert error in json.loads(f.readline())["error"]
        s.sendall(b'{"op": "snapshot"}\n')
        assert json.loads(f.readline())["pid"] == os.getpid()
    assert os.stat(path).st_mode & 0o077 == 0


def test_a_reader_that_polls_gets_unchanged_snapshots_in_a_few_bytes(fresh_rundir, monkeypatch):
    """The panel's sidecar asks each controller `since` the digest it read last: an idle one
    answers {"unchanged": digest}; a change is answered whole, with its new digest."""
    from xmesh import _core
    from xmesh._runtime.process import get_runtime

    get_runtime()
    path = _panel.socket_path(_core.runtime_dir(), os.getpid())
    first = _panel.query_raw(path)
    digest = json.loads(first)["digest"]
    assert json.loads(_panel.query_raw(path, since=digest)) == {"unchanged": digest}
    assert json.loads(_panel.query_raw(path, since="0" * 16))["digest"] == digest  # a stale one: whole
    reader = _panel.SnapshotReader()
    came = []
    query = _panel.query_raw
    monkeypatch.setattr(_panel, "query_raw", lambda *a, **k: came.append(query(*a, **k)) or came[-1])
    assert reader.read(path) == first and reader.read(path) == first
    assert came[0] == first and json.loads(came[1]) == {"unchanged": digest}  # the second: a few bytes
    procs = xmesh.this_host().spawn_procs({"gpus": 1})
    try:
        procs.initialized.get()
        changed = reader.read(path)
        assert changed != first and len(json.loads(changed)["allocations"]) == 1
        assert json.loads(_panel.query_raw(path, since=json.loads(changed)["digest"])) == \
            {"unchanged": json.loads(changed)["digest"]}
    finally:
        procs.stop()


def test_the_sidecar_answers_json_lines_and_errors_without_dying(fresh_rundir):
    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir)
    requests = "\n".join(['{"op": "meshes"}', "[1, 2]", '{"op": "meshes", "runtime_dir": 7}', '{"op": "meshes"}'])
    r = subprocess.run([PYTHON, "-m", "xmesh._panel.sidecar"], input=requests + "\n", env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    answers = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(answers) == 4
    assert answers[0]["meshes"] == [] and answers[0]["runtime_dir"] == fresh_rundir
    assert "unknown request" in answers[1]["error"] and "debug" in answers[1]["error"] and "runtime_dir is a path" in answers[2]["error"]
    assert answers[3]["runtime_dir"] == fresh_rundir


class Napper(xmesh.Actor):
    @xmesh.endpoint
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)

    @xmesh.endpoint
    def noop(self) -> None:
        return None

    @xmesh.endpoint
    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # Python code: a cancel stops it at its next line
            pass


def test_the_call_tracker_forgets_finished_calls_and_keeps_running_ones():
    procs = xmesh.this_host().spawn_procs({"gpus": 2})
    try:
        nappers = procs.spawn("nappers", Napper)
        # The spawn is a tracked call too: until both __init__ answers came back (their output
        # drained first) it is rightly listed as running, so wait for it before looking.
        nappers.initialized.get()
        sleeper, busy_one = nappers.slice(gpus=0), nappers.slice(gpus=1)
        long = sleeper.nap.call_one(30)
        for _ in range(1000):
            busy_one.noop.call_one().get()
        assert len(_panel._tracker._calls) < 2 * _panel.CallTracker.PRUNE_AT  # finished calls do not pile up
        busy = _panel._tracker.busy_addrs()
        (addr,) = busy
        assert [(what, actor) for what, _, actor in busy[addr]] == [("nap", "nappers")]  # the mesh, as `pause` names it
        long.cancel()
    finally:
        procs.stop()


def _states(snap: dict) -> list:
    """[(state, endpoints)] of each rank of the one allocation of a snapshot."""
    (alloc,) = snap["allocations"]
    return [(r["state"], r.get("endpoints", [])) for r in alloc["ranks"]]


def test_a_broadcast_shows_its_ranks_busy_until_it_ended_and_a_call_queues_behind_it():
    """Issue 46, point 3: ranks inside a broadcast were shown idle (only .call() was tracked)."""
    procs = xmesh.this_host().spawn_procs({"gpus": 2})
    try:
        nappers = procs.spawn("nappers", Napper)
        nappers.initialized.get()
        nappers.nap.broadcast(3)
        assert _states(_panel.snapshot()) == [("call", ["nap (broadcast)"])] * 2
        assert {r["actor"] for r in _panel.snapshot()["allocations"][0]["ranks"]} == {"nappers"}  # what `pause` names
        status = _panel.status()
        assert status.rows[0][4] == 2 and status.rows[0][7] == "nap (broadcast)"  # "In a call", "Busy in"
        after = nappers.noop.call()
        (earlier, ranks), = after.queued_behind()
        assert earlier.description == "nap.broadcast()" and ranks == [0, 1]
        after.get(timeout=30)
        assert wait_until(lambda: _states(_panel.snapshot()) == [("idle", [])] * 2, timeout=10)
    finally:
        procs.stop()


def test_a_cancelled_call_inside_a_c_call_counts_as_running_until_it_returns():
    """Issue 46, point 4: a call cancelled while its endpoint sleeps in C was dropped from what
    the runtime tracked: the panel showed its ranks idle and the next call waited unexplained."""
    procs = xmesh.this_host().spawn_procs({"gpus": 2})
    try:
        nappers = procs.spawn("nappers", Napper)
        nappers.initialized.get()
        long = nappers.nap.call(4)
        assert wait_until(lambda: _states(_panel.snapshot())[0][0] == "call")
        time.sleep(0.3)  # inside time.sleep on both ranks
        assert long.cancel()
        with pytest.raises(asyncio.CancelledError, match="cancelled"):
            long.get(timeout=1)
        assert long.lingering_ranks() == [0, 1]
        assert _states(_panel.snapshot()) == [("call", ["nap (cancelled, still running)"])] * 2
        after = nappers.noop.call()
        (earlier, ranks), = after.queued_behind()
        assert earlier is long._sent and ranks == [0, 1]
        after.get(timeout=30)
        assert long.lingering_ranks() == []  # their own answers came: they ended
        assert wait_until(lambda: _states(_panel.snapshot()) == [("idle", [])] * 2, timeout=10)
        # Python code stops at its next line: the cancel's answer ends it at once.
        spinning = nappers.spin.call(30)
        time.sleep(0.3)
        assert spinning.cancel()
        assert wait_until(lambda: spinning.lingering_ranks() == [], timeout=10)
    finally:
        procs.stop()


FLOOD = """
import sys, time, xmesh

class Talker(xmesh.Actor):
    @xmesh.endpoint
    def talk(self) -> None:
        for i in range(50 if xmesh.current_rank().rank == 0 else 500):
            print(f"line {i}", flush=True)

procs = xmesh.this_host().spawn_procs({"gpus": 2}, name="flood")
procs.spawn("t", Talker).talk.call().get()
print("TALKED", flush=True)
time.sleep(120)
"""


def _program(rundir: str, code: str, out_path: str, **env: str) -> subprocess.Popen:
    """A controller program of this runtime directory (a file, so that pdb shows its source), its
    stdin a terminal (its own debugger prompt opens there, as for a user), its output to a file."""
    path = out_path + ".py"
    with open(path, "w") as f:
        f.write(code)
    master, slave = terminal_stdin()
    prog = subprocess.Popen([PYTHON, path], env=dict(os.environ, XMESH_RUNTIME_DIR=rundir, **env),
                            stdin=slave, stdout=open(out_path, "w"), stderr=subprocess.STDOUT, text=True)
    os.close(slave)
    prog.terminal = master  # type: ignore[attr-defined]  # closed when the test ends (see _end)
    return prog


def _end(prog: subprocess.Popen) -> None:
    prog.kill()
    prog.wait()
    os.close(prog.terminal)  # type: ignore[attr-defined]


def _wait_output(path: str, marker: str, prog: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = open(path).read()
        if marker in text or prog.poll() is not None:
            assert marker in text, text
            return text
        time.sleep(0.1)
    raise AssertionError(f"{marker!r} never came: {open(path).read()}")


def test_a_flood_held_back_from_the_display_is_counted_per_rank(fresh_rundir, tmp_path):
    from xmesh._panel import sidecar as _panel_sidecar

    out = str(tmp_path / "out")
    prog = _program(fresh_rundir, FLOOD, out, XMESH_LOG_DISPLAY_RATE="10", XMESH_LOG_DISPLAY_BURST="20")
    try:
        _wait_output(out, "TALKED", prog)
        (snap,) = [s for s in _panel.snapshots(fresh_rundir) if s["pid"] == prog.pid]
        (alloc,) = snap["allocations"]
        held = alloc["held_back"]
        shown = sum(1 for line in open(out) if re.search(r"\] line \d+$", line))
        assert held["total"] == 550 - shown and held["total"] > 400, (held, shown)
        assert sum(held["ranks"].values()) == held["total"] and held["ranks"]["1"] > held["ranks"]["0"]
        # The panel's list carries the counts, and the log files every line the display held back.
        (mesh,) = _panel.meshes(fresh_rundir)["meshes"]
        assert mesh["held_back"] == held
        logs = _panel_sidecar.OPS["logs"]({"id": alloc["id"], "name": "flood", "tail": 0}, fresh_rundir)
        assert logs["total"] == 550
    finally:
        _end(prog)


HALT = """
import xmesh

class Halter(xmesh.Actor):
    @xmesh.endpoint
    def halt(self) -> int:
        y = 41
        if xmesh.current_rank().rank == 1:
            breakpoint()
            y += 1
        return y

procs = xmesh.this_host().spawn_procs({"gpus": 2}, name="halt")
print("RESULT", sorted(procs.spawn("h", Halter).halt.call().get().values()), flush=True)
"""


def test_the_console_types_pdb_commands_at_one_stopped_rank(fresh_rundir, tmp_path):
    """The sidecar's `pdb` op (the panel's console): one command's answer and the source where the
    rank is now, while the program's own prompt waits on its stdin (taken over, handed back)."""
    from xmesh._panel import sidecar as _panel_sidecar

    pdb = _panel_sidecar.OPS["pdb"]
    out = str(tmp_path / "out")
    prog = _program(fresh_rundir, HALT, out)
    try:
        deadline = time.monotonic() + 60
        while not any(r["state"] == "stopped" for s in _panel.snapshots(fresh_rundir)
                      for a in s.get("allocations", []) for r in a["ranks"]):
            assert time.monotonic() < deadline and prog.poll() is None, open(out).read()
            time.sleep(0.1)
        first = pdb({"pid": prog.pid, "actor": "h", "rank": 1, "command": ""}, fresh_rundir)
        assert first["stopped"] and first["output"] == "", first
        (current,) = [line for line in first["source"].splitlines() if re.match(r"\s*\d+\s+->", line)]
        assert "y += 1" in current, first["source"]  # pdb stops after breakpoint(), at the next line
        assert "def halt(self)" in first["source"]
        assert pdb({"pid": prog.pid, "actor": "h", "rank": 1, "command": "p y"}, fresh_rundir)["output"] == "41\n"
        stepped = pdb({"pid": prog.pid, "actor": "h", "rank": 1, "command": "n"}, fresh_rundir)
        assert "-> return y" in stepped["output"] and "-> " in stepped["source"]
        (current,) = [line for line in stepped["source"].splitlines() if re.match(r"\s*\d+\s+->", line)]
        assert "return y" in current
        assert pdb({"pid": prog.pid, "actor": "h", "rank": 1, "command": "p y"}, fresh_rundir)["output"] == "42\n"
        # Bad requests name what is wrong; a rank that is not stopped says so.
        for bad, why in (({"actor": "h; rm", "rank": 1}, "actor is the name"), ({"actor": "h", "rank": "1"}, "rank is a whole"),
                         ({"actor": "h", "rank": 1, "command": "p 1\nc"}, "one pdb command line"),
                         ({"pid": 1, "actor": "h", "rank": 1}, "no xmesh kernel or program")):
            try:
                pdb({"pid": prog.pid, **bad}, fresh_rundir)
                raise AssertionError(f"accepted {bad}")
            except ValueError as e:
                assert why in str(e), e
        other = pdb({"pid": prog.pid, "actor": "h", "rank": 0, "command": "p y"}, fresh_rundir)
        assert not other["stopped"] and other["note"] == "[xmesh] none of h rank 0 is stopped in pdb", other
        assert other["output"] == ""  # said once, in the note
        done = pdb({"pid": prog.pid, "actor": "h", "rank": 1, "command": "c"}, fresh_rundir)
        assert not done["stopped"] and done["source"] == ""
        assert prog.wait(timeout=60) == 0
        assert "RESULT [41, 42]" in open(out).read()
    finally:
        _end(prog)


SYNC = """
import sys, time, xmesh

procs = xmesh.this_host().spawn_procs({"gpus": 2}, name="synced")
watcher = procs.sync_workspace(sys.argv[1], watch=True)
print("SYNCED", flush=True)
time.sleep(120)
"""


def test_the_panel_reports_the_last_sync_per_host_and_the_watcher(fresh_rundir, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("A = 1\n")
    out = str(tmp_path / "out")
    prog = subprocess.Popen([PYTHON, "-c", SYNC, str(ws)], env=dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir),
                            stdout=open(out, "w"), stderr=subprocess.STDOUT)
    try:
        _wait_output(out, "SYNCED", prog)

        def sync_view() -> dict:
            (snap,) = [s for s in _panel.snapshots(fresh_rundir) if s["pid"] == prog.pid]
            return snap["sync"]

        view = sync_view()
        (host,) = view["hosts"]
        assert host["added"] == 1 and not host["same"] and host["files"] == ["a.py"], host
        (w,) = view["watchers"]
        # (a first look at the files may touch their access times: the watcher may sync once
        # more, finding the host up to date, which the host's row only notes as `checked`)
        assert w["running"] and w["syncs"] >= 1 and w["errors"] == 0 and w["dirs"] == [str(ws)], w
        (ws / "b.py").write_text("B = 2\n")  # the watcher syncs it: the view follows
        deadline = time.monotonic() + 30
        while sync_view()["hosts"][0]["files"] != ["b.py"]:
            assert time.monotonic() < deadline, sync_view()
            time.sleep(0.1)
        (host,) = sync_view()["hosts"]
        assert host["added"] == 1 and host["checked"] >= host["time"] > 0, host
        assert sync_view()["watchers"][0]["syncs"] >= 2
    finally:
        prog.kill()
        prog.wait()


def test_a_host_agent_that_did_not_answer_its_controller_is_named_in_the_list(fresh_rundir):
    """A controller's look at its agents on other hosts can fail (a host down, a link cut): the
    list names that agent and why, beside the meshes it could read."""
    snap = {"pid": 4242, "kind": "program", "argv": "", "allocations": [], "sync": {"hosts": [], "watchers": []},
            "remote": [{"locator": "tcp://10.0.9.9:7000",
                        "error": "RuntimeError: the host agent did not answer a Status request within 1 s"}]}
    listed = _panel.meshes(fresh_rundir, raws=[(4242, json.dumps(snap).encode())])
    assert listed["unreachable"] == [{"locator": "tcp://10.0.9.9:7000",
                                      "error": "RuntimeError: the host agent did not answer a Status request within 1 s"}]
    assert listed["meshes"] == [] and listed["controllers"][0] == {k: v for k, v in snap.items()
                                                                    if k not in ("allocations", "remote")}


class Shouter(xmesh.Actor):
    @xmesh.endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)


def test_the_logs_search_is_bounded_in_time_and_names_a_bad_stream(monkeypatch):
    """Issue 41, finding 8: a catastrophic regular expression stalled the sidecar for 15 s (and the
    server restarted it); a bad stream was answered as "no logs". The search runs in a child of its
    own with SEARCH_LIMIT_S; what is too slow is said so, and the sidecar answers on at once."""
    from xmesh import _core
    from xmesh._panel import sidecar as _panel_sidecar

    monkeypatch.setattr(_panel_sidecar, "SEARCH_LIMIT_S", 1.0)
    rundir = _core.runtime_dir()
    procs = xmesh.this_host().spawn_procs({"gpus": 1}, name="shouts")
    procs.spawn("s", Shouter).say.call("a" * 40 + "!").get(timeout=30)
    alloc = procs._alloc.id  # the allocation's id, as the panel's list carries it
    logs = _panel_sidecar.OPS["logs"]
    deadline = time.monotonic() + 10
    while logs({"id": alloc, "name": "shouts"}, rundir)["total"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert logs({"id": alloc, "name": "shouts", "grep": "a{40}!"}, rundir)["total"] == 1  # through the child
    with pytest.raises(ValueError, match="search too slow: the regular expression"):
        logs({"id": alloc, "name": "shouts", "grep": "^(a+)+$"}, rundir)  # 2^40 ways to fail
    assert logs({"id": alloc, "name": "shouts", "grep": "a!"}, rundir)["total"] == 1  # answers on
    with pytest.raises(ValueError, match="stream must be 'stdout', 'stderr' or None, got 'stdrr'"):
        logs({"id": alloc, "name": "shouts", "stream": "stdrr"}, rundir)
    with pytest.raises(ValueError, match="stream must be"):
        logs({"id": "no-such-allocation", "stream": "stdrr"}, rundir)  # named before anything is looked up
    with pytest.raises(ValueError, match="stream must be"):
        procs.logs(stream="stdrr")
    # The rank filter (issue 46): a list or a range, a rank past the end named, bad text named.
    assert logs({"id": alloc, "name": "shouts", "rank": "0-0"}, rundir)["total"] == 1
    with pytest.raises(ValueError, match="shouts has no rank 3: it has rank 0"):
        logs({"id": alloc, "name": "shouts", "rank": "0,3"}, rundir)
    for bad in ("x", "2-1", "1-"):
        with pytest.raises(ValueError, match="not a rank list|ends before it starts"):
            logs({"id": alloc, "name": "shouts", "rank": bad}, rundir)
    procs.stop()


def test_the_panel_recognises_the_kernels_note_about_a_leftover_input_box():
    """jupyter_ext/src/prompts.ts closes a cell's debugger input box when the kernel's note says
    it is no longer read: the mark it looks for must be in the note the kernel writes."""
    from xmesh_testing import SOURCE_DIR
    from xmesh._kernel.interpreter import _KernelFrontend

    with open(os.path.join(SOURCE_DIR, "jupyter_ext", "src", "prompts.ts")) as f:
        mark = re.search(r"export const LEFTOVER_MARK = '([^']+)'", f.read()).group(1)
    assert mark in _KernelFrontend.leftover_input_note
