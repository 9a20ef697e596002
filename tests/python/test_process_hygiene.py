"""Processes as DESIGN §1 and §3 want them: signal state reset in procs, no pyzmq in the
controller or procs, no libpython in the host agent, procs in their own process groups,
garbage to a proc's socket harmless, output never lost at exit."""
import os
import signal
import socket
import subprocess
import sys

from actors_for_tests import Counter
from xmesh_testing import run_program

from xmesh import this_host


def test_signal_masks_and_dispositions_are_reset_in_procs():
    # The controller blocks and ignores SIGINT (as the kernel does in its threads): its procs
    # must not inherit that.
    r = run_program(
        "import signal, sys, json\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\n"
        "signal.signal(signal.SIGQUIT, signal.SIG_IGN)\n"
        "from actors_for_tests import Counter\nfrom xmesh import this_host\n"
        "pm = this_host().spawn_procs({'gpus': 1})\n"
        "print(json.dumps(pm.spawn('c', Counter).process_facts.call_one().get()))\n")
    assert r.returncode == 0, r.stderr
    import json

    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert facts["sigblk"] & (1 << (signal.SIGINT - 1)) == 0
    assert facts["sigblk"] & (1 << (signal.SIGTERM - 1)) == 0
    assert facts["sigign"] & (1 << (signal.SIGQUIT - 1)) == 0
    assert facts["pgid"] == facts["pid"]  # its own process group, so a stop reaches its children


def test_no_pyzmq_in_controller_or_procs():
    pm = this_host().spawn_procs({"gpus": 1})
    facts = pm.spawn("z", Counter).process_facts.call_one().get(timeout=30)
    assert not facts["zmq_imported"]
    assert "zmq" not in sys.modules
    pm.stop()


def test_host_agent_links_no_libpython():
    exe = os.environ.get("XMESH_HOSTD")
    out = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    assert "libxmesh" in out and "libpython" not in out


def test_garbage_to_a_proc_socket_is_harmless():
    """Invariant protocol.1 (docs/architecture/02-protocol.md)."""
    pm = this_host().spawn_procs({"gpus": 1})
    c = pm.spawn("g", Counter)
    addr = c.process_facts.call_one().get(timeout=30)["addr"]
    for payload in (os.urandom(2048), b"\x01\x00" * 300, b"GET / HTTP/1.1\r\n\r\n"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr[len("ipc://"):])
        s.sendall(payload)
        s.close()
    assert c.incr.call_one().get(timeout=30) == 1
    pm.stop()


def test_every_line_written_before_a_call_returned_is_printed_before_exit():
    r = run_program(
        "import sys\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "from actors_for_tests import Counter\nfrom xmesh import this_host\n"
        "pm = this_host().spawn_procs({'gpus': 2})\n"
        "pm.spawn('loud', Counter).shout.call(2000).get()\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for rank in (0, 1):
        got = [ln for ln in lines if ln.startswith(f"[{rank}] line ")]
        assert len(got) == 2000, (rank, len(got))
        assert got[0] == f"[{rank}] line 0 from rank {rank}" and got[-1] == f"[{rank}] line 1999 from rank {rank}"


def test_context_manager_stops_the_mesh():
    with this_host().spawn_procs({"gpus": 1}) as pm:
        pids = pm.pids
        assert pm.spawn("cm", Counter).incr.call_one().get(timeout=30) == 1
    assert pm.allocation.stopped
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_children_that_left_the_procs_group_end_with_the_allocation(fresh_rundir):
    """Issue 16, defect 10: a child a proc started in a session of its own survived the proc,
    procs.stop() and `xmesh shutdown`.

    Invariant processes.1 (docs/architecture/01-processes-and-threads.md).
    """
    import xmesh
    from actors_for_tests import Escaper
    from xmesh_testing import PYTHON, pid_alive, wait_until

    for ending in ("stop", "shutdown"):
        pm = xmesh.hosts([fresh_rundir]).spawn_procs({"gpus": 2})
        children = sorted(pm.spawn("escaper", Escaper).start_escaping_child.call().get(timeout=30).values())
        assert all(pid_alive(c) for c in children)
        if ending == "stop":
            pm.stop()
        else:
            r = subprocess.run([PYTHON, "-m", "xmesh.cli", "shutdown", "--runtime-dir", fresh_rundir],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        assert wait_until(lambda: not any(pid_alive(c) for c in children), timeout=30), (ending, children)


def test_socket_files_of_killed_processes_are_removed(fresh_rundir):
    """Issue 16, defect 10: SIGKILLed procs and controllers left their socket files for good.

    Invariant processes.1 (docs/architecture/01-processes-and-threads.md).
    """
    import xmesh
    from actors_for_tests import Counter
    from xmesh_testing import PYTHON, wait_until

    pm = xmesh.hosts([fresh_rundir]).spawn_procs({"gpus": 2})
    pids = [v["pid"] for v in pm.spawn("c", Counter).whoami.call().get(timeout=30).values()]
    procs_dir = os.path.join(fresh_rundir, "p")
    assert len(os.listdir(procs_dir)) == 2
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # a controller killed with its sockets in place
    ctl = subprocess.Popen([PYTHON, "-c", "import xmesh, sys, time; xmesh.hosts([sys.argv[1]]); "
                            "from xmesh._runtime.process import get_runtime; get_runtime(); print('UP', flush=True); "
                            "time.sleep(300)", fresh_rundir], stdout=subprocess.PIPE, text=True,
                           env=dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir))
    assert ctl.stdout.readline().strip() == "UP"
    ctl_dir = os.path.join(fresh_rundir, "c")
    assert any(name.startswith(f"{ctl.pid}-") for name in os.listdir(ctl_dir))
    ctl.kill()
    ctl.wait()
    # the agent removes a proc's at once, a controller's at its next sweep (XMESH_SOCKET_SWEEP_MS: 1 s here)
    assert wait_until(lambda: not os.listdir(procs_dir), timeout=30), os.listdir(procs_dir)
    assert wait_until(lambda: not any(n.startswith(f"{ctl.pid}") for n in os.listdir(ctl_dir)), timeout=60), \
        os.listdir(ctl_dir)
    pm.stop()


def test_the_agent_a_program_starts_keeps_none_of_its_files(fresh_rundir):
    """A program that starts the host agent (none ran for its runtime directory) with a pipe it
    inherited (a harness's result pipe, Monarch's isolate_in_subprocess) does not leave that pipe
    open in the long-lived agent: its reader sees the end when the program ends."""
    import select

    from xmesh_testing import PYTHON

    r, w = os.pipe()
    prog = ("import os\nfrom xmesh import this_host\n"
            "this_host().spawn_procs({'gpus': 1}).initialized.get(timeout=60)\n"
            f"os.write({w}, b'spawned')\n")
    p = subprocess.Popen([PYTHON, "-c", prog], pass_fds=[w], env=dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir))
    os.close(w)
    try:
        assert p.wait(timeout=90) == 0
        assert os.path.exists(os.path.join(fresh_rundir, "hostd.pid"))  # the agent it started lives on
        got = b""
        while True:
            ready, _, _ = select.select([r], [], [], 10)
            assert ready, f"the pipe stayed open after the program ended (read so far: {got!r})"
            chunk = os.read(r, 100)
            if not chunk:
                break
            got += chunk
        assert got == b"spawned"
    finally:
        os.close(r)
