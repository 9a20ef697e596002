"""Finding, starting and talking to host agents (xmesh-hostd) from a controller."""
import os
import platform
import re
import shutil
import signal
import socket
import threading
import time
from typing import Any, Callable, Optional

from .. import _core
from .._base.env import env_seconds_from_ms
from .._base.pids import pid_alive, running_agent_pid
from .._base.protocol import ErrorKind, error, error_kind, read_error
from .process import Kind, get_runtime, interpreter, on_controller_exit
from .wait import Request, request

_agents: dict[str, "AgentClient"] = {}
_agents_lock = threading.Lock()


def _forget_agents_in_child():
    global _agents_lock, _cluster_key
    _cluster_key = None
    _agents.clear()  # connections belong to the parent's node
    _agents_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_agents_in_child)


def hostd_executable():
    exe = os.environ.get("XMESH_HOSTD")
    if exe:
        return exe
    try:
        from .._base.paths import HOSTD

        if os.path.exists(HOSTD):
            return HOSTD
    except ImportError:
        pass
    found = shutil.which("xmesh-hostd")
    if not found:
        raise RuntimeError("xmesh-hostd not found: run scripts/setup.sh (it installs it on PATH) or set XMESH_HOSTD")
    return found


def hostd_environment() -> dict:
    """What a host agent started from this Python learns of it (HostAgentOptions::python): the
    interpreter its procs are to run, and its version, which it reports to controllers."""
    return {"XMESH_PYTHON": interpreter(), "XMESH_PYTHON_VERSION": platform.python_version()}


def check_agent_match(status: Any, where: str, python: bool = True) -> None:
    """Refuses, naming both sides, an agent whose xmesh or (with python) Python differs from
    this controller's: its procs would run other code, or could not unpickle what this
    controller sends (cloudpickled functions and classes carry bytecode of one Python version).
    An agent on this machine runs procs with this controller's interpreter: its own does not count."""
    if status.version and status.version != _core.version():
        raise RuntimeError(f"{where} runs xmesh {status.version}, this controller xmesh {_core.version()}: "
                           f"install the same version on both")
    theirs, ours = status.python_version, platform.python_version()
    if python and theirs and theirs.split(".")[:2] != ours.split(".")[:2]:
        raise RuntimeError(f"{where} runs Python {theirs} ({status.python}), this controller Python {ours} "
                           f"({interpreter()}): functions and classes pickled by one Python version cannot be "
                           f"loaded by another; run both in environments of the same Python version")


