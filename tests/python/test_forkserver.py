"""The host agent's fork server (issue 23, xmesh/_proc/forkserver.py, runtime/hostd/fork_server.*):
procs of the worker's command line are forked from a Python that imported xmesh once. Each is
the agent's child (reparented: a subreaper), with its own process group, directory, environment
(XMESH_* read after the fork) and pipes, fully independent of the server (no shared sockets or
threads); a server killed is replaced without failing a spawn; an agent with forked procs is not
taken for idle; XMESH_FORK_SERVER=0 starts procs the usual way; no module reads an XMESH_*
setting at import (it would keep the fork server's value)."""
import ast
import os
import subprocess

from xmesh_testing import PYTHON, package_modules, wait_until

import xmesh
from xmesh import _core



def _stat(pid: int) -> list:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


class Probe(xmesh.Actor):
    @xmesh.endpoint
    def facts(self) -> dict:
        import sys
        import threading

        return {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
                "rank": os.environ["XMESH_RANK"], "marker": os.environ.get("FORKSERVER_TEST_MARKER"),
                "argv": sys.argv, "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
                "threads": [t.name for t in threading.enumerate()]}


def test_procs_are_forked_by_the_fork_server_and_independent_of_it():
    os.environ["FORKSERVER_TEST_MARKER"] = "first"
    try:
        procs = xmesh.this_host().spawn_procs({"gpus": 3})
        facts = list(procs.spawn("probe", Probe).facts.call().get(timeout=60).values())
    finally:
        os.environ.pop("FORKSERVER_TEST_MARKER")
    try:
        agent = facts[0]["ppid"]
        assert "xmesh-hostd" in _cmdline(agent)
        servers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _safe_ppid(int(p)) == agent
                   and _cmdline(int(p)).endswith("-m xmesh._proc.worker --fork-server") and int(p) not in
                   {f["pid"] for f in facts}]
        assert len(servers) == 1, servers
        # The server never runs a thread besides its main one: a fork copies only the caller.
        assert len(os.listdir(f"/proc/{servers[0]}/task")) == 1
        for rank, f in enumerate(facts):
            assert f["ppid"] == agent, f  # the agent's own child: it waits for it and sees it exit
            assert f["pgid"] == f["pid"] and f["rank"] == str(rank) and f["marker"] == "first", f
            assert f["cwd"] == os.getcwd() and f["argv"][0].endswith("xmesh/_proc/worker.py") and len(f["argv"]) == 1, f
            # Nothing of the server's: its socket (fd 3) is closed; only the proc's own files.
            assert all(os.readlink(f"/proc/{f['pid']}/fd/{fd}") != os.readlink(f"/proc/{servers[0]}/fd/3")
                       for fd in f["fds"] if os.path.exists(f"/proc/{f['pid']}/fd/{fd}")), f
        # Killed, a forked proc is reported as any other.
        os.kill(facts[1]["pid"], 9)
        wait_until(lambda: 1 in procs._alloc.exited, 20)
    finally:
        procs.stop()


def _fork_servers(agent: int) -> list:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _safe_ppid(int(p)) == agent
            and _cmdline(int(p)).endswith("-m xmesh._proc.worker --fork-server")]


def test_a_fork_server_that_died_is_replaced_and_no_spawn_fails():
    procs = xmesh.this_host().spawn_procs({"gpus": 2})
    procs.initialized.get(timeout=60)
    agent = _safe_ppid(procs.pids[0])
    servers = [p for p in _fork_servers(agent) if p not in procs.pids]
    assert servers
    for server in servers:  # (other tests' spawns may have started others: all go)
        os.kill(server, 9)
    wait_until(lambda: all(not os.path.exists(f"/proc/{s}") or _stat(s)[0] == "Z" for s in servers), 10)
    try:
        more = xmesh.this_host().spawn_procs({"gpus": 3})  # the first is started the usual way
        more.initialized.get(timeout=60)
        assert all(_safe_ppid(p) == agent for p in more.pids)
        with open(_core.layout_hostd_log(_core.runtime_dir())) as f:
            assert "starting procs without the fork server: " in f.read()
        assert set(_fork_servers(agent)) - set(more.pids + procs.pids) - set(servers)  # a new one serves
        more.stop()
    finally:
        procs.stop()


