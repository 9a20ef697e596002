"""Environment knobs (XMESH_*) read one way (python/xmesh/_base/env.py): a malformed value is the
knob's default, never an exception where the knob is used (a wait, a job's watch)."""
import ast

from xmesh_testing import package_modules, run_program

SLOW_CALL = """
import time
import xmesh
from xmesh import Actor, endpoint

class Slow(Actor):
    @endpoint
    def nap(self, s):
        time.sleep(s)
        return s

pm = xmesh.this_host().spawn_procs(per_host={"gpus": 1})
a = pm.spawn("slow", Slow)
print("GOT", a.nap.call_one(0.5).get(timeout=30))
pm.stop()
"""


def test_a_malformed_wait_notice_is_the_default(monkeypatch):
    from xmesh._runtime import wait as _wait

    monkeypatch.setenv("XMESH_WAIT_NOTICE_S", "two seconds")
    assert _wait.slow_wait_s() == 2.0
    monkeypatch.setenv("XMESH_WAIT_NOTICE_S", "0.5")
    assert _wait.slow_wait_s() == 0.5


def test_a_program_waits_through_a_malformed_wait_notice():
    r = run_program(SLOW_CALL, env={"XMESH_WAIT_NOTICE_S": "soon", "XMESH_JOB_POLL_S": "often"}, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "GOT 0.5" in r.stdout


# Knobs a user sets, as opposed to what the host agent hands its procs (XMESH_RANK, ...), which
# are read as they are and must be well formed.
SET_BY_THE_RUNTIME = {"XMESH_RANK", "XMESH_HOSTD_PID", "XMESH_READY_CORR"}


def test_numeric_knobs_are_read_through_env():
    """No module converts an XMESH_ value with float()/int() itself (a typo would raise there),
    but for the values the runtime hands its procs, and a knob that refuses bad input by name."""
    raw = []
    for name, path in package_modules().items():
        if name == "_base.env":
            continue
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "float")):
                continue
            inner = node.args[0] if node.args else None
            if inner is not None and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                                         and n.func.id.startswith("env_") for n in ast.walk(inner)):
                continue  # converted after _env read it
            src = ast.unparse(inner) if inner is not None else ""
            knob = src.split("XMESH_", 1)[1].split("'")[0].split('"')[0] if "XMESH_" in src else ""
            if knob and "XMESH_" + knob not in SET_BY_THE_RUNTIME:
                raw.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert raw == [], "read these through xmesh._base.env: " + repr(raw)
