"""The proc side of the mesh-aware debugger (DESIGN §7; debugger/README.md).

`breakpoint()` / `pdb.set_trace()` in an actor start a RemotePdb: a pdb whose stdin and stdout
are a relay to the controller. Everything pdb writes is kept until it asks for its next
command; then it goes to the controller as one DebugEvent ("prompt"), and the relay waits for
one DebugCommand. So a pdb command costs one message each way, however many lines it prints.

Events (body "ev"): "prompt" (the session waits for a command; with its location, its first
prompt of a stop carries the whole table row and the stack), "running" (a command let the code
run on), "ended" (the call finished: the session is gone), "sources" (files of the stack this
host cannot read: the controller sends their text, so `l` works on notebook-defined code)."""
import asyncio
import bdb
import itertools
import linecache
import os
import pdb
import queue
import sys
import sysconfig
import threading
from typing import Optional

from .. import _core
from .._output import capture as _proc_output
from .._base.context import actor_context, actor_point, current_cell

_HOST = _core.hostname()
_sids = itertools.count(1)
_sessions = {}             # sid -> RemotePdb (stopped or stepping)
_by_thread = {}            # (thread ident, asyncio task or None) -> RemotePdb
_lock = threading.Lock()
_post_mortem = False
# Frames of these modules are the runtime's, not the user's: pdb never stops in them.
_SKIP = ["xmesh", "xmesh.*", "threading", "concurrent.futures.*", "asyncio.*", "bdb", "pdb"]
_CONTINUE = object()       # the controller's `continue`: clear breakpoints, then `c`
SOURCE_WAIT_S = 5.0


# Where debug events go (the owner): XMESH_CONTROLLER_ADDR until a controller adopts this proc,
# read when first needed (a proc forked by the fork server gets its environment after imports).
_controller_addr: Optional[str] = None


def _controller_address() -> str:
    global _controller_addr
    if _controller_addr is None:
        _controller_addr = os.environ.get("XMESH_CONTROLLER_ADDR", "")
    return _controller_addr


def _controller():
    from .._runtime.process import get_runtime

    return get_runtime(), _controller_address()


def _send(**fields):
    """Sends one DebugEvent (its fields: DebugEventBody) to the controller that owns this proc."""
    from .._runtime.process import Kind

    rt, addr = _controller()
    if not addr:
        return
    body = _core.DebugEventBody(**fields).to_dict()
    try:
        rt.node.send(addr, int(Kind.DebugEvent), body)
    except Exception:
        pass  # the controller is gone: nobody to show this to


class _Relay:
    """pdb's stdin and stdout: output is kept until pdb reads its next command."""

    def __init__(self, session):
        self.session = session
        self.out = []
        self.commands = queue.Queue()
        self.encoding = "utf-8"
        self.waiting = False  # pdb waits for its next command

    def write(self, text):
        self.out.append(text)
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False

    def take(self):
        text = "".join(self.out)
        self.out.clear()
        return text

    def readline(self):
        self.waiting = True
        try:
            return self._next_command()
        finally:
            self.waiting = False

    def _next_command(self):
        self.session.prompting()
        while True:
            cmd = self.commands.get()
            if cmd is _CONTINUE:
                self.session.clear_all_breaks()
                return "c\n"
            if isinstance(cmd, dict):  # sources from the controller, then keep waiting
                _install_sources(cmd)
                continue
            return cmd + "\n"


def _install_sources(sources):
    for name, text in sources.items():
        if text is not None:
            lines = text.splitlines(keepends=True)
            linecache.cache[name] = (len(text), None, lines, name)


