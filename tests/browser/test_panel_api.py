"""The panel's server extension (jupyter_ext/, issue 22) without a browser: GET /xmesh/api/meshes
through a real Jupyter server of build/frontend answers this user's meshes, with the ranks of a
program blocked in a call shown in the call, and only with the server's token."""
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

PROGRAM = """
import time, xmesh

class Worker(xmesh.Actor):
    @xmesh.endpoint
    def work(self, seconds: float) -> int:
        print(f"line from rank {xmesh.current_rank().rank}", flush=True)
        if xmesh.current_rank().rank == 3:
            time.sleep(seconds)
        return xmesh.current_rank().rank

procs = xmesh.this_host().spawn_procs({"hosts": 2, "gpus": 4}, name="api-mesh")
w = procs.spawn("w", Worker)
w.initialized.get(timeout=60)  # every __init__ answered: only work() is left in the ranks' calls
print("READY", flush=True)
w.work.call(120).get()
"""


def _logs(server, query):
    try:
        with urllib.request.urlopen(server.url("xmesh/api/logs", query), timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        e.reply = json.loads(e.read() or b"{}")  # what the server said, for the assertion
        raise


def _meshes(server):
    return json.loads(server.get("xmesh/api/meshes"))


def _wait(server, pred, timeout=30):
    deadline = time.monotonic() + timeout
    reply = {}
    while time.monotonic() < deadline:
        reply = _meshes(server)
        if pred(reply):
            return reply
        time.sleep(0.2)
    raise AssertionError(f"never: {reply}")


def test_the_api_lists_the_meshes_and_the_ranks_in_a_call(server, workdir):
    env = dict(os.environ, XMESH_RUNTIME_DIR=os.path.join(workdir, "run"))
    prog = subprocess.Popen(["/usr/bin/python3", "-c", PROGRAM], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert prog.stdout.readline().startswith("READY")

        def in_call(reply):
            ms = [m for m in reply.get("meshes", []) if m["name"] == "api-mesh"]
            return ms and [r["state"] for r in ms[0]["ranks"]].count("call") == 1

        reply = _wait(server, in_call)
        (mesh,) = [m for m in reply["meshes"] if m["name"] == "api-mesh"]
        assert mesh["labels"] == ["hosts", "gpus"] and mesh["sizes"] == [2, 4] and mesh["procs_alive"] == 8
        assert mesh["controller_pid"] == prog.pid and mesh["attached"]
        assert mesh["owner"] == {"pid": prog.pid, "kind": "program", "argv": "-c"}
        states = {r["rank"]: r["state"] for r in mesh["ranks"]}
        assert states[3] == "call" and [states[r] for r in (0, 1, 2, 4, 5, 6, 7)] == ["idle"] * 7
        assert mesh["ranks"][3]["endpoints"] == ["work"] and mesh["ranks"][3]["coords"] == {"hosts": 0, "gpus": 3}
        # Asked since the revision it has, an unchanged list is a few bytes; a change is the list.
        again = json.loads(server.get_query("xmesh/api/meshes", f"since={reply['revision']}"))
        assert again["unchanged"] and again["revision"] == reply["revision"] and "meshes" not in again, again
        stale = json.loads(server.get_query("xmesh/api/meshes", "since=not-a-revision"))
        assert [m["name"] for m in stale["meshes"]] == ["api-mesh"] and stale["revision"] == reply["revision"]
        # Its logs, filtered to one rank, then by a pattern; a bad pattern is named.
        logs = _logs(server, f"id={mesh['id']}&name=api-mesh&rank=2")
        assert [(r["rank"], r["text"]) for r in logs["records"]] == [(2, "line from rank 2")], logs
        logs = _logs(server, f"id={mesh['id']}&name=api-mesh&grep=rank%20[57]$&stream=stdout")
        assert sorted(r["text"] for r in logs["records"]) == ["line from rank 5", "line from rank 7"], logs
        with pytest.raises(urllib.error.HTTPError) as e:
            _logs(server, f"id={mesh['id']}&name=api-mesh&grep=(")
        assert e.value.code == 400 and "not a valid regular expression" in e.value.reply["error"]
        # Stopped from the panel (the program owns it): its procs end, its call fails naming why.
        status, reply = _post(server, "xmesh/api/stop", json.dumps({"id": mesh["id"]}).encode())
        assert status == 200 and reply == {"stopping": mesh["id"]}, reply
        pids = [r["pid"] for r in mesh["ranks"]]
        deadline = time.monotonic() + 20
        while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(os.path.exists(f"/proc/{p}") for p in pids)
        _wait(server, lambda reply: not [m for m in reply.get("meshes", []) if m["name"] == "api-mesh"])
        status, reply = _post(server, "xmesh/api/stop", json.dumps({"id": "no-such-allocation"}).encode())
        assert status == 400 and "no-such-allocation" in reply["error"], reply
    finally:
        prog.kill()
        prog.wait()


def test_the_api_needs_the_token(server):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{server.base}/xmesh/api/meshes", timeout=10)
    assert e.value.code == 403
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{server.base}/xmesh/api/meshes?token=not-the-token", timeout=10)
    assert e.value.code == 403


def _post(server, path, body, token=True):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {server.token}"
    req = urllib.request.Request(f"{server.base}/{path}", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_debug_requests_are_checked_before_anything_is_typed(server):
    status, reply = _post(server, "xmesh/api/debug", b"[1, 2]")
    assert status == 400 and "JSON object" in reply["error"]
    status, reply = _post(server, "xmesh/api/debug", json.dumps({"pid": "1", "lines": ["c"]}).encode())
    assert status == 400 and "pid is the controller's process id" in reply["error"]
    status, reply = _post(server, "xmesh/api/debug", json.dumps({"pid": 1, "lines": ["c\nq"]}).encode())
    assert status == 400 and "one line each" in reply["error"]
    status, reply = _post(server, "xmesh/api/debug", json.dumps({"pid": 1, "lines": ["c"]}).encode())
    assert status == 400 and "pid 1 is no xmesh kernel or program" in reply["error"]
    status, _ = _post(server, "xmesh/api/debug", json.dumps({"pid": 1, "lines": ["c"]}).encode(), token=False)
    assert status == 403
    # The console's endpoint: one pdb command at one rank, checked the same way.
    for body, why in (({"pid": 1, "actor": "x y", "rank": 0, "command": "n"}, "actor is the name"),
                      ({"pid": 1, "actor": "w", "rank": -1, "command": "n"}, "rank is a whole number"),
                      ({"pid": 1, "actor": "w", "rank": 0, "command": "n\nc"}, "one pdb command line"),
                      ({"pid": 1, "actor": "w", "rank": 0, "command": "n"}, "pid 1 is no xmesh kernel or program")):
        status, reply = _post(server, "xmesh/api/pdb", json.dumps(body).encode())
        assert status == 400 and why in reply["error"], (body, reply)
    # Handing a debugger back: a pid is a whole number; one the panel does not hold is said so.
    status, reply = _post(server, "xmesh/api/release", json.dumps({"pid": "7"}).encode())
    assert status == 400 and "pid is the controller's process id" in reply["error"], reply
    status, reply = _post(server, "xmesh/api/release", json.dumps({"pid": 7}).encode())
    assert status == 200 and reply == {"pid": 7, "released": False}, reply
