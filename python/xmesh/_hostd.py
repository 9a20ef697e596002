"""Finding, starting and talking to host agents (xmesh-hostd) from a controller."""
import os
import shutil
import signal
import threading
import time
from typing import Any, Optional

from . import _core
from ._pids import pid_alive, running_agent_pid
from ._protocol import ErrorKind, error, error_kind, read_error
from ._runtime import Kind, get_runtime, on_controller_exit
from ._wait import request

_agents: dict[str, "HostAgent"] = {}
_agents_lock = threading.Lock()


def _forget_agents_in_child():
    global _agents_lock
    _agents.clear()  # connections belong to the parent's node
    _agents_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_agents_in_child)


def hostd_executable():
    exe = os.environ.get("XMESH_HOSTD")
    if exe:
        return exe
    try:
        from ._paths import HOSTD

        if os.path.exists(HOSTD):
            return HOSTD
    except ImportError:
        pass
    found = shutil.which("xmesh-hostd")
    if not found:
        raise RuntimeError("xmesh-hostd not found: run scripts/setup.sh (it installs it on PATH) or set XMESH_HOSTD")
    return found


def _has_children(pid):
    """Whether a process has children (a host agent's children are its procs)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        return True
            except (OSError, ValueError, IndexError):
                continue
    return False


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


class HostdError(RuntimeError):
    """The host agent refused a request; body is its reply (kind, text, ...)."""

    def __init__(self, text, body):
        super().__init__(text)
        self.body = body


class HostAgent:
    """A controller's handle on one xmesh-hostd, identified by its runtime directory."""

    def __init__(self, runtime_dir):
        self.runtime_dir = runtime_dir
        self.addr = "ipc://" + _core.layout_hostd_socket(runtime_dir)
        self.host = None
        self.pid = None
        self._connected = False

    def _running_pid(self):
        return running_agent_pid(self.runtime_dir)

    def _start(self, timeout):
        env = dict(os.environ)
        env["XMESH_RUNTIME_DIR"] = self.runtime_dir
        exe = hostd_executable()
        launcher = _core.spawn_detached([exe, "--daemon", "--runtime-dir", self.runtime_dir], env)
        deadline = time.monotonic() + timeout
        status = 0
        try:
            # The launcher exits as soon as the daemon has forked away: reap it (no zombie).
            status = os.waitpid(launcher, 0)[1]
        except ChildProcessError:
            pass
        log_path = _core.layout_hostd_log(self.runtime_dir)
        if status != 0:  # it could not even start (it says why at the end of its log)
            log = _read(log_path)
            raise RuntimeError(f"the host agent for {self.runtime_dir} failed to start "
                               f"(exit status {os.waitstatus_to_exitcode(status)})"
                               + (f"; its log ends with:\n{log[-2000:]}" if log else ""))
        sock = _core.layout_hostd_socket(self.runtime_dir)
        while time.monotonic() < deadline:
            if self._running_pid() and os.path.exists(sock) and len(_read(_core.layout_cookie_file(self.runtime_dir))) >= 32:
                return
            time.sleep(0.01)
        log = _read(log_path)
        raise RuntimeError(f"the host agent for {self.runtime_dir} did not start within {timeout:.0f} s"
                           + (f"; its log ends with:\n{log[-2000:]}" if log else ""))

    def connect(self, timeout=15.0):
        rt = get_runtime()
        if self._connected:
            if rt.node.dead_reason(self.addr) is None:
                running = self._running_pid()
                if running == self.pid:
                    return self
                # Stopped (`xmesh shutdown`), killed or replaced since we last talked: say so
                # now rather than when its heartbeats time out, and talk to its successor
                # over a new connection (the old one's Hello went to the old agent).
                rt.node.lose_host(self.addr, f"host agent {self.pid} at {self.addr} is gone"
                                             + (f" (agent {running} runs there now)" if running else ""))
            # The agent was lost (killed, its machine rebooted): whatever it ran is gone with it
            # (its meshes say so), and new work goes to a new agent in the same directory.
            self._connected = False
            rt.node.unwatch_host(self.addr)
            rt.node.revive(self.addr)
        try:
            _core.ensure_private_dir(self.runtime_dir)  # the same check as the default directory's
        except ValueError as e:
            raise PermissionError(str(e)) from None
        if self._running_pid() is None:
            self._start(timeout)
        cookie = _read(_core.layout_cookie_file(self.runtime_dir))
        rt.node.set_peer_cookie(self.addr, cookie)
        try:
            status = self.status(timeout=timeout)
        except HostdError as e:
            if error_kind(e.body) != ErrorKind.Refused:  # the agent refused this node's Hello
                raise
            pid = self._running_pid()
            if pid is None or _has_children(pid):
                raise RuntimeError(f"{e}; `xmesh shutdown --runtime-dir {self.runtime_dir}` stops that host agent "
                                   "and its procs") from None
            # An agent of another protocol version that owns no procs: replace it.
            os.kill(pid, signal.SIGTERM)
            self._wait_gone(pid, timeout)
            rt = get_runtime()
            rt.node.revive(self.addr)
            self._start(timeout)
            status = self.status(timeout=timeout)
        if status.build != _core.build_id() and not status.allocations:
            # An idle agent from another build of xmesh: replace it, so that procs always run the
            # code installed now.
            self._replace(status.pid, timeout)
            status = self.status(timeout=timeout)
        self.host = status.host
        self.pid = status.pid
        # An agent on this machine is watched by its process too: its end is noticed at once,
        # and a stopped or busy agent is not lost for being silent.
        rt.node.watch_host(self.addr, status.pid if self.addr.startswith("ipc://") else 0)
        self._connected = True
        return self

    def _replace(self, pid, timeout):
        rt = get_runtime()
        try:
            rt.node.send(self.addr, int(Kind.Shutdown), {})
        except Exception:
            pass
        self._wait_gone(pid, timeout)
        # The connection to the old agent said Hello to it, not to its successor at the same
        # address (which drops whatever an unauthenticated peer sends): start a new one.
        rt.node.mark_dead(self.addr, error(ErrorKind.Supervision, "the host agent was replaced"))
        rt.node.revive(self.addr)
        self._start(timeout)

    @staticmethod
    def _wait_gone(pid, timeout):
        deadline = time.monotonic() + timeout
        while pid and pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def request(self, kind: "_core.Kind", body: Any, timeout: float = 15.0) -> dict:
        """Sends one request (body: a typed body of xmesh._core, or {}) and returns the reply
        body; raises HostdError (carrying the error body) or RuntimeError naming the problem."""
        answers = request(get_runtime().node, [self.addr], kind, body, timeout=timeout,
                          description=f"{Kind(kind).name} request to the host agent")
        if not answers:
            raise RuntimeError(f"the host agent at {self.addr} did not answer a "
                               f"{Kind(kind).name} request within {timeout:.0f} s")
        ok, reply, _ = answers[0]
        if not ok:
            raise HostdError(read_error(reply).text or "the host agent refused the request", reply)
        return reply

    # The agent's requests, each with its typed body and reply (runtime/bodies.hpp).
    def status(self, timeout: float = 15.0) -> "_core.StatusReply":
        return _core.StatusReply.from_dict(self.request(Kind.Status, {}, timeout=timeout))

    def spawn_procs(self, body: "_core.SpawnProcsBody", timeout: Optional[float] = None) -> "_core.SpawnProcsReply":
        # Starting a proc takes the agent longer the more it already started (they compete for
        # the cores): the default allows half a second each beyond 30 s. An agent that dies
        # meanwhile fails the request at once (it is watched by its process).
        if timeout is None:
            timeout = 30.0 + 0.5 * len(body.ranks)
        return _core.SpawnProcsReply.from_dict(self.request(Kind.SpawnProcs, body, timeout=timeout))

    def stop_procs(self, *, alloc: str = "", name: str = "", immediately: bool = False,
                   timeout: float = 15.0) -> "_core.StopProcsReply":
        body = _core.StopProcsBody(alloc=alloc, name=name, immediately=immediately)
        return _core.StopProcsReply.from_dict(self.request(Kind.StopProcs, body, timeout=timeout))

    def attach(self, name: str, *, observe: bool = False) -> "_core.AttachReply":
        """Takes over the live allocation `name` (observe: only learns how to reach its procs)."""
        body = _core.AttachBody(name=name, controller_pid=os.getpid(), observe=observe)
        return _core.AttachReply.from_dict(self.request(Kind.Attach, body))

    def goodbye(self):
        if not self._connected:
            return
        rt = get_runtime()
        try:
            rt.node.send(self.addr, int(Kind.Goodbye), {})
        except Exception:
            pass
        rt.node.unwatch_host(self.addr)


def agent(runtime_dir=None):
    """The connected host agent for a runtime directory (default: this user's)."""
    runtime_dir = os.path.abspath(runtime_dir or _core.runtime_dir())
    with _agents_lock:
        a = _agents.get(runtime_dir)
        if a is None:
            a = _agents[runtime_dir] = HostAgent(runtime_dir)
    return a.connect()


def connected_agents():
    with _agents_lock:
        return [a for a in _agents.values() if a._connected]


def _say_goodbye(rt):
    """At a controller's exit: its agents stop its unnamed allocations now."""
    for a in connected_agents():
        a.goodbye()


on_controller_exit(_say_goodbye)