class RemotePdb(pdb.Pdb):
    def __init__(self, reason):
        self.relay = _Relay(self)
        super().__init__(stdin=self.relay, stdout=self.relay, skip=_SKIP, nosigint=True)
        self.prompt = "(Pdb) "
        self.reason = reason
        self.sid = f"{os.getpid()}.{next(_sids)}"
        self.thread = threading.get_ident()
        self.key = _session_key()  # the loop's thread runs several actors' async calls: one each
        self.announced = False
        self.fresh_stop = True
        self.cell = current_cell() or ""
        ctx = actor_context()
        self.actor = getattr(ctx, "mesh_name", None) or "proc"
        point = actor_point()  # the debugger names actors by their rank in their mesh
        self.rank = point.rank
        try:
            self.coords = dict(point)
            self.sizes = dict(zip(point.shape.labels, point.shape.sizes))
        except Exception:
            self.coords, self.sizes = {}, {}
        with _lock:
            _sessions[self.sid] = self
            _by_thread[self.key] = self

    # -- pdb hooks ---------------------------------------------------------------------------
    def interaction(self, frame, traceback):
        self.fresh_stop = True
        _proc_output.redirect_thread(self.thread, self.relay)  # `!print(x)` answers here too
        try:
            self._fetch_missing_sources(frame, traceback)
            super().interaction(frame, traceback)
        finally:
            _proc_output.redirect_thread(self.thread, None)
            if self.sid in _sessions:
                _send(ev="running", sid=self.sid, out=self.relay.take())
            if sys.gettrace() is None:  # it continued (stepping keeps pdb's own trace)
                _rearm_paused_tasks(self.thread)

    # -- the relay ---------------------------------------------------------------------------
    def _location(self):
        f = self.curframe
        if f is None:
            return {"function": "?", "file": "?", "line": 0}
        return {"function": f.f_code.co_name, "file": f.f_code.co_filename, "line": self.curframe.f_lineno}

    def _stack(self):
        out = []
        for f, lineno in self.stack:
            if self.is_skipped_module(f.f_globals.get("__name__")):
                continue
            out.append((f.f_code.co_filename, lineno, f.f_code.co_name))
        return out

    def prompting(self):
        body = {"ev": "prompt", "sid": self.sid, "out": self.relay.take(), **self._location()}
        if self.fresh_stop:
            self.fresh_stop = False
            body.update(stop=True, stack=self._stack(), reason=self.reason)
            if not self.announced:
                self.announced = True
                body.update(self._row())
        _send(**body)

    def _row(self):
        return dict(actor=self.actor, rank=self.rank, coords=self.coords, sizes=self.sizes, host=_HOST,
                    pid=os.getpid(), cell=self.cell)

    def announce_again(self):
        """A new controller took this proc over while pdb waits: it learns of the stop whole."""
        _send(ev="prompt", sid=self.sid, out="", **self._location(), stop=True, stack=self._stack(),
              reason=self.reason, **dict(self._row(), cell=""))

    def _fetch_missing_sources(self, frame, tb):
        """Files of the stack this host cannot read (code defined in notebook cells, files that
        exist only on the controller's host): their text comes from the controller."""
        names = set()
        f = frame
        while f is not None:
            names.add(f.f_code.co_filename)
            f = f.f_back
        while tb is not None:
            names.add(tb.tb_frame.f_code.co_filename)
            tb = tb.tb_next
        missing = sorted(n for n in names if not linecache.getlines(n))
        if not missing:
            return
        _send(ev="sources", sid=self.sid, files=missing)
        try:
            cmd = self.relay.commands.get(timeout=SOURCE_WAIT_S)
        except queue.Empty:
            return
        if isinstance(cmd, dict):
            _install_sources(cmd)
        else:
            self.relay.commands.put(cmd)  # a command came first (cannot happen in order; keep it)

    def end(self):
        """The call this session stopped in is over (or the proc stops): forget it."""
        with _lock:
            if _sessions.pop(self.sid, None) is None:
                return
            _by_thread.pop(self.key, None)
        sys.settrace(None)
        _rearm_paused_tasks(self.thread)
        _send(ev="ended", sid=self.sid, out=self.relay.take())


# -- entry points ------------------------------------------------------------------------------
def _session_key():
    return threading.get_ident(), _current_task()


def _session_for_this_thread(reason):
    s = _by_thread.get(_session_key())
    if s is None:
        s = RemotePdb(reason)
    else:
        s.reason = reason
    return s


