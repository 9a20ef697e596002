"""The process-wide runtime: one `_core.Node` per process, plus the Python threads that
consume its control and log inboxes. In a controller it is created on first use; in a proc
by `_proc.worker`."""
import atexit
import json
import os
import signal
import sys
import threading
import time

from .. import _core
from .control import ControlTable
from .fault_reports import FaultReports
from .._base.env import env_float
from .._base.errors import MeshFailure
from .._base.paths import PYTHON
from .._base.threads import start_thread

Kind = _core.Kind


DEFAULT_PROC_LOG_LEVEL = 20  # logging.INFO, as Monarch's procs


def messages(inbox):
    """Yields an inbox's messages as they come (waiting without the GIL) until it is closed."""
    while True:
        msg = inbox.pop(timeout=None)
        if msg is not None:
            yield msg
        elif inbox.closed:
            return


class Runtime:
    def __init__(self, role, node, job_cookie):
        self.role = role
        self.node = node
        self.job_cookie = job_cookie
        self._print_lock = threading.Lock()
        self._allocs = {}  # alloc id -> Allocation with procs still running (controller)
        self._lock = threading.Lock()
        self._actor_host = None
        self._closed = False
        self.logs = None  # a controller's LogOutput (start_controller_threads)
        # Every cookie a proc of this controller may present: our own, and those of the named
        # allocations we attached (their procs keep the cookie they were started with). Every
        # proc we own accepts all of them, so any two can call each other.
        self.cookies = [job_cookie]
        self.control = ControlTable(node, role, self.diag)
        self._released_hosts = set()  # agents let go on purpose: their loss is no news
        self._fault_reports = FaultReports(self.diag)

    # -- threads ---------------------------------------------------------------------------
    def start_controller_threads(self):
        self.own_procs()
        self.control.on(Kind.Fault, self._on_fault)
        self.control.on(Kind.Refuse, lambda msg: self.diag(msg.refuse().reason or "a peer refused this controller"))
        for hook in _wiring.controller_start if _wiring.serves_tools else ():
            hook(self)
        start_thread(threading.Thread(target=self.control.serve, args=(self.node.control,), name="xmesh-control",
                                      daemon=True))

    def own_procs(self):
        """Lets this process own allocations: their procs' output and exits come to it. A
        controller does from the start; a proc from the first spawn_procs of one of its actors
        (the output of those procs goes out through its own, and they stop when it ends)."""
        from .._output.logs import LogOutput

        with self._lock:
            if self.logs is not None:
                return
            self.logs = LogOutput(self.node, _wiring.interactive, _wiring.output_sink)
        self.control.on(Kind.ProcExited, self._on_proc_exited)
        self.control.on(Kind.PeerDead, self._on_peer_dead)

    def ensure_actor_host(self):
        """Lets this process host actors (procs always; a controller for this_proc())."""
        with self._lock:
            if self._actor_host is None:
                if _wiring.actor_host_factory is None:
                    raise RuntimeError("this process cannot host actors: xmesh._proc.actor_host is not loaded "
                                       "(import xmesh)")
                self._actor_host = _wiring.actor_host_factory(self)
                self._actor_host.start()
        return self._actor_host

    # -- allocations (controller) ----------------------------------------------------------
    def register_alloc(self, alloc):
        with self._lock:
            self._allocs[alloc.id] = alloc
        # The log router labels its lines and knows its procs' addresses (flush barrier).
        self.logs.router.add_alloc(alloc.id, alloc.name, f"xmesh logs {alloc.name or alloc.id}")
        for rank, p in alloc.procs.items():
            if p.addr:  # else its agent chooses it (a TCP host): added once known
                self.logs.router.add_proc(alloc.id, rank, p.addr, p.host)

    def forget_alloc(self, alloc_id):
        with self._lock:
            self._allocs.pop(alloc_id, None)

    def owned_allocs(self):
        with self._lock:
            return list(self._allocs.values())

    def alloc(self, alloc_id):
        with self._lock:
            return self._allocs.get(alloc_id)

    def _on_proc_exited(self, msg):
        body = msg.proc_exited()
        alloc = self.alloc(body.alloc)
        if alloc is not None:
            alloc.on_proc_exited(body)

    def _on_fault(self, msg):
        """A failure of actors: to the actor of this process that owns them (its __supervise__),
        else to the unhandled fault hook (the program spawned them)."""
        body = msg.fault()
        host = self._actor_host
        delivered = host is not None and host.deliver_supervision(body)
        if msg.corr:  # the failed actor waits for this before it answers its caller
            self.node.reply(msg, True, {})
        if not delivered:
            self.unhandled_fault(failure_of_fault(body))

    def release_host(self, locator, why):
        """An agent let go on purpose (its job released): calls to its procs fail saying why,
        and its loss is not reported as a failure nobody waits for."""
        self._released_hosts.add(locator)
        self.node.lose_host(locator, why)

    def host_in_use(self, locator):
        self._released_hosts.discard(locator)

    def _on_peer_dead(self, msg):
        body = msg.peer_dead()
        if body.host_lost and body.addr not in self._released_hosts:
            text = body.error.get("text", f"the host agent at {body.addr} was lost")
            if self._host_runs_meshes(body.addr):
                self.unhandled_fault(MeshFailure(body.addr, text, "host"))
            else:  # no mesh of the program was there: nothing failed, but say it
                self.diag(text)

    def _host_runs_meshes(self, agent_addr):
        """Whether a live allocation of this controller has procs under the agent at agent_addr."""
        for alloc in self.owned_allocs():
            if not alloc.stopped and any(getattr(p.agent, "addr", None) == agent_addr for p in alloc.procs.values()):
                return True
        return False

    def _write(self, stream, text, cell=""):
        """Prints on the controller's stdout or stderr: through the log output (which knows
        which cell, in the kernel, a line belongs to) in a controller, directly in a proc."""
        if self.logs is not None:
            self.logs.local(cell, stream, text)
            return
        from .._output.logs import write_std

        with self._print_lock:
            write_std(2 if stream == "stderr" else 1, text)

    def unhandled_fault(self, failure: MeshFailure) -> None:
        """A failure nobody waits for (MeshFailure) goes to the hook the program installed
        (Monarch's unhandled_fault_hook, through the monarch shim) or, by default, is said in an
        [xmesh] line where it belongs (the ranks of one mesh that fail together, once:
        fault_reports.py); the program or notebook lives on. A hook that returns
        drops it; one that raises stops a script as Monarch does (KeyboardInterrupt in its main
        thread), while in the notebook the kernel lives on and the cell says so."""
        hook = _wiring.unhandled_fault_hook
        if hook is None:  # said once for the ranks of one mesh that failed together
            self._fault_reports.add(failure)
            return
        try:
            hook(failure)
        except BaseException as e:
            stops = not _wiring.interactive
            self.diag(f"{failure.report()}\nthe unhandled fault hook raised {type(e).__name__}: {e}; "
                      + ("stopping the program, as Monarch does" if stops else "the notebook lives on"), failure.cell)
            if stops:
                stop_main_thread()

    def diag(self, text, cell=""):
        """An `[xmesh] ...` line of the runtime's own on stderr (in the kernel: in that cell)."""
        self._write("stderr", f"[xmesh] {text}\n", cell)

    # -- shutdown --------------------------------------------------------------------------
    def shutdown(self, wait_s=None):
        """Stops this runtime; a controller's unnamed allocations stop with it, waiting at most
        wait_s (default XMESH_EXIT_WAIT, 5 s) for their procs to exit."""
        if self._closed:
            return
        self._closed = True
        if self.role == "controller":
            for hook in _wiring.controller_shutdown:
                hook(self)
            # Named allocations outlive their controller (the next one attaches by name).
            allocs = [a for a in self.owned_allocs() if not a.name]
            for a in allocs:
                try:
                    a.request_stop(immediately=False)
                except Exception:
                    pass
            deadline = time.monotonic() + (env_float("XMESH_EXIT_WAIT", 5.0) if wait_s is None else wait_s)
            for a in allocs:
                a.wait_exited(max(0.0, deadline - time.monotonic()), self.node)
            # The procs' last lines were sent before their exit notices: print them.
            self.logs.sync(timeout=2.0)
            for hook in _wiring.controller_exit:
                hook(self)  # goodbye to the host agents
            self.logs.stop()
        self.node.stop()
        _core.drain_releases()


