"""The mesh panel's view of a controller (issue 22, xmesh/_panel.py): a program blocked in a call
answers snapshots on its `.panel` socket: the ranks still in the call (and which endpoint), the
idle ones, a killed one dead with why; bad requests are answered with an error, never a hang."""
import json
import os
import signal
import socket
import subprocess
import time

from xmesh_testing import PYTHON

import xmesh
from xmesh import _panel

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
        assert ranks[1]["endpoints"] == ["work"] and ranks[1]["since_s"] >= 0
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
    from xmesh._runtime import get_runtime

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


def test_the_sidecar_answers_json_lines_and_errors_without_dying(fresh_rundir):
    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir)
    requests = "\n".join(['{"op": "meshes"}', "[1, 2]", '{"op": "meshes", "runtime_dir": 7}', '{"op": "meshes"}'])
    r = subprocess.run([PYTHON, "-m", "xmesh._panel_sidecar"], input=requests + "\n", env=env, capture_output=True,
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


def test_the_call_tracker_forgets_finished_calls_and_keeps_running_ones():
    procs = xmesh.this_host().spawn_procs({"gpus": 2})
    try:
        nappers = procs.spawn("nappers", Napper)
        sleeper, busy_one = nappers.slice(gpus=0), nappers.slice(gpus=1)
        long = sleeper.nap.call_one(30)
        for _ in range(1000):
            busy_one.noop.call_one().get()
        assert len(_panel._tracker._calls) < 2 * _panel.CallTracker.PRUNE_AT  # finished calls do not pile up
        busy = _panel._tracker.busy_addrs()
        (addr,) = busy
        assert [what for what, _ in busy[addr]] == ["nap"]
        long.cancel()
    finally:
        procs.stop()
