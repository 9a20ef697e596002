"""Scale with default settings (issue 16, defect 6): an agent busy spawning 256 procs for one
controller stalled past the heartbeat timeout, and another controller's healthy mesh on that
agent failed with it."""
import os
import subprocess

from xmesh_testing import PYTHON

DEFAULTS = {"XMESH_HEARTBEAT_MS": "1000", "XMESH_HOSTD_TIMEOUT_MS": "4000", "XMESH_ORPHAN_GRACE": "60",
            "XMESH_HOSTD_IDLE": "300"}

NEIGHBOUR = """
import sys, time
from xmesh import Actor, endpoint, this_host
class Echo(Actor):
    @endpoint
    def ping(self, i):
        return i
e = this_host().spawn_procs({"gpus": 1}).spawn("echo", Echo)
e.ping.call_one(0).get(timeout=60)
print("UP", flush=True)
ok = 0
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    ok += e.ping.call_one(ok).get(timeout=120) == ok
    time.sleep(0.2)
print("PINGS", ok, flush=True)
"""

SPAWN_256 = """
import time
from xmesh import Actor, endpoint, this_host
class One(Actor):
    @endpoint
    def one(self):
        return 1
t = time.monotonic()
pm = this_host().spawn_procs({"gpus": 256})
print("SUM", sum(pm.spawn("one", One).one.call().get(timeout=300).values()), round(time.monotonic() - t, 1), flush=True)
pm.stop()
"""


def test_256_procs_spawn_with_default_settings_and_a_neighbour_keeps_its_mesh(fresh_rundir, tmp_path):
    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir, **DEFAULTS)
    (tmp_path / "neighbour.py").write_text(NEIGHBOUR)
    (tmp_path / "spawn.py").write_text(SPAWN_256)
    neighbour = subprocess.Popen([PYTHON, str(tmp_path / "neighbour.py"), "30"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert neighbour.stdout.readline().strip() == "UP"
        big = subprocess.run([PYTHON, str(tmp_path / "spawn.py")], env=env, capture_output=True, text=True,
                             timeout=110, cwd=tmp_path)
        assert big.returncode == 0, big.stderr[-3000:]
        assert "SUM 256" in big.stdout
        out, err = neighbour.communicate(timeout=100)
        assert neighbour.returncode == 0, err[-3000:]
        assert "PINGS" in out and int(out.split("PINGS")[1].split()[0]) > 10, (out, err[-2000:])
    finally:
        neighbour.kill()
        neighbour.wait()