def _has_children(pid):
    """Whether a host agent has procs: children other than its fork servers."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) != pid:
                        continue
                if not _is_fork_server(int(entry)):
                    return True
            except (OSError, ValueError, IndexError):
                continue
    return False


# A host agent's fork server's /proc/PID/comm (_forkserver sets it; its procs share its command
# line, not this name).
FORK_SERVER_NAME = b"xmesh-forksrv"


def _is_fork_server(pid):
    with open(f"/proc/{pid}/comm", "rb") as f:
        return f.read().strip() == FORK_SERVER_NAME


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


class AgentClient:
    """A controller's handle on one xmesh-hostd, identified by its runtime directory (the agent
    itself is the C++ HostAgent, runtime/hostd/host_agent.hpp)."""

    over_tcp = False  # an agent elsewhere (TcpAgentClient): it chooses its procs' addresses
    # The interpreter its procs run and its version: the environment's the agent was installed
    # in, when it says so (an agent on another machine); "" for this controller's own.
    python = ""
    python_version = ""

    def __init__(self, runtime_dir):
        self.runtime_dir = runtime_dir
        self.addr = "ipc://" + _core.layout_hostd_socket(runtime_dir)
        self.host = None
        self.pid = None
        self._connected = False

    def _running_pid(self):
        return running_agent_pid(self.runtime_dir)

    def _start(self, timeout):
        env = dict(os.environ, **hostd_environment())
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
        if agent_serving(self.runtime_dir, max(0.0, deadline - time.monotonic())):
            return
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
            self._forget_lost(rt)
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
        try:
            check_agent_match(status, f"the host agent for {self.runtime_dir} (pid {status.pid})", python=False)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; `xmesh shutdown --runtime-dir {self.runtime_dir}` stops that host agent "
                               "and its procs") from None
        self.host = status.host
        self.pid = status.pid
        # An agent on this machine is watched by its process too: its end is noticed at once,
        # and a stopped or busy agent is not lost for being silent.
        rt.node.watch_host(self.addr, status.pid if self.addr.startswith("ipc://") else 0)
        self._connected = True
        return self

    def _forget_lost(self, rt: Any) -> None:
        """After this agent was lost: new work goes to whatever agent serves its address now,
        over a new connection."""
        self._connected = False
        rt.node.unwatch_host(self.addr)
        rt.node.revive(self.addr)

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
                          description=f"{kind.name} request to the host agent")
        if not answers:
            raise RuntimeError(f"the host agent at {self.addr} did not answer a "
                               f"{kind.name} request within {timeout:.0f} s")
        ok, reply, _ = answers[0]
        if not ok:
            raise HostdError(read_error(reply).text or "the host agent refused the request", reply)
        return reply

    # The agent's requests, each with its typed body and reply (runtime/protocol/bodies.hpp).
    def status(self, timeout: float = 15.0) -> "_core.StatusReply":
        return _core.StatusReply.from_dict(self.request(Kind.Status, {}, timeout=timeout))

    def log_losses(self, alloc: str, ranks: Optional[set] = None, timeout: float = 15.0) -> list:
        """What this agent's log files of allocation `alloc` lack (a full disk), in words, per rank
        (only `ranks`, when given): those lines were shown but could not be kept."""
        out = []
        for st in self.status(timeout=timeout).allocations:
            if st.alloc == alloc:
                out += [f"rank {p.rank}'s log file lacks {_core.format_bytes(p.log_lost_bytes)} of its output "
                        f"({p.log_error}): those lines were shown but could not be kept"
                        for p in st.procs if p.log_lost_bytes and (ranks is None or p.rank in ranks)]
        return out

    def spawn_procs(self, body: "_core.SpawnProcsBody", timeout: Optional[float] = None) -> "_core.SpawnProcsReply":
        # Starting a proc takes the agent longer the more it already started (they compete for
        # the cores): the default allows half a second each beyond 30 s. An agent that dies
        # meanwhile fails the request at once (it is watched by its process).
        if timeout is None:
            timeout = 30.0 + 0.5 * len(body.ranks)
        return _core.SpawnProcsReply.from_dict(self.request(Kind.SpawnProcs, body, timeout=timeout))

    def stop_procs(self, *, alloc: str = "", name: str = "", immediately: bool = False,
                   timeout: float = 15.0, by: str = "") -> "_core.StopProcsReply":
        """Stops an allocation by id or name; by: who asks, when not its controller (its procs'
        exits then say "was stopped: by ..." to their controller)."""
        body = _core.StopProcsBody(alloc=alloc, name=name, immediately=immediately, by=by)
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
            # Not waiting: an agent gone (or a link down) must not hold this exit for the send
            # timeout; an agent that misses it learns of the exit from its heartbeats.
            rt.node.send(self.addr, int(Kind.Goodbye), {}, wait=False)
        except Exception:
            pass
        rt.node.unwatch_host(self.addr)


class TcpAgentClient(AgentClient):
    """A host agent on another machine, `xmesh-hostd --listen tcp://ADDR:PORT --key-file F`
    there, reached over TCP with the cluster's key (CURVE). Its locator, "tcp://host:port", stands
    where a local agent's runtime directory does (`runtime_dir`). Connecting starts when it is
    made (`begin_connect`: the Status request goes out) and is waited for on first use."""

    over_tcp = True

    def __init__(self, locator: str, key_file: str) -> None:
        self.runtime_dir = locator
        self.addr = locator
        self.key_file = key_file
        self.host = None
        self.pid = None
        self._connected = False
        self._pending: Optional[Request] = None
        self._asked_back = False  # its pending request went out with this controller reached back

    def begin_connect(self) -> None:
        if self._connected or self._pending is not None:
            return
        rt = get_runtime()
        use_cluster_key(self.key_file, self.addr)
        rt.node.set_peer_cookie(self.addr, _core.key_file_cluster_cookie(self.key_file))
        rt.node.expect_listening(self.addr)  # nothing listening there is said at once, not waited out
        self._asked_back = rt.node.reaches_back
        self._pending = Request(rt.node, [self.addr], Kind.Status)

    def log_reader(self, log_dir: str) -> Callable[[str, int, int], tuple[int, Any]]:
        """The read function of an AgentLogDir for one of this agent's log directories (the files
        stay on its host): (file, offset, max_bytes) -> (the file's size, its bytes from offset),
        or for file "" (0, {name: size}), through ReadLog requests."""
        def read(file: str, offset: int, max_bytes: int) -> tuple[int, Any]:
            body = _core.ReadLogBody(dir=log_dir, file=file, offset=offset, max_bytes=max(1, max_bytes))
            answers = request(get_runtime().node, [self.addr], Kind.ReadLog, body, timeout=30.0,
                              description=f"reading logs/{log_dir}/{file} on {self.host}")
            if not answers:
                raise RuntimeError(f"the host agent at {self.addr} did not answer a log read within 30 s")
            ok, reply, frames = answers[0]
            if not ok:
                raise HostdError(read_error(reply).text or "the host agent refused the log read", reply)
            got = _core.ReadLogReply.from_dict(reply)
            if not file:
                return 0, {f.name: f.size for f in got.files}
            return got.size, b"".join(bytes(f) for f in frames)

        return read

    def _pending_status(self) -> Optional[Request]:
        """The Status request to wait for, or None when connected (a lost agent: reconnects)."""
        rt = get_runtime()
        if self._connected:
            if rt.node.dead_reason(self.addr) is None:
                return None
            self._forget_lost(rt)  # its agent killed, its machine or link gone
        self.begin_connect()
        pending, self._pending = self._pending, None
        if pending is not None and rt.node.reaches_back and not self._asked_back:
            # Asked before this controller began reaching its nodes back (another agent's answer
            # could not come back): asked again on a connection whose Hello says so.
            pending.forget()
            rt.node.reconnect(self.addr)
            pending = self._status_request()
        return pending

    def connect(self, timeout: float = 15.0) -> "TcpAgentClient":
        pending = self._pending_status()
        if pending is not None:
            what = f"connecting to the host agent at {self.addr}"
            first = probe_time(timeout)
            answers = pending.answers(first, what)
            if not answers and first < timeout and self._reach_back_now():
                answers = self._status_request().answers(timeout - first, what)
            self._connected_by(answers, timeout)
        return self

    async def connect_async(self, timeout: float = 15.0) -> "TcpAgentClient":
        pending = self._pending_status()
        if pending is not None:
            what = f"connecting to the host agent at {self.addr}"
            first = probe_time(timeout)
            answers = await pending.answers_async(first, what)
            if not answers and first < timeout and self._reach_back_now():
                answers = await self._status_request().answers_async(timeout - first, what)
            self._connected_by(answers, timeout)
        return self

    def _status_request(self) -> Request:
        self._pending = None
        self.begin_connect()
        pending, self._pending = self._pending, None
        assert pending is not None
        return pending

    def _reach_back_now(self) -> bool:
        """In the automatic mode, when the agent received the request but its answer could not
        come back (it cannot connect to this controller): from now on this controller reaches
        its nodes through connections it opens, and the agent hears so on a new connection.
        Whether it switched."""
        node = get_runtime().node
        if controller_reach() != "auto" or ALL_ACKNOWLEDGED not in node.link_report(self.addr):
            return False
        if not node.reaches_back:  # else another agent found it first: this one was asked before
            node.set_reach_back(True)
            get_runtime().diag(f"the host agent at {self.addr} cannot connect to this controller at {node.tcp_addr}: "
                               "it is reached through connections this controller opens (reach='outbound'; "
                               "XMESH_CONTROLLER_REACH=outbound skips this probe)")
        node.reconnect(self.addr)
        return True

    def _connected_by(self, answers: dict, timeout: float) -> None:
        if not answers:
            raise ConnectionError(unanswered(self.addr, timeout, get_runtime().node))
        ok, reply, _ = answers[0]
        if not ok:
            raise HostdError(f"cannot use the host agent at {self.addr}: "
                             f"{read_error(reply).text or 'it refused this controller'}", reply)
        status = _core.StatusReply.from_dict(reply)
        check_agent_match(status, f"the host agent at {self.addr} ({status.host})")
        self.host = status.host
        self.pid = status.pid
        self.python, self.python_version = status.python, status.python_version
        get_runtime().node.watch_host(self.addr, 0, self.host)  # elsewhere: lost when its heartbeats stop
        self._connected = True


_TCP_LOCATOR = re.compile(r"^(?:tcp://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def agent_serving(runtime_dir: str, timeout: float) -> bool:
    """Waits at most timeout seconds until a host agent serves runtime_dir (its process runs,
    its socket and its cookie are there); whether one does."""
    sock = _core.layout_hostd_socket(runtime_dir)
    deadline = time.monotonic() + timeout
    while True:
        if (running_agent_pid(runtime_dir) and os.path.exists(sock)
                and len(_read(_core.layout_cookie_file(runtime_dir))) >= 32):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def tcp_locator(text: str) -> Optional[str]:
    """"tcp://host:port" for a host agent named "host:port" or "tcp://host:port"; None for
    anything else (a runtime directory)."""
    m = _TCP_LOCATOR.match(text)
    if m is None or (not text.startswith("tcp://") and os.path.isdir(text)):
        return None
    if not 0 < int(m.group(2)) < 65536:
        raise ValueError(f"{text!r}: the port must be 1-65535")
    return f"tcp://{m.group(1)}:{int(m.group(2))}"


def unanswered(addr: str, timeout: float, node: Any) -> str:
    """Why an agent over TCP did not answer, naming the direction that failed: it received the
    request (the link's acknowledgements say so) but its answer could not come back (it cannot
    connect to this controller), or the request did not reach it."""
    link = node.link_report(addr)
    if ALL_ACKNOWLEDGED in link:
        return (f"the host agent at {addr} received this controller's request but its answer did not come back "
                f"within {timeout:.0f} s ({link}): that host cannot connect to this controller at "
                f"{node.tcp_addr or '(no TCP address)'} (a NAT, a firewall or a port forward between them?). "
                "Make that address reachable from the nodes (XMESH_CONTROLLER_HOST names the address to listen "
                "on, XMESH_CONTROLLER_PORT fixes the port, e.g. for `ssh -R`)")
    return (f"the host agent at {addr} did not answer within {timeout:.0f} s ({link}): is `xmesh-hostd --listen "
            f"... --key-file ...` running there, and reachable from here?")


ALL_ACKNOWLEDGED = "every message sent to it was acknowledged"  # runtime/transport: Transport::kAllAcknowledged

_cluster_key: Optional[tuple[str, str]] = None  # (path, public key) of the key this controller's TCP address uses


def local_ip_towards(locator: str) -> str:
    """The address of this machine's interface that routes to the host at locator (no packet
    is sent: a UDP socket's connect only picks the route)."""
    host, port = locator[len("tcp://"):].rsplit(":", 1)
    host = host.strip("[]")
    try:  # a name may resolve to IPv4, IPv6 or both: the first address with a route wins
        found = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)
    except OSError as e:
        raise ConnectionError(f"cannot resolve the host of {locator}: {e}") from None
    errors = []
    for family, kind, proto, _, sockaddr in found:
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(sockaddr)
                return s.getsockname()[0]
        except OSError as e:
            errors.append(f"{sockaddr[0]}: {e}")
    raise ConnectionError(f"no route from this machine to {locator} ({'; '.join(errors)})")


