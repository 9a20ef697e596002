"""When a controller ends, its procs end: at once on a normal exit, after XMESH_ORPHAN_GRACE
when it vanishes. The host agent is a detached daemon that exits when idle."""
import json
import os
import signal
import subprocess
import time

from xmesh_testing import PYTHON, pid_alive, run_program, wait_until

SPAWNER = """
import json, sys
from xmesh import this_host
pm = this_host().spawn_procs({"gpus": 2})
pm.initialized.get(timeout=30)
print(json.dumps(pm.pids), flush=True)
if sys.argv[1:] == ["hang"]:
    import time
    time.sleep(600)
"""


def test_normal_exit_stops_procs_at_once():
    r = run_program(SPAWNER)
    assert r.returncode == 0, r.stderr
    pids = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(pids) == 2
    # The controller's exit handler waited for the exits: gone already.
    assert not any(pid_alive(p) for p in pids)


def test_vanished_controller_procs_end_after_orphan_grace(tmp_path):
    prog = tmp_path / "spawner.py"
    prog.write_text(SPAWNER)
    p = subprocess.Popen([PYTHON, str(prog), "hang"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, XMESH_ORPHAN_GRACE="2"))
    pids = json.loads(p.stdout.readline())
    p.send_signal(signal.SIGKILL)  # as the OOM killer would: no cleanup runs
    p.wait()
    assert all(pid_alive(x) for x in pids)  # the grace protects a restarting controller
    assert wait_until(lambda: not any(pid_alive(x) for x in pids), timeout=30)


def test_host_agent_is_detached_and_exits_when_idle(fresh_rundir):
    env = {"XMESH_RUNTIME_DIR": fresh_rundir, "XMESH_HOSTD_IDLE": "1", "XMESH_ORPHAN_GRACE": "1"}
    r = run_program(SPAWNER, env=env)
    assert r.returncode == 0, r.stderr
    pid = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    stat = open(f"/proc/{pid}/stat").read().split()
    # Its own session and process group (setsid, double fork): a Ctrl-C or a restart of the
    # controller's process group never reaches it.
    assert int(stat[5]) != os.getsid(0) and int(stat[4]) != os.getpgid(0)
    assert oct(os.stat(os.path.join(fresh_rundir, "hostd.sock")).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.join(fresh_rundir, "cookie")).st_mode & 0o777) == "0o600"
    assert wait_until(lambda: not pid_alive(pid), timeout=20)


def test_runtime_dir_of_another_user_is_refused(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)  # nobody
    r = run_program("from xmesh import this_host\nthis_host().spawn_procs({'gpus': 1})\n",
                    env={"XMESH_RUNTIME_DIR": str(d)})
    assert r.returncode != 0
    assert "belongs to another user" in r.stderr
    assert "Traceback" in r.stderr and "Segmentation" not in r.stderr


def test_garbage_bytes_to_the_agent_socket(rundir):
    import socket

    from xmesh import this_host

    this_host().spawn_procs({"gpus": 1}).initialized.get(timeout=30)
    pid = int(open(os.path.join(rundir, "hostd.pid")).read())
    for payload in (b"GET / HTTP/1.0\r\n\r\n", os.urandom(4096), b"\xff" * 10 + b"\x00" * 100):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.path.join(rundir, "hostd.sock"))
        s.sendall(payload)
        s.close()
    time.sleep(0.2)
    assert pid_alive(pid)
    # Still serving.
    pm = this_host().spawn_procs({"gpus": 1})
    pm.initialized.get(timeout=30)
    pm.stop()