_runtime = None
_runtime_lock = threading.Lock()


class _Wiring:
    """What upper layers inject into the runtime, which imports none of them (the way xeus
    injects its publisher into an interpreter): the kernel, the debugger, `xmesh debug`'s
    server and the actor host register here when they are imported."""

    def __init__(self):
        self.controller_start = []     # hook(runtime) when a controller runtime starts
        self.controller_shutdown = []  # hook(runtime) when it shuts down, before its procs stop
        self.controller_exit = []      # hook(runtime) at the end of its shutdown, its procs gone
        self.call_observers = []       # fn(targets, call or None) for every call a controller sends
        self.proc_env = []             # fn() -> {name: value}, added to every proc's environment
        self.actor_host_factory = None  # ActorHost(runtime): lets this process host actors
        self.interactive = False       # remote output read by a person (the kernel): windows, budget
        self.output_sink = None        # where remote output goes (None: stdout / stderr)
        self.unhandled_fault_hook = None  # fn(MeshFailure) for failures nobody waits for
        self.asker = None              # fn(question) -> answer or None: the kernel's input box
        self.serves_tools = True       # False: a reader of other controllers (set_reader_only)


_wiring = _Wiring()


def on_controller_start(hook):
    """hook(runtime) runs when the controller runtime starts (at once if it runs already):
    control-message handlers, servers."""
    _wiring.controller_start.append(hook)
    if _runtime is not None and _runtime.role == "controller" and _runtime.logs is not None \
            and _wiring.serves_tools:
        hook(_runtime)