def controller_port() -> str:
    """The TCP port this controller listens on: XMESH_CONTROLLER_PORT (a port a forward or a
    firewall rule was made for), else "*" (any free one)."""
    text = os.environ.get("XMESH_CONTROLLER_PORT", "").strip()
    if not text:
        return "*"
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"XMESH_CONTROLLER_PORT={text!r} is not a port (1-65535)")
    return str(int(text))


def use_cluster_key(key_file: str, first_host: str) -> None:
    """Makes this controller reachable over TCP with the cluster's key (once): it listens on the
    interface that routes to first_host (XMESH_CONTROLLER_HOST overrides), any free port, so
    that remote agents and procs answer over TCP. One cluster key per controller."""
    global _cluster_key
    key_file = os.path.abspath(key_file)
    public = _core.key_file_public_key(key_file)  # KeyFileError naming what is wrong with it
    if _cluster_key is not None:
        if _cluster_key[1] != public:
            raise ValueError(f"this controller already uses the cluster key {_cluster_key[0]}; {key_file} is "
                             "another (one cluster key per controller)")
        return
    rt = get_runtime()
    host = os.environ.get("XMESH_CONTROLLER_HOST") or local_ip_towards(first_host)
    host = f"[{host}]" if ":" in host else host
    port = controller_port()
    try:
        rt.node.listen_tcp(f"tcp://{host}:{port}", key_file)
    except RuntimeError as e:
        if port == "*":
            raise
        raise RuntimeError(f"cannot listen on {host}:{port} (XMESH_CONTROLLER_PORT): {e}") from None
    _cluster_key = (key_file, public)
    if controller_reach() == "outbound":
        rt.node.set_reach_back(True)