def test_forked_child_gets_its_own_runtime():
    r = run_program(
        "import os, sys\nfrom xmesh import this_host\n"
        "pm = this_host().spawn_procs({'gpus': 1})\npm.initialized.get(timeout=30)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    child = this_host().spawn_procs({'gpus': 1})\n"
        "    child.initialized.get(timeout=30)\n"
        "    print('child ok', flush=True)\n"
        "    sys.exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('parent ok', os.waitstatus_to_exitcode(status), flush=True)\n", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "child ok" in r.stdout and "parent ok 0" in r.stdout


def test_an_idle_agent_that_refuses_is_replaced(fresh_rundir):
    env = {"XMESH_RUNTIME_DIR": fresh_rundir, "XMESH_HOSTD_IDLE": "60"}
    r = run_program(SPAWNER, env=env)
    assert r.returncode == 0, r.stderr
    old = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    assert pid_alive(old)
    # The cookie changed underneath the running agent (say the directory was recreated): it now
    # refuses this user's controllers. Idle, it is replaced rather than leaving the user stuck.
    with open(os.path.join(fresh_rundir, "cookie"), "w") as f:
        f.write("0" * 64)
    r = run_program(SPAWNER, env=env)
    assert r.returncode == 0, r.stderr
    new = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    assert new != old and not pid_alive(old)


def test_starting_an_agent_leaves_no_zombie(fresh_rundir):
    import xmesh

    xmesh.hosts([fresh_rundir]).spawn_procs({"gpus": 1}).initialized.get(timeout=30)
    me = os.getpid()
    zombies = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if stat[0] == "Z" and int(stat[1]) == me:
                zombies.append(entry)
    assert zombies == []


def test_a_pid_file_naming_a_zombie_starts_a_new_agent(fresh_rundir):
    # A SIGKILLed agent stays a zombie where the container's init reaps late; its pid file
    # remains. The next controller must start a new agent, not wait on the dead one's socket.
    zombie = subprocess.Popen(["true"])
    assert wait_until(lambda: open(f"/proc/{zombie.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z")
    try:
        with open(os.path.join(fresh_rundir, "hostd.pid"), "w") as f:
            f.write(f"{zombie.pid}\n")
        from xmesh._base.pids import pid_alive as product_pid_alive

        assert not product_pid_alive(zombie.pid)
        r = run_program(SPAWNER, env={"XMESH_RUNTIME_DIR": fresh_rundir})
        assert r.returncode == 0, r.stderr
        new = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
        assert new != zombie.pid and pid_alive(new)
    finally:
        zombie.wait()


def test_an_idle_agent_of_another_build_is_replaced_and_answers(fresh_rundir):
    # After an upgrade, the idle agent left running is another build: the controller replaces
    # it and talks to the new one over a new connection (a new Hello), without waiting.
    env = {"XMESH_RUNTIME_DIR": fresh_rundir, "XMESH_HOSTD_IDLE": "60"}
    r = run_program(SPAWNER, env=env)
    assert r.returncode == 0, r.stderr
    old = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    r = run_program("from xmesh import _core\n_core.build_id = lambda: 'an-older-build'\n" + SPAWNER, env=env,
                    timeout=40)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout.strip().splitlines()[-1])) == 2
    new = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    assert new != old and not pid_alive(old)


AGENT_GOES_AWAY = """
import os, signal, subprocess, sys, time
from xmesh import Actor, ActorError, endpoint, this_host

class Echo(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

pm = this_host().spawn_procs({"gpus": 1})
old = pm.spawn("old", Echo)
old.pid.call_one().get(timeout=30)
rundir = os.environ["XMESH_RUNTIME_DIR"]
agent = int(open(os.path.join(rundir, "hostd.pid")).read())
if sys.argv[1] == "shutdown":
    r = subprocess.run([sys.executable, "-m", "xmesh.cli", "shutdown", "--runtime-dir", rundir])
    assert r.returncode == 0
else:
    os.kill(agent, signal.SIGKILL)
    def state():
        try:
            return open(f"/proc/{agent}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return "gone"  # already reaped
    while state() not in ("Z", "X", "gone"):
        time.sleep(0.01)
t0 = time.monotonic()
pm2 = this_host().spawn_procs({"gpus": 1})
print("new mesh", pm2.spawn("new", Echo).pid.call_one().get(timeout=30) > 0, flush=True)
try:
    old.pid.call_one().get(timeout=30)
    print("old mesh answered")
except ActorError as e:
    print("old mesh:", e)
print("took", round(time.monotonic() - t0), "s")
"""


def _agent_goes_away(fresh_rundir, how):
    # Heartbeats would notice only after a minute: the controller must see the agent gone itself.
    env = {"XMESH_RUNTIME_DIR": fresh_rundir, "XMESH_HOSTD_TIMEOUT_MS": "60000"}
    r = run_program(AGENT_GOES_AWAY, env=env, args=(how,), timeout=90)
    assert r.returncode == 0, r.stderr
    assert "new mesh True" in r.stdout, r.stdout + r.stderr
    assert "old mesh answered" not in r.stdout
    return r


