"""Ctrl-C during get() raises KeyboardInterrupt at once, naming the ranks still running;
cancel() then stops them and the program goes on."""
import os
import signal
import subprocess
import time

from xmesh_testing import PYTHON

PROGRAM = """
import sys, time
sys.path.insert(0, {testdir!r})
from actors_for_tests import Counter
from xmesh import this_host
pm = this_host().spawn_procs({{"gpus": 2}})
c = pm.spawn("sleepers", Counter)
c.get.call().get(timeout=30)
fut = c.spin.call(60)
print("waiting", flush=True)
t0 = time.monotonic()
try:
    fut.get()
except KeyboardInterrupt as e:
    print("interrupted after %.1f s: %s" % (time.monotonic() - t0, e), flush=True)
fut.cancel()
print("still usable:", list(c.get.call().get(timeout=30).values()), flush=True)
"""


def test_ctrl_c_interrupts_get_and_names_ranks(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text(PROGRAM.format(testdir=os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.Popen([PYTHON, str(prog)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "waiting"
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    line = [ln for ln in out.splitlines() if ln.startswith("interrupted")][0]
    # Interrupted while both ranks were still in their 60 s endpoint: it did not wait for them.
    assert "ranks still running: [0, 1]" in line
    assert "still usable: [0, 0]" in out
