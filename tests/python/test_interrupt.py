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
    """Invariant call.5 (docs/architecture/05-call-path.md)."""
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


THREAD_MASKS = """
import os, sys
sys.path.insert(0, {testdir!r})
from actors_for_tests import Counter
from xmesh import this_host
pm = this_host().spawn_procs({{"gpus": 2}})
c = pm.spawn("c", Counter)
c.get.call().get(timeout=30)
c.get.broadcast()  # a broadcast, so the relay thread (if any) is up too
from xmesh import this_proc
mine = this_proc().spawn("mine", Counter)  # an actor of the user's in this process: user code
mine.get.call().get(timeout=30)
def sigint_blocked(tid):
    with open(f"/proc/self/task/{{tid}}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
    return bool(mask & (1 << (2 - 1)))  # SIGINT is 2
for tid in sorted(os.listdir("/proc/self/task")):  # the C++ threads, by their OS names
    with open(f"/proc/self/task/{{tid}}/comm") as f:
        name = f.read().strip()
    if name.startswith("xmesh-") or int(tid) == os.getpid():
        print(name if int(tid) != os.getpid() else "main", "blocked" if sigint_blocked(tid) else "open")
import threading
for t in threading.enumerate():  # xmesh's Python threads, by their Python names
    if t.name.startswith("xmesh-"):
        print("py:" + t.name, "blocked" if sigint_blocked(t.native_id) else "open")
"""


def test_the_runtimes_threads_leave_sigint_to_the_main_thread(tmp_path):
    """A SIGINT the kernel gives one of the runtime's threads is lost to a Python program blocked
    in input() (its select() is only cut short by a signal delivered to the main thread, as the
    debugger's prompt is). Every thread of xmesh's own that runs no user code blocks SIGINT; the
    main thread and the threads that run user code (an actor's: a process it starts inherits its
    mask) keep it."""
    script = tmp_path / "masks.py"
    script.write_text(THREAD_MASKS.format(testdir=os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    seen = dict(line.split() for line in r.stdout.splitlines() if line.strip())
    assert seen.pop("main") == "open", r.stdout
    # The user's actor's thread (its Python name; every actor thread's OS name is "xmesh-actor",
    # the controller's own registry actor's included, which blocks it).
    user_code = {name: state for name, state in seen.items() if name.startswith("py:xmesh-actor-mine")}
    assert user_code and all(state == "open" for state in user_code.values()), r.stdout
    seen = {name: state for name, state in seen.items() if name != "xmesh-actor"}
    own = {name: state for name, state in seen.items() if name not in user_code}
    assert {"xmesh-io", "xmesh-rings", "py:xmesh-control", "py:xmesh-log-output", "py:xmesh-actor-host",
            "py:xmesh-actor-xmesh-controllers"} <= {name.split(".")[0] for name in own}, r.stdout
    assert all(state == "blocked" for state in own.values()), r.stdout


def test_starting_a_user_thread_never_opens_the_starting_threads_mask(monkeypatch):
    """The runtime's event thread starts actor threads: were it to unblock SIGINT around the
    start, the new thread could run (and answer its call) before the starter is scheduled again
    to block it back, leaving one of xmesh's own threads open to a SIGINT meanwhile."""
    import threading

    from xmesh._base.threads import start_thread, start_user_thread

    real = signal.pthread_sigmask
    calls = []

    def recording(how, mask):
        calls.append((threading.get_ident(), how, set(mask)))
        return real(how, mask)

    monkeypatch.setattr(signal, "pthread_sigmask", recording)
    seen = {}

    def user_code():
        seen["user"] = signal.SIGINT not in real(signal.SIG_BLOCK, set())

    def starter():
        seen["starter_before"] = signal.SIGINT in real(signal.SIG_BLOCK, set())
        seen["starter_ident"] = threading.get_ident()
        t = start_user_thread(threading.Thread(target=user_code))
        t.join()
        seen["starter_after"] = signal.SIGINT in real(signal.SIG_BLOCK, set())

    start_thread(threading.Thread(target=starter)).join()
    assert seen["starter_before"] and seen["starter_after"]  # one of xmesh's own: blocked
    assert seen["user"]  # the user's thread: open
    opened_by_starter = [c for c in calls if c[0] == seen["starter_ident"] and c[1] != signal.SIG_BLOCK]
    assert opened_by_starter == []