def test_a_controller_spawns_again_after_its_agent_was_shut_down(fresh_rundir):
    r = _agent_goes_away(fresh_rundir, "shutdown")
    assert "old mesh:" in r.stdout


def test_a_controller_spawns_again_after_its_agent_was_killed(fresh_rundir):
    r = _agent_goes_away(fresh_rundir, "kill")
    # The old mesh's procs died with their agent: its calls fail naming the agent, not hang.
    assert "host agent" in r.stdout.split("old mesh:", 1)[1], r.stdout


def test_an_agent_that_cannot_start_fails_the_spawn_at_once(fresh_rundir, tmp_path):
    # An agent binary that exits at once (here a stand-in writing its reason to the log, as
    # xmesh-hostd does): the controller says so with the log's end, without a 15 s wait.
    fake = tmp_path / "broken-hostd"
    fake.write_text("#!/bin/sh\necho '[xmesh hostd] not started: the disk is on fire' >> \"$3/hostd.log\"\nexit 7\n")
    fake.chmod(0o755)
    r = run_program(SPAWNER, env={"XMESH_RUNTIME_DIR": fresh_rundir, "XMESH_HOSTD": str(fake)}, timeout=30)
    assert r.returncode != 0
    assert "failed to start (exit status 7)" in r.stderr and "the disk is on fire" in r.stderr, r.stderr


def test_a_call_in_flight_keeps_its_unnamed_allocation_alive():
    """Defect: written as one expression, the allocation's handles were temporaries gone before
    the reply, so the procs stopped under the call (SupervisionError ... SIGTERM).

    Invariant call.6 (docs/architecture/05-call-path.md).
    """
    from actors_for_tests import Counter, Stopper

    import xmesh

    assert xmesh.this_host().spawn_procs({"gpus": 1}).spawn("c", Counter, 3).incr.call_one(2).get(timeout=30) == 5
    assert sorted(f.get() for f in xmesh.this_host().spawn_procs({"gpus": 2}).spawn("c", Counter, 1).incr.stream(1)) \
        == [2, 2]
    fut = xmesh.this_host().spawn_procs({"gpus": 1}).spawn("p", Stopper).pid.call()
    pid, = fut.get(timeout=30).values()
    # Once the call finished, the future no longer holds the allocation: it stops as its last
    # handle went.
    assert wait_until(lambda: not pid_alive(pid), timeout=20)


def _open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_agent_keeps_nothing_of_controllers_that_left(fresh_rundir):
    """Issue 16, defect 7: the agent kept a connection (an fd) per controller that ever talked to
    it (each script, kernel, `xmesh status`); at the fd limit it died with its named allocations.

    Invariant processes.1 (docs/architecture/01-processes-and-threads.md).
    """
    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir)
    status = [PYTHON, "-m", "xmesh.cli", "status", "--runtime-dir", fresh_rundir]
    assert subprocess.run(status, env=env, capture_output=True, timeout=60).returncode == 0
    agent = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    before = _open_fds(agent)
    for i in range(12):
        if i % 3 == 2:  # some leave without a goodbye, as a killed script does
            p = subprocess.Popen(status[:3] + ["--json"] + status[3:], env=env, stdout=subprocess.PIPE)
            p.stdout.readline()
            p.kill()
            p.wait()
        else:
            assert subprocess.run(status, env=env, capture_output=True, timeout=60).returncode == 0
    assert wait_until(lambda: _open_fds(agent) <= before + 1, timeout=30), (before, _open_fds(agent))


def test_a_paused_controller_keeps_its_procs(tmp_path):
    """A controller stopped (SIGSTOP, a debugger) longer than the orphan grace is not vanished:
    its procs are still there when it resumes.

    Invariant call.3 (docs/architecture/05-call-path.md).
    """
    prog = tmp_path / "spawner.py"
    prog.write_text(SPAWNER)
    p = subprocess.Popen([PYTHON, str(prog), "hang"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, XMESH_ORPHAN_GRACE="1"))
    try:
        pids = json.loads(p.stdout.readline())
        p.send_signal(signal.SIGSTOP)
        time.sleep(4)
        assert all(pid_alive(x) for x in pids)
    finally:
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait()
    assert wait_until(lambda: not any(pid_alive(x) for x in pids), timeout=30)  # then it did vanish