def use_gateway(gateway: str, key_file: str, agents: list[str]) -> None:
    """Every connection this controller opens to the cluster goes through the host agent at
    gateway (tcp://host:port: the one port a controller outside the cluster reaches, e.g. through
    `ssh -L 7000:node1:7000`), which is told to let it through to these agents' ports."""
    rt = get_runtime()
    use_cluster_key(key_file, gateway)
    # From now on (this request included) connections go through this gateway, not one used
    # before (a port forward that ended with its job): the gateway itself is dialled directly.
    rt.node.set_gateway(gateway[len("tcp://"):])
    for a in agents:  # used again after a release (a job killed): heard again, the gateway's answer included
        rt.host_in_use(a)
        rt.node.revive(a)
    rt.node.set_peer_cookie(gateway, _core.key_file_cluster_cookie(key_file))
    rt.node.expect_listening(gateway)
    body = _core.GatewayBody(agents=[a[len("tcp://"):] for a in agents])
    answers = request(rt.node, [gateway], Kind.Gateway, body, timeout=15.0,
                      description=f"asking the host agent at {gateway} to be this controller's gateway")
    if not answers:
        raise ConnectionError(unanswered(gateway, 15.0, rt.node))
    ok, reply, _ = answers[0]
    if not ok:
        raise HostdError(f"the host agent at {gateway} cannot be this controller's gateway: "
                         f"{read_error(reply).text or 'it refused'}", reply)