def set_trace(frame=None, *, header=None):
    """pdb.set_trace() in a proc."""
    s = _session_for_this_thread("breakpoint")
    if header is not None:
        s.message(header)
    s.set_trace(frame or sys._getframe().f_back)


def breakpoint_hook(*args, **kwargs):
    """sys.breakpointhook in a proc; PYTHONBREAKPOINT=0 still turns breakpoint() off."""
    if os.environ.get("PYTHONBREAKPOINT") == "0":
        return None
    set_trace(sys._getframe().f_back)


def install():
    """Called once by the proc's main: breakpoint() and pdb.set_trace() stop remotely."""
    sys.breakpointhook = breakpoint_hook
    pdb.set_trace = set_trace


def set_post_mortem(on):
    global _post_mortem
    _post_mortem = bool(on)


def post_mortem(exc):
    """An endpoint raised exc: with post-mortem on, stop in pdb at the raising frame first.
    Returns once the session continues (the error is then returned as usual)."""
    if not _post_mortem or isinstance(exc, (bdb.BdbQuit, KeyboardInterrupt, SystemExit)):
        return
    if getattr(exc, "_xmesh_post_mortem_done", False):
        return  # an async endpoint's error: already stopped on the loop's thread
    try:
        exc._xmesh_post_mortem_done = True
    except Exception:
        pass
    tb = exc.__traceback__
    if tb is None:
        return
    s = _session_for_this_thread("exception")
    s.reset()
    s.message(f"{type(exc).__name__}: {exc}")
    try:
        s.interaction(None, tb)
    except bdb.BdbQuit:
        pass
    finally:
        s.end()


def call_finished():
    """The actor's call is over: a session it had ends (tracing stops with it)."""
    if not _by_thread:
        return  # (every call passes here: nothing to look up while no session exists)
    s = _by_thread.get(_session_key())
    if s is not None:
        s.end()


def adopted_by(addr):
    """A controller attached this proc's allocation (after a kernel restart): debug events go
    to it from now on, and the sessions stopped in pdb are announced to it."""
    global _controller_addr
    if addr == _controller_address():
        return
    _controller_addr = addr
    with _lock:
        waiting = [s for s in _sessions.values() if s.relay.waiting]
    for s in waiting:
        s.announce_again()


# -- attaching to running actors (issue 18) -------------------------------------------------------
# An attach to a rank that is not stopped sets a trace on that actor's thread alone
# (_core.trace_thread; nothing traces otherwise). At the thread's next event in the user's code
# the trace goes and pdb starts there, reason "attached"; an idle actor stops at its next call.
# An async endpoint runs on the proc's loop thread among other actors' coroutines: that thread
# is traced, and stops only in the asyncio task of the paused actor's call, when it next runs.
_skip_check = bdb.Bdb(skip=_SKIP)
_LIBRARY = (sysconfig.get_paths()["stdlib"] + os.sep, "<frozen ")  # the standard library's files
_actor_threads = None      # injected by _actor_host: (mesh name, rank) -> [ActorThread-like]
# Reentrant: a trace callback may fire on a thread that holds it (a line event inside a block
# that holds it, once that thread is traced).
_pause_lock = threading.RLock()
_traced_threads = set()    # actor threads traced until they reach the user's code
_paused_tasks = {}         # asyncio task -> ident of its loop's thread (traced while any waits)


def set_actor_threads(lookup):
    """lookup(mesh name, ranks) -> the actor threads running those ranks here, each with .rank,
    .request_pause(idle_too) -> state and .withdraw_pause() (ActorThread)."""
    global _actor_threads
    _actor_threads = lookup


def _current_task():
    loop = asyncio._get_running_loop()  # (None on an actor's thread: no exception raised and caught)
    return asyncio.current_task(loop) if loop is not None else None


def _users_frame(frame):
    """The innermost frame of the user's code from frame outwards (xmesh's and the standard
    library's are not), or None."""
    while frame is not None:
        if not frame.f_code.co_filename.startswith(_LIBRARY) and \
                not _skip_check.is_skipped_module(frame.f_globals.get("__name__")):
            return frame
        frame = frame.f_back
    return None