def set_reader_only():
    """This process only reads other controllers and their agents (the panel's sidecar): its
    runtime serves no debugger and no panel socket, so `xmesh debug` and the panel never list it
    as a program. Before the runtime starts."""
    _wiring.serves_tools = False


def set_unhandled_fault_hook(fn):
    """fn(MeshFailure) gets every failure nobody waits for (None: the default [xmesh] line)."""
    _wiring.unhandled_fault_hook = fn


def report_fault(failure):
    """The default for an unhandled failure: an [xmesh] line where it belongs."""
    get_runtime().diag(failure.report(), failure.cell)


def stop_main_thread() -> None:
    """Stops a script from another thread, as Monarch's fault hook does: a KeyboardInterrupt in
    the main thread, by a real SIGINT (it also ends a sleep or a blocking call) or, where the
    program runs with SIGINT ignored (a child of a process that ignores it inherits that) or
    handled by itself, raised at the main thread's next Python instruction. atexit handlers run
    either way, and the exit is the one an interrupted script makes."""
    main = threading.main_thread()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.pthread_kill(main.ident, signal.SIGINT)
        return
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main.ident), ctypes.py_object(KeyboardInterrupt))


def failure_of_fault(body):
    """A Fault message (an actor failed) as a MeshFailure."""
    mesh = (body.info or {}).get("mesh") or body.actor or "?"
    return MeshFailure(mesh, body.text or "an actor failed with nobody waiting for the result", "actor",
                       body.rank, body.cell or "")


def on_controller_shutdown(hook):
    _wiring.controller_shutdown.append(hook)


def on_controller_exit(hook):
    _wiring.controller_exit.append(hook)


def observe_calls(fn):
    """fn(targets, call, what) for every call this controller sends (call None for a broadcast;
    what: the endpoint's name, or what the call does, "__init__" for a spawn)."""
    _wiring.call_observers.append(fn)


def note_call(targets, call, what):
    for fn in _wiring.call_observers:
        fn(targets, call, what)


def add_proc_env(fn):
    """fn() -> {name: value} joins the environment of every proc spawned from now on."""
    _wiring.proc_env.append(fn)


def set_actor_host_factory(factory):
    _wiring.actor_host_factory = factory


def set_asker(fn):
    """fn(question) -> the user's answer, or None where nobody can answer (the kernel: the
    cell's input box, None when the request allows no input). None: the terminal's."""
    _wiring.asker = fn


def ask(question: str):
    """A person's answer to a yes/no kind of question, or None where none can be asked (no
    terminal, a notebook run headless): the caller then refuses rather than guesses."""
    if _wiring.asker is not None:
        return _wiring.asker(question)
    try:
        if sys.stdin is None or not sys.stdin.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    sys.stdout.flush()
    return input(question)


def in_notebook() -> bool:
    """Whether a person reads this controller's output in a notebook (xmesh's kernel)."""
    return _wiring.interactive


def set_output(interactive, sink):
    """How this controller shows remote output (the kernel: to the cells, with aggregation
    windows and a display budget). Takes effect for a controller runtime started after it."""
    _wiring.interactive = bool(interactive)
    _wiring.output_sink = sink


_client_shut_down = False  # shutdown_client() ran: no controller runtime again in this process
_shutdown_claimed = False