def test_held_connections_that_never_authenticate_are_dropped(fresh_rundir, monkeypatch):
    """Issue 16, defect 7: connections that never finish their handshake were held for good, one
    fd each, until the agent died at its fd limit. They are closed after XMESH_HANDSHAKE_MS.

    Invariant protocol.3 (docs/architecture/02-protocol.md).
    """
    import socket

    import xmesh
    from xmesh import _core

    monkeypatch.setenv("XMESH_HANDSHAKE_MS", "1000")  # for the agent this test starts
    pm = xmesh.hosts([fresh_rundir]).spawn_procs({"gpus": 1})
    pm.initialized.get(timeout=30)
    agent = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
    before = _open_fds(agent)
    held = []
    for _ in range(300):
        s = socket.socket(socket.AF_UNIX)
        s.connect(_core.layout_hostd_socket(fresh_rundir))
        held.append(s)
    assert wait_until(lambda: _open_fds(agent) >= before + 250, timeout=10)
    assert wait_until(lambda: _open_fds(agent) <= before + 5, timeout=30), (before, _open_fds(agent))
    for s in held:
        s.close()
    r = subprocess.run([PYTHON, "-m", "xmesh.cli", "status", "--runtime-dir", fresh_rundir], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "1/1 procs alive" in r.stdout, r
    pm.stop()


AT_THE_FD_LIMIT = """
from xmesh import this_host
try:
    big = this_host().spawn_procs({"gpus": 60})
    big.initialized.get(timeout=60)
    print("SPAWNED", flush=True)
except Exception as e:
    print("REFUSED", type(e).__name__, e, flush=True)
small = this_host().spawn_procs({"gpus": 1})
small.initialized.get(timeout=60)
print("SMALL OK", flush=True)
"""


def test_an_agent_at_its_fd_limit_refuses_a_spawn_and_lives_on(fresh_rundir):
    """Issue 16, defect 7: at the fd limit the agent died (and its named allocations with it).
    Under `ulimit -n 128` (inherited by the agent), 60 procs need more: the spawn fails saying why,
    and the agent serves the next one.

    Invariant protocol.3 (docs/architecture/02-protocol.md).
    """
    import resource

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir)
    r = subprocess.run([PYTHON, "-c", AT_THE_FD_LIMIT], env=env, capture_output=True, text=True, timeout=110,
                       preexec_fn=low_limit)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "REFUSED" in r.stdout and "Too many open files (the host agent may open 128 files" in r.stdout, r.stdout
    assert "SMALL OK" in r.stdout


def test_a_connection_flood_at_the_fd_limit_does_not_kill_the_agent(fresh_rundir):
    """Issue 16, defect 7: ~20,000 held connections made libzmq abort the agent ("Too many open
    files"). Under `ulimit -n 256` a flood takes every fd the agent has; it must live through it,
    with its procs, and answer once the connections that never authenticated are dropped.

    Invariant protocol.3 (docs/architecture/02-protocol.md).
    """
    import resource
    import socket

    from xmesh import _core

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir, XMESH_HANDSHAKE_MS="2000")
    keep = subprocess.Popen([PYTHON, "-c", "from xmesh import this_host; import time; "
                             "pm = this_host().spawn_procs({'gpus': 2}, name='survivor'); pm.initialized.get(30); "
                             "print('UP', flush=True); time.sleep(300)"], env=env, preexec_fn=low_limit,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert keep.stdout.readline().strip() == "UP"
        agent = int(open(os.path.join(fresh_rundir, "hostd.pid")).read())
        flood = []
        for _ in range(400):
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            try:
                s.connect(_core.layout_hostd_socket(fresh_rundir))
            except OSError:
                pass
            flood.append(s)
        # a new controller now: the agent needs fds to answer it
        subprocess.run([PYTHON, "-m", "xmesh.cli", "status", "--runtime-dir", fresh_rundir], capture_output=True,
                       timeout=60, env=env)
        assert pid_alive(agent)
        for s in flood:
            s.close()
        r = subprocess.run([PYTHON, "-m", "xmesh.cli", "status", "--runtime-dir", fresh_rundir],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0 and "survivor" in r.stdout and "2/2 procs alive" in r.stdout, r
        assert pid_alive(agent)
    finally:
        keep.kill()
        keep.wait()
        subprocess.run([PYTHON, "-m", "xmesh.cli", "stop", "survivor", "--runtime-dir", fresh_rundir],
                       capture_output=True, timeout=60, env=env)
