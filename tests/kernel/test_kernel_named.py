"""Named allocations in the kernel: procs and actors survive a kernel restart and a SIGKILL
of the kernel alone, a new kernel attaches by name and calls the actors by endpoint name (the
class is not defined there), a second kernel takes over, `xmesh ls` / `xmesh stop` see them."""
import os
import subprocess
import time

from cells import COUNTER
from kernel_session import KernelSession
from xmesh_testing import PYTHON, pid_alive, wait_until

SPAWN = COUNTER + '''
procs = this_host().spawn_procs({"gpus": 2}, name="trainers")
model = procs.spawn("model", Counter)
for _ in range(5):
    model.incr.call().get()
'''
ATTACH = "import xmesh\nprocs = xmesh.attach('trainers')\nmodel = procs.actors('model')"
FACTS = "sorted((v['pid'], v['id'], v['token']) for v in model.facts.call().get().values())"


def _facts(kernel):
    return kernel.literal(FACTS)


def _incr(kernel):
    return kernel.literal("list(model.incr.call().get().values())")


def _xmesh(rundir, *args):
    env = dict(os.environ, XMESH_RUNTIME_DIR=rundir)
    return subprocess.run([PYTHON, "-m", "xmesh.cli", *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_named_allocation_survives_a_restart_and_is_attached_by_name(kernel, kernel_rundir):
    kernel.ok(SPAWN)
    before = _facts(kernel)
    pids = [f[0] for f in before]
    kernel.restart()
    assert all(pid_alive(p) for p in pids)
    r = kernel.run("Counter")
    assert r.status == "error" and r.error["ename"] == "NameError"  # a fresh kernel: the class is gone
    kernel.ok(ATTACH)
    assert _facts(kernel) == before
    assert _incr(kernel) == [6, 6]
    # The same spawn_procs call attaches too; another shape is refused, naming both.
    assert sorted(kernel.literal(
        "xmesh.this_host().spawn_procs({'gpus': 2}, name='trainers').pids")) == sorted(pids)
    r = kernel.run("xmesh.this_host().spawn_procs({'gpus': 4}, name='trainers')")
    assert r.status == "error" and r.error["ename"] == "ValueError"
    assert "{'gpus': 2}" in r.error["evalue"] and "{'gpus': 4}" in r.error["evalue"]
    assert "trainers" in kernel.value("[a['name'] for a in xmesh.allocations()]")
    ls = _xmesh(kernel_rundir, "ls")
    assert ls.returncode == 0 and "trainers" in ls.stdout and "gpus=2" in ls.stdout and "2/2" in ls.stdout
    assert "attached" in ls.stdout
    # procs.stop() ends it.
    kernel.ok("procs.stop()")
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=15)
    assert "no named allocations" in _xmesh(kernel_rundir, "ls").stdout


def test_a_named_allocation_survives_sigkill_of_the_kernel(kernel, kernel_rundir):
    kernel.ok(SPAWN)
    before = _facts(kernel)
    pids = [f[0] for f in before]
    os.kill(kernel.pid, 9)
    time.sleep(4)  # past XMESH_ORPHAN_GRACE (3 s here): unnamed meshes would be gone by now
    assert all(pid_alive(p) for p in pids)
    assert "detached" in _xmesh(kernel_rundir, "ls").stdout
    kernel.km.restart_kernel(now=True)
    kernel.kc.wait_for_ready(timeout=60)
    kernel.ok(ATTACH)
    assert _facts(kernel) == before
    assert _incr(kernel) == [6, 6]
    stop = _xmesh(kernel_rundir, "stop", "trainers")
    assert stop.returncode == 0, stop.stderr
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=15)
    assert _xmesh(kernel_rundir, "stop", "trainers").returncode == 1


def test_a_second_kernel_takes_over(kernel, kernel_rundir):
    kernel.ok(SPAWN)
    second = KernelSession(kernel_rundir)
    try:
        second.ok(ATTACH)
        assert _incr(second) == [6, 6]
        r = kernel.run("model.incr.call().get()")
        assert r.status == "error" and r.error["ename"] == "TakenOverError", r.error_text
        assert "taken over by another controller" in r.error["evalue"]
        assert _incr(second) == [7, 7]
        second.ok("procs.stop()")
    finally:
        second.close()