def _stop_attached(frame, user):
    """pdb from the traced event at frame, stopping at the user's next line (in `user`, the
    innermost frame of the user's code, once the standard library or xmesh it called returned
    there): a step from here would stop in the next call of anything, `isinstance`'s
    `ABCMeta.__instancecheck__` among them, which pdb's skip list (by module) does not cover."""
    s = _session_for_this_thread("attached")
    s.set_trace(frame)
    s.set_next(user)


def _stop_in_users_code(frame):
    """The attach trace's callback on an actor's thread."""
    user = _users_frame(frame)
    if user is None:
        return
    ident = threading.get_ident()
    with _pause_lock:
        _traced_threads.discard(ident)
        _core.trace_thread(ident, None)
    _stop_attached(frame, user)


def _stop_in_paused_task(frame):
    """The attach trace's callback on the loop's thread: stops in a paused actor's task only."""
    task = _current_task()
    if task is None or task not in _paused_tasks:
        return
    user = _users_frame(frame)
    if user is None:
        return
    ident = threading.get_ident()
    with _pause_lock:
        _paused_tasks.pop(task, None)
        if ident not in _paused_tasks.values():
            _core.trace_thread(ident, None)
    _stop_attached(frame, user)


def pause_thread(ident):
    """Stops the actor thread `ident` at its next line of the user's code."""
    with _pause_lock:
        _traced_threads.add(ident)
        _core.trace_thread(ident, _stop_in_users_code)


def unpause_thread(ident):
    """Withdraws pause_thread; True if it had not stopped the thread yet."""
    if ident not in _traced_threads:
        return False  # (the end of every call asks: no lock while nothing is paused)
    with _pause_lock:
        if ident not in _traced_threads:
            return False
        _traced_threads.discard(ident)
        _core.trace_thread(ident, None)
        return True


def pause_task(task, loop_ident):
    """Stops the asyncio task (an async endpoint's call) at its next line of the user's code."""
    with _pause_lock:
        _paused_tasks[task] = loop_ident
        _core.trace_thread(loop_ident, _stop_in_paused_task)


def unpause_task(task):
    """Withdraws pause_task; True if it had not stopped the task yet."""
    if task not in _paused_tasks:
        return False
    with _pause_lock:
        ident = _paused_tasks.pop(task, None)
        if ident is None:
            return False
        if ident not in _paused_tasks.values():
            _core.trace_thread(ident, None)
        return True


def _rearm_paused_tasks(ident):
    """A session on the loop's thread let it run on: pdb took the thread's trace over, so tasks
    still waiting for their pause get it back."""
    with _pause_lock:
        if ident in _paused_tasks.values():
            _core.trace_thread(ident, _stop_in_paused_task)


def _pause(body):
    for t in (_actor_threads(body.pause_actor, body.pause_ranks) if _actor_threads else []):
        if body.unpause:
            t.withdraw_pause()
            continue
        state = t.request_pause(body.pause_idle)
        _send(ev="pause", sid="", actor=body.pause_actor, rank=t.rank, reason=state)


def deliver(body: "_core.DebugCommandBody") -> None:
    """A DebugCommand from the controller (the proc's main thread calls this)."""
    if body.pause_actor is not None:
        _pause(body)
        return
    sid = body.sid
    if sid == "*":
        targets = list(_sessions.values())
    else:
        s = _sessions.get(sid)
        targets = [s] if s is not None else []
    if not targets and body.cmd is not None and sid != "*":
        _send(ev="ended", sid=sid, out="", gone=True)  # the controller's view was stale
        return
    for s in targets:
        if body.sources is not None:
            s.relay.commands.put(body.sources)
        if body.resume:
            s.relay.commands.put(_CONTINUE)
        elif body.cmd is not None:
            s.relay.commands.put(body.cmd)


def thread_label(ctx):
    """What the controller's `where` calls the thread running this actor: its mesh's name, its
    rank and its id (two meshes spawned with one name stay apart): _debug.controller.parse_label."""
    return f"{ctx.mesh_name}\t{ctx.rank}\t{ctx.actor_id}"