def current_runtime():
    """The runtime of this process if one was made (and not shut down), else None: nothing starts."""
    return None if _client_shut_down else _runtime


def get_runtime():
    """The runtime of this process, creating a controller runtime on first use."""
    global _runtime
    if _runtime is not None and not _client_shut_down:
        return _runtime
    with _runtime_lock:
        if _client_shut_down:
            raise RuntimeError("this program's xmesh controller was shut down (shutdown_context()); it cannot "
                               "start again in this process")
        if _runtime is None:
            _runtime = _make_controller()
    return _runtime


def shutdown_client(wait_s=None):
    """Monarch's shutdown_context(): this process's controller runtime stops, its unnamed
    allocations with it (named ones stay for a later controller), and cannot start again here.
    False when no controller runtime runs (one started later can still be shut down) or it
    was already shut down."""
    global _client_shut_down, _shutdown_claimed
    with _runtime_lock:
        rt = _runtime
        if _shutdown_claimed or rt is None or rt.role != "controller":
            return False
        _shutdown_claimed = True
    rt.shutdown(wait_s)  # (its hooks still reach the runtime)
    _client_shut_down = True
    return True


def _forget_runtime_in_child():
    # A forked child has a copy of the parent's node without its threads: it must neither use
    # it nor shut it down at exit. It gets a runtime of its own if it uses xmesh.
    global _runtime
    if _runtime is not None:
        _runtime._closed = True
        _runtime = None


os.register_at_fork(after_in_child=_forget_runtime_in_child)


def _make_controller():
    rundir = _core.runtime_dir()
    os.makedirs(_core.layout_controller_dir(rundir), mode=0o700, exist_ok=True)
    cookie = _core.random_hex(32)
    tag = _core.random_hex(4)
    node = _core.Node("controller", f"ipc://{_core.layout_controller_dir(rundir)}/{os.getpid()}-{tag}", cookie)
    node.set_default_cookie(cookie)
    node.start()
    rt = Runtime("controller", node, cookie)
    rt.start_controller_threads()
    atexit.register(rt.shutdown)
    return rt


def init_proc_runtime():
    """Called once by a proc's main: the node listens where the host agent said."""
    global _runtime
    cookie = os.environ["XMESH_JOB_COOKIE"]
    addr = os.environ["XMESH_PROC_ADDR"]
    # A proc of a controller over TCP listens where its agent said (XMESH_PROC_BIND) with the
    # cluster's key, and is reached at XMESH_PROC_ADDR.
    bind = os.environ.get("XMESH_PROC_BIND", "")
    unix = os.environ.get("XMESH_PROC_UNIX", "")
    key_file = os.environ.get("XMESH_KEY_FILE", "")
    if bind and unix:
        # Known by its TCP address; the procs of its host reach it at its unix socket (and over
        # shared memory): cast-tree relays forwarding to their neighbours.
        node = _core.Node("proc", unix, cookie, key_file=key_file, advertise=addr)
        node.listen_tcp(bind, key_file, addr)
    else:
        node = _core.Node("proc", bind or addr, cookie, key_file=key_file, advertise=addr if bind else "")
    node.set_default_cookie(cookie)
    for other in json.loads(os.environ.get("XMESH_ACCEPT_COOKIES", "[]")):
        node.add_accepted_cookie(other)
    node.start()
    _runtime = Runtime("proc", node, cookie)
    return _runtime


def runtime_if_started():
    return _runtime


def interpreter() -> str:
    """The Python this process runs, which its procs, their fork server and a job's agents run
    too: a venv's or conda environment's own interpreter, so that they see its packages (the
    kernel's is the interpreter it runs in)."""
    return sys.executable or PYTHON


def proc_environment():
    """What a proc should know about its controller, from the controller's side."""
    rt = get_runtime()
    return {
        "XMESH_CONTROLLER_ADDR": rt.node.addr,
        "XMESH_JOB_COOKIE": rt.job_cookie,
        "XMESH_ACCEPT_COOKIES": json.dumps(rt.cookies),
        "XMESH_SYS_PATH": json.dumps([p for p in sys.path if p and os.path.isdir(p)]),
        "XMESH_LOG_LEVEL": str(DEFAULT_PROC_LOG_LEVEL),
        "PYTHONUNBUFFERED": "1",
        **{k: v for fn in _wiring.proc_env for k, v in fn().items()},
    }
