"""`xmesh debug` (DESIGN §7): a second process drives the debugger of a running program through
the controller's unix socket; the newest client takes over, leaving hands the prompt back."""
import os
import stat
import subprocess
import textwrap

import pexpect

from test_debugger import HERE, attach_cast_where, terminal_program
from xmesh_testing import PYTHON, wait_until


def debug_client(*args):
    """`xmesh debug ARGS` on a terminal of its own."""
    return pexpect.spawn(PYTHON, ["-m", "xmesh.cli", "debug", *args], env=dict(os.environ), encoding="utf-8",
                         timeout=30, dimensions=(50, 200))


def xmesh_debug_fails(*args):
    r = subprocess.run([PYTHON, "-m", "xmesh.cli", "debug", *args], capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r
    return r.stderr


def test_a_client_takes_over_a_scripts_prompt_and_drives_it():
    with terminal_program('print("RESULT", sorted(fut.get().values()))') as child:
        child.expect("xmesh_dbg> ")
        client = debug_client()
        client.expect("xmesh_dbg> ")
        assert f"attached to the debugger of program pid {child.pid}" in client.before
        for rank in (0, 2, 3):
            assert f"| stopper    | {rank}    | gpus={rank} |" in client.before
        # the program's own prompt gave way and says to whom
        child.expect(rf"`xmesh debug` \(pid {client.pid}\) took over the debugger")

        attach_cast_where(client)
        client.sendline("continue")
        child.expect(r"RESULT \[20, 21, 22, 23\]")
        child.expect(pexpect.EOF)
        # the program ended: the client is told and exits cleanly
        client.expect(f"pid {child.pid} is exiting; the debugger closed")
        client.expect(pexpect.EOF)
        client.close()
        assert client.exitstatus == 0


def test_a_new_client_takes_over_and_leaving_hands_the_prompt_back():
    with terminal_program('print("RESULT", sorted(fut.get().values()))') as child:
        child.expect("xmesh_dbg> ")
        first = debug_client()
        first.expect("xmesh_dbg> ")
        second = debug_client("--pid", str(child.pid))
        second.expect("xmesh_dbg> ")
        first.expect(rf"another `xmesh debug` \(pid {second.pid}\) took over this debugger")
        first.expect(pexpect.EOF)
        first.close()
        assert first.exitstatus == 0

        second.sendline("list")
        second.expect("xmesh_dbg> ")
        assert "| stopper    | 3    | gpus=3 |" in second.before
        second.sendline("quit")
        second.expect("left the debugger; 3 actors still stopped in pdb")
        second.expect(pexpect.EOF)
        # the waiting get() takes its prompt back
        child.expect("xmesh_dbg> ")
        assert "| stopper    | 0    | gpus=0 |" in child.before
        child.sendline("c")
        child.expect(r"RESULT \[20, 21, 22, 23\]")
        child.expect(pexpect.EOF)


PROGRAM_WITHOUT_TERMINAL = textwrap.dedent('''
    import os, sys, time
    sys.path.insert(0, {here!r})
    from actors_for_tests import Stopper
    from xmesh import this_host

    procs = this_host().spawn_procs({{"gpus": 2}}, name="dbgjob")
    s = procs.spawn("stopper", Stopper)
    s.initialized.get()
    print("READY", flush=True)
    while not os.path.exists({go!r}):
        time.sleep(0.05)
    print("RESULT", sorted(s.step.call(5, stop_ranks=(1,)).get().values()), flush=True)
    procs.stop()
''')


def test_a_client_found_by_allocation_name_drives_a_program_with_no_terminal(tmp_path):
    """With no terminal a stop would be shown and continued; a client already attached gets it
    instead: the table comes to the client, and its `continue` ends the call."""
    go = str(tmp_path / "go")
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM_WITHOUT_TERMINAL.format(here=HERE, go=go))
    prog = subprocess.Popen([PYTHON, str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert prog.stdout.readline().strip() == "READY"
        client = debug_client("dbgjob")
        client.expect("xmesh_dbg> ")
        assert "no actors are stopped in pdb" in client.before
        client.sendline("where")
        client.expect("xmesh_dbg> ")
        assert "stopper: 2 ranks" in client.before and "2 ranks (ranks 0-1) idle" in client.before
        open(go, "w").close()
        client.expect(r"\[xmesh\] stopped in pdb:")
        client.expect(r"\| stopper    \| 1    \| gpus=1 \|")
        client.sendline("c")
        client.expect("continued 1 session")
        out, _ = prog.communicate(timeout=60)
        assert "RESULT [10, 11]" in out
        assert "cannot take input" not in out  # the client had it; nothing was auto-continued
        client.expect(pexpect.EOF)
        client.close()
    finally:
        prog.kill()
        prog.wait()


def test_the_channel_is_private_and_bad_targets_are_named(tmp_path):
    go = str(tmp_path / "go")
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM_WITHOUT_TERMINAL.format(here=HERE, go=go))
    rundir = os.environ["XMESH_RUNTIME_DIR"]
    assert "no xmesh program or kernel of yours runs" in xmesh_debug_fails()
    prog = subprocess.Popen([PYTHON, str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert prog.stdout.readline().strip() == "READY"
        sock_path = os.path.join(rundir, "c", f"{prog.pid}.debug")
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(sock_path)).st_mode) == 0o700
        # another user cannot connect
        r = subprocess.run([PYTHON, "-c", textwrap.dedent(f'''
            import os, socket
            os.setgid(65534); os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect({sock_path!r})
            except PermissionError:
                print("REFUSED")
            else:
                print("CONNECTED:", s.recv(100))
        ''')], capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() == "REFUSED", r

        err = xmesh_debug_fails("nosuchjob")
        assert "no live allocation named 'nosuchjob'" in err and "live: dbgjob" in err
        err = xmesh_debug_fails("--pid", "1")
        assert "pid 1 is no xmesh program or kernel with a debugger" in err

        # a second program: without a name or pid the choice is the user's, listed
        other = subprocess.Popen([PYTHON, "-c", "import xmesh, time; xmesh.this_host(); "
                                  "from xmesh._runtime.process import get_runtime; get_runtime(); print('UP', flush=True); "
                                  "time.sleep(60)"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        try:
            assert other.stdout.readline().strip() == "UP"
            err = xmesh_debug_fails()
            assert "2 xmesh programs or kernels run here" in err
            # each named as a person knows it: a program by its command line (a kernel: its notebook)
            assert f"prog.py (pid {prog.pid})" in err and f"program -c (pid {other.pid})" in err
        finally:
            other.kill()
            other.wait()
        # a controller that died without cleaning up leaves a socket the client skips and removes
        stale = os.path.join(rundir, "c", f"{other.pid}.debug")
        assert os.path.exists(stale)
        client = debug_client()
        client.expect("xmesh_dbg> ")
        assert f"program pid {prog.pid}" in client.before
        assert not os.path.exists(stale)
        client.sendline("quit")
        client.expect(pexpect.EOF)
        open(go, "w").close()  # no client now and no terminal: the stop is shown and continued
        out, _ = prog.communicate(timeout=60)
        assert "cannot take input" in out and "RESULT [10, 11]" in out
        wait_until(lambda: not os.path.exists(sock_path))  # removed at exit
    finally:
        prog.kill()
        prog.wait()


def _peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_a_client_that_floods_or_stops_reading_never_holds_the_debugger():
    """Issue 16: a 512 MiB line grew the controller by 1.3 GB, and a client that never read
    blocked every later `xmesh debug`. Lines are bounded, a silent reader is dropped.

    Invariant protocol.3 (docs/architecture/02-protocol.md).
    """
    import socket

    with terminal_program('print("RESULT", sorted(fut.get().values()))') as child:
        child.expect("xmesh_dbg> ")
        sock_path = os.path.join(os.environ["XMESH_RUNTIME_DIR"], "c", f"{child.pid}.debug")
        before = _peak_rss_kib(child.pid)
        flood = socket.socket(socket.AF_UNIX)
        flood.connect(sock_path)
        chunk = b"x" * (1 << 20)
        for _ in range(256):  # one 256 MiB line
            flood.sendall(chunk)
        # then commands whose answers it never reads, more than any socket buffer holds: the
        # debugger drops it after a few seconds of not reading
        child.expect(r"`xmesh debug` \(pid \d+\) took over the debugger")
        try:
            flood.sendall(b'\n' + b'{"line": "list"}\n' * 20000)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert _peak_rss_kib(child.pid) - before < 64 * 1024

        client = debug_client("--pid", str(child.pid))  # not held up by the silent one
        client.expect("xmesh_dbg> ", timeout=60)
        assert "| stopper    | 3    | gpus=3 |" in client.before
        flood.close()
        client.sendline("continue")
        child.expect(r"RESULT \[20, 21, 22, 23\]")
        child.expect(pexpect.EOF)
        client.expect(pexpect.EOF)


PROGRAM_SPINNING = textwrap.dedent('''
    import sys
    sys.path.insert(0, {here!r})
    from actors_for_tests import Stopper
    from xmesh import this_host

    procs = this_host().spawn_procs({{"gpus": 2}}, name="spinjob")
    s = procs.spawn("spinner", Stopper)
    s.initialized.get()
    print("READY", flush=True)
    looks = s.spin_until.call({go!r}).get()
    print("RESULT", all(n > 0 for n in looks.values()), flush=True)
    procs.stop()
''')


def test_a_client_attaches_to_a_rank_running_while_a_scripts_get_waits(tmp_path):
    """Issue 18 from a terminal: a script waits in get() on ranks spinning in Python; another
    program cannot pause them (it names the owner), `xmesh debug` can: attach stops the rank where
    it runs, pdb answers there, detach lets it run on and the script's call completes."""
    from test_debugger_attach import ScriptedIO
    from xmesh import this_host
    from xmesh._debug import controller as _debug

    go = str(tmp_path / "go")
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM_SPINNING.format(here=HERE, go=go))
    prog = subprocess.Popen([PYTHON, str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert prog.stdout.readline().strip() == "READY"
        this_host()  # this test's own controller, on the same host agent
        io = ScriptedIO(["attach spinner 0"])
        _debug.DebugPrompt(_debug.controller(), io).run(leave_when_resumed=False)
        assert "no actor mesh named 'spinner' lives on this program's procs" in io.text, io.text
        assert (f"only its owner can pause an actor of another program's allocation: 'spinjob' of controller pid "
                f"{prog.pid} (`xmesh debug --pid {prog.pid}` debugs it)") in io.text, io.text

        client = debug_client("spinjob")
        client.expect("xmesh_dbg> ")
        client.sendline("where")
        client.expect("xmesh_dbg> ")
        assert "2 ranks (ranks 0-1) running" in client.before and "spin_until" in client.before, client.before
        client.sendline("attach spinner 0")
        client.expect(r"\[spinner 0\] \(Pdb\) ")
        assert "attached to spinner rank 0" in client.before and "spin_until()" in client.before, client.before
        client.sendline("p looks > 0")
        client.expect(r"\[spinner 0\] \(Pdb\) ")
        assert "True" in client.before
        client.sendline("n")
        client.expect(r"\[spinner 0\] \(Pdb\) ")
        client.sendline("detach")
        client.expect("detached from spinner rank 0; it runs on")
        client.expect("xmesh_dbg> ")
        open(go, "w").close()
        out, _ = prog.communicate(timeout=60)
        assert "RESULT True" in out
        client.expect(pexpect.EOF)
        client.close()
    finally:
        prog.kill()
        prog.wait()