REACH_MODES = ("auto", "inbound", "outbound")
_reach: Optional[str] = None  # set by hosts(reach=...); else XMESH_CONTROLLER_REACH, else "auto"


def controller_reach() -> str:
    """How the nodes reach this controller: "inbound" (they connect to its TCP address),
    "outbound" (only through connections it opens to their agents' ports: a controller behind a
    NAT or a port forward) or "auto" (inbound, switching to outbound when an agent's answer
    cannot come back)."""
    if _reach is not None:
        return _reach
    text = os.environ.get("XMESH_CONTROLLER_REACH", "").strip() or "auto"
    if text not in REACH_MODES:
        raise ValueError(f"XMESH_CONTROLLER_REACH={text!r}: use one of {', '.join(REACH_MODES)}")
    return text


def set_controller_reach(mode: str) -> None:
    """hosts(reach=mode): for this controller from now on (agents connected before keep theirs)."""
    global _reach
    if mode not in REACH_MODES:
        raise ValueError(f"reach={mode!r}: use one of {', '.join(REACH_MODES)}")
    _reach = mode
    if _cluster_key is not None and mode != "auto":
        get_runtime().node.set_reach_back(mode == "outbound")


def probe_time(timeout: float) -> float:
    """How long the automatic mode waits for an agent's first answer before it checks whether
    that answer cannot come back (XMESH_REACH_PROBE_MS, default 2000); the whole timeout when
    there is nothing to probe."""
    if controller_reach() != "auto" or get_runtime().node.reaches_back:
        return timeout
    return min(timeout, max(0.05, env_seconds_from_ms("XMESH_REACH_PROBE_MS", 2000)))


def agent_at(locator: str, key_file: Optional[str] = None) -> AgentClient:
    """The controller's handle on the agent at locator (a runtime directory or tcp://host:port),
    not yet connected; a TCP agent starts connecting now."""
    if not locator.startswith("tcp://"):
        locator = os.path.abspath(locator)
    with _agents_lock:
        a = _agents.get(locator)
        if a is None:
            if locator.startswith("tcp://"):
                if not key_file:
                    raise ValueError(f"the host agent at {locator} is reached over TCP: give the cluster's key file "
                                     "(hosts([...], key_file=...) or XMESH_KEY_FILE)")
                a = TcpAgentClient(locator, key_file)
            else:
                a = AgentClient(locator)
            _agents[locator] = a
            rt = get_runtime()
            rt.host_in_use(locator)  # a released address used again: its loss is news again
            # An agent let go (release_agent) left its address marked dead here; whatever serves
            # it now is another process, reached over a new connection.
            rt.node.revive(locator)
    if isinstance(a, TcpAgentClient):
        a.begin_connect()
    return a


def agent(runtime_dir=None):
    """The connected host agent for a runtime directory (default: this user's) or a locator
    tcp://host:port (a TCP agent must have been named by hosts([...], key_file=...) first)."""
    return agent_at(runtime_dir or _core.runtime_dir()).connect()


def release_agent(locator: str, why: str) -> None:
    """An agent let go on purpose (its job released): calls to its procs fail saying why, it is no
    longer watched (no heartbeat loss to report later) and the next use of its address connects
    anew."""
    if not locator.startswith("tcp://"):
        locator = os.path.abspath(locator)
    with _agents_lock:
        a = _agents.pop(locator, None)
    addr = a.addr if a is not None else locator  # an agent on this machine: its socket's address
    rt = get_runtime()
    rt.release_host(addr, why)
    rt.node.unwatch_host(addr)
    if a is not None:
        a._connected = False


def connected_agents():
    with _agents_lock:
        return [a for a in _agents.values() if a._connected]


def _say_goodbye(rt):
    """At a controller's exit: its agents stop its unnamed allocations now."""
    for a in connected_agents():
        a.goodbye()


on_controller_exit(_say_goodbye)