def test_a_stopped_fork_server_is_named_as_such_and_no_spawn_waits_for_it():
    """Issue 41, finding 8: a fork server stopped by a SIGSTOP held the spawn for the whole
    10 s and the agent's log said only that it did not answer. Now it is looked at while the
    agent waits: stopped, it is said so at once and the procs start from their command line."""
    import signal

    procs = xmesh.this_host().spawn_procs({"gpus": 1})
    procs.initialized.get(timeout=60)
    agent = _safe_ppid(procs.pids[0])
    servers = [p for p in _fork_servers(agent) if p not in procs.pids]
    assert servers
    for server in servers:
        os.kill(server, signal.SIGSTOP)
    try:
        more = xmesh.this_host().spawn_procs({"gpus": 2})
        more.initialized.get(timeout=60)
        with open(_core.layout_hostd_log(_core.runtime_dir())) as f:
            log = f.read()
        assert any(f"the fork server (pid {s}) is stopped (SIGSTOP?): it cannot answer" in log for s in servers), \
            log[-2000:]
        assert "did not answer within 10 s" not in log
        more.stop()
    finally:
        for server in servers:
            try:
                os.kill(server, signal.SIGCONT)
            except ProcessLookupError:
                pass
        procs.stop()


def _safe_ppid(pid: int) -> int:
    try:
        return int(_stat(pid)[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_fork_server_zero_starts_procs_from_their_command_line(fresh_rundir):
    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir, XMESH_FORK_SERVER="0")
    code = ("import os, xmesh\n"
            "p = xmesh.this_host().spawn_procs({'gpus': 2})\n"
            "p.initialized.get(timeout=60)\n"
            "print([open(f'/proc/{pid}/cmdline').read().split(chr(0))[1:3] for pid in p.pids])\n"
            "p.stop()\n")
    r = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[['-m', 'xmesh._proc.worker'], ['-m', 'xmesh._proc.worker']]", r.stdout


def _module_level_env_reads(path: str) -> list:
    """Calls at a module's top level (run at import) that read the environment."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = []
    statements = list(tree.body)
    while statements:
        stmt = statements.pop()
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(stmt, ast.ClassDef):  # its body runs at import too, its methods do not
            statements += stmt.body
            continue
        for node in ast.walk(stmt):
            text = ast.unparse(node) if isinstance(node, ast.Call) else ""
            if text.startswith(("env_float(", "os.environ.get(", "os.getenv(")):
                found.append(f"{os.path.relpath(path, os.path.dirname(xmesh.__file__))}:{node.lineno}: {text}")
    return found


def test_no_module_reads_an_xmesh_setting_at_import():
    reads = [r for path in package_modules().values() for r in _module_level_env_reads(path)]
    assert reads == [], "read these when used (a forked proc's environment is set after imports): " + repr(reads)


def test_an_agent_with_forked_procs_is_not_taken_for_idle():
    """A controller replaces an idle agent that refuses it; an agent whose only children are
    forked procs (the fork server's command line) is not idle, one with only fork servers is."""
    from xmesh._runtime.agents import _has_children, _is_fork_server

    procs = xmesh.this_host().spawn_procs({"gpus": 1})
    try:
        procs.initialized.get(timeout=60)
        agent = _safe_ppid(procs.pids[0])
        assert _has_children(agent)
        assert not _is_fork_server(procs.pids[0])
        servers = [p for p in _fork_servers(agent) if p not in procs.pids]
        assert servers and all(_is_fork_server(p) for p in servers)
    finally:
        procs.stop()
