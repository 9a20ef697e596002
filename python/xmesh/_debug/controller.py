"""The controller side of the mesh-aware debugger (DESIGN §7; debugger/README.md).

`DebugController` keeps the table of debug sessions the procs report (DebugEvent messages, see
_debug_proc), sends them pdb commands (DebugCommand) and gathers stacks (DumpStacks, answered
by each proc's I/O thread even while its Python threads are busy). `DebugPrompt` is the
`xmesh_dbg>` command loop; it talks to the user through a small I/O object: the notebook cell
(Jupyter stdin channel), the terminal a script runs in, or an `xmesh debug` client. A `get()` /
`await` that sees a new stop opens the prompt (`on_wait`)."""
import linecache
import os
import signal
import threading
import time

from .. import _core
from . import io as _debug_io
from .io import TakenOver, format_table
from .prompt import DebugPrompt
from .._base.errors import internal_frame
from .._base.shape import ranks_text
from .._runtime.wait import Request, request

RESUME_WAIT_S = 0.5    # after a command lets a rank run on, how long to wait for its next stop
ANSWER_WAIT_S = 30.0   # how long a pdb command may take before the prompt comes back without it
NOTICE_DELAY_S = 0.5   # a stop no waiting cell picked up by then gets a notice
SETTLE_QUIET_S = 0.15  # ranks that hit a breakpoint together: the table waits until stops pause
SETTLE_MAX_S = 1.0
PAUSE_WAIT_S = 1.0     # an attach to a running rank waits this long for it to stop


class DebuggerQuit(RuntimeError):
    """`quit` left the debugger with actors still stopped in pdb."""


class ActorsStopped(RuntimeError):
    """Actors stopped in pdb where nobody can answer (XMESH_DEBUG=error, or no input)."""


class Session:
    def __init__(self, addr, sid):
        self.addr, self.sid = addr, sid
        self.actor, self.rank, self.coords, self.host, self.pid = "?", -1, {}, "?", 0
        self.function, self.file, self.line, self.reason, self.cell = "?", "?", 0, "breakpoint", ""
        self.sizes = {}          # the actor mesh's dimensions (for ranks(...) selectors)
        self.stack = []
        self.state = "stopped"   # stopped (waits for a command) / running / ended
        self.out = []            # output since the user last saw it
        self.events = 0
        self.shown = False       # a prompt (or a notice) has shown this stop

    @property
    def key(self):
        return (self.addr, self.sid)

    def label(self):
        return f"{self.actor} {self.rank}"

    def take_output(self):
        text = "".join(self.out)
        self.out.clear()
        return text


def _runtime_frame(file):
    """Frames of the runtime itself (xmesh's package, threading), left out of user stacks."""
    return internal_frame(file) or file.endswith(("/threading.py", "/queue.py"))


def _user_frames(frames):
    """The frames from the endpoint inwards: the runtime's leading frames dropped."""
    i = 0
    while i < len(frames) and _runtime_frame(frames[i][0]):
        i += 1
    return list(frames[i:])


def format_stack(frames, indent="    "):
    out = []
    for file, line, function in frames:
        out.append(f'{indent}File "{file}", line {line}, in {function}\n')
        src = linecache.getline(file, line).strip()
        if src:
            out.append(f"{indent}  {src}\n")
    return "".join(out)


class DebugController:
    def __init__(self, rt):
        self.rt = rt
        self.cond = threading.Condition()
        self.sessions = {}       # (addr, sid) -> Session, stopped or running
        self.notes = []          # what the next prompt says first (ranks that died while stopped)
        self.new_stop = False    # a stop that no prompt has shown yet
        self.prompt_open = False  # a prompt in this process (cell or terminal) owns the main thread
        self.driver = None        # the `xmesh debug` client that drives the debugger, if one does
        self.command_lock = threading.RLock()  # one driver's command at a time reaches the ranks
        self.post_mortem = False
        self.commands_sent = 0   # DebugCommand messages (tests count them: one per command per rank)
        self.last_stop_at = 0.0
        self.pauses = {}         # (actor, rank) -> what its proc said of a pause: "pausing" or "idle"

    # -- events (the runtime's control thread) ------------------------------------------------
    def on_event(self, msg):
        body = msg.debug_event()
        addr = msg.sender_addr
        ev = body.ev
        if ev == "sources":
            self._send_sources(addr, body)
            return
        if ev == "pause":
            with self.cond:
                self.pauses[(body.actor, body.rank)] = body.reason
                self.cond.notify_all()
            return
        with self.cond:
            key = (addr, body.sid)
            s = self.sessions.get(key)
            if s is None and ev in ("running", "ended"):
                return
            if s is None:
                s = self.sessions[key] = Session(*key)
            s.events += 1
            s.out.append(body.out)
            if ev == "prompt":
                s.state = "stopped"
                for f in ("actor", "rank", "coords", "sizes", "host", "pid", "cell", "reason", "function", "file",
                          "line"):
                    value = getattr(body, f)
                    if value is not None:
                        setattr(s, f, value)
                if body.stop:
                    s.stack = [tuple(f) for f in body.stack]
                    s.shown = False
                    self.new_stop = True
                    _core.wake_main()  # a waiting get() / await / stream opens the prompt now
                    self.last_stop_at = time.monotonic()
                    threading.Timer(NOTICE_DELAY_S, self._notice_if_unseen, (s, time.monotonic())).start()
            elif ev == "running":
                s.state = "running"
            elif ev == "ended":
                s.state = "ended"
                del self.sessions[key]
            self.cond.notify_all()

    def _send_sources(self, addr, body):
        sources = {}
        for name in body.files:
            lines = linecache.getlines(name)
            sources[name] = "".join(lines) if lines else None
        self._command(addr, sid=body.sid, sources=sources)

    def _notice_if_unseen(self, s, first_at):
        """Stops that no waiting cell turned into a prompt (after a broadcast, or a call nobody
        waits on): said where their calls came from, once stops pause (ranks that stop together
        are one line, every rank named)."""
        with self.cond:
            driver = self.driver
            if s.shown or s.state != "stopped" or (self.prompt_open and driver is None):
                return
            quiet_for = time.monotonic() - self.last_stop_at
            if quiet_for < SETTLE_QUIET_S and time.monotonic() - first_at < NOTICE_DELAY_S + SETTLE_MAX_S:
                threading.Timer(SETTLE_QUIET_S - quiet_for, self._notice_if_unseen, (s, first_at)).start()
                return
            fresh = [x for x in self.sessions.values() if x.state == "stopped" and not x.shown]
            for x in fresh:
                x.shown = True
        if driver is not None:  # the client in a terminal hears of every stop
            driver.write("\n[xmesh] stopped in pdb:\n" + format_table(fresh))
            return
        groups: dict = {}
        for x in fresh:
            where = f"{os.path.basename(x.file)}:{x.line} in {x.function}()"
            groups.setdefault((x.actor, where, x.reason, x.cell), []).append(x.rank)
        for (actor, where, reason, cell), ranks in groups.items():
            self.rt.diag(f"{actor} {ranks_text(ranks)} stopped in pdb at {where} ({reason}); no call waits for "
                         f"{'it' if len(ranks) == 1 else 'them'}: xmesh.debug() (or %xmesh_debug) opens the debugger",
                         cell)

    def on_proc_exited(self, addr, text):
        with self.cond:
            gone = [s for s in self.sessions.values() if s.addr == addr]
            for s in gone:
                del self.sessions[s.key]
                if s.state == "stopped":  # (a session that ran on since is only forgotten)
                    self.notes.append(f"{s.actor} rank {s.rank} died while stopped in pdb: {text}")
            if gone:
                self.cond.notify_all()

    def settle(self):
        """Waits until stops pause (SETTLE_QUIET_S without a new one, at most SETTLE_MAX_S): ranks
        that reach a breakpoint together show up in one table."""
        deadline = time.monotonic() + SETTLE_MAX_S
        with self.cond:
            while True:
                now = time.monotonic()
                left = min(self.last_stop_at + SETTLE_QUIET_S, deadline) - now
                if left <= 0:
                    return
                self.cond.wait(left)

    # -- queries --------------------------------------------------------------------------------
    def stopped(self):
        with self.cond:
            return sorted((s for s in self.sessions.values() if s.state == "stopped"), key=lambda s: (s.actor, s.rank))

    def take_notes(self):
        with self.cond:
            notes, self.notes = self.notes, []
        return notes

    def find(self, actor, rank):
        with self.cond:
            for s in self.sessions.values():
                if s.actor == actor and s.rank == rank:
                    return s
        return None

    def actors(self):
        with self.cond:
            return sorted({s.actor for s in self.sessions.values()})

    # -- who drives --------------------------------------------------------------------------------
    def take_over(self, client):
        """An `xmesh debug` client becomes the driver: the previous client is told and let go,
        a prompt open in this process is interrupted (its call keeps waiting)."""
        with self.cond:
            previous, self.driver = self.driver, client
            local = self.prompt_open and previous is None
        if previous is not None:
            who = f"another {client.label}" if client.label.startswith("`xmesh debug`") else client.label
            previous.close(f"[xmesh] {who} took over this debugger\n")
        if local:
            self._interrupt_local_prompt()

    def release(self, client):
        """The client left; returns the sessions still stopped. A waiting call takes the
        prompt back if any are."""
        with self.cond:
            if self.driver is not client:
                return []
            self.driver = None
            left = [s for s in self.sessions.values() if s.state == "stopped"]
            if left:
                self.new_stop = True
                _core.wake_main()
            return left

    def _interrupt_local_prompt(self):
        # The prompt waits in input() or the kernel's stdin recv on the main thread: a signal
        # makes it return EINTR and run _on_takeover_signal. Sent again until the prompt is
        # gone, in case the first one landed just before the wait began.
        if not _debug_io.takeover_handler_installed():
            return
        deadline = time.monotonic() + 3.0
        with self.cond:
            while self.prompt_open and time.monotonic() < deadline:
                signal.pthread_kill(threading.main_thread().ident, _debug_io.TAKEOVER_SIGNAL)
                self.cond.wait(0.1)

    # -- commands ---------------------------------------------------------------------------------
    def _command(self, addr, **fields):
        """Sends one DebugCommand (its fields: DebugCommandBody); False when addr is gone."""
        from .._runtime.process import Kind

        body = _core.DebugCommandBody(**fields).to_dict()
        try:
            self.rt.node.send(addr, int(Kind.DebugCommand), body)
            self.commands_sent += 1
            return True
        except Exception:
            return False

    def send(self, sessions, cmd):
        """Sends one pdb command to each session and waits for every answer: {session: text}.
        A session that runs on (n, s, c...) is given RESUME_WAIT_S to stop again."""
        with self.command_lock:
            return self._send(sessions, cmd)

    def _send(self, sessions, cmd):
        before = {}
        with self.cond:
            for s in sessions:
                before[s.key] = s.events
                s.state = "waiting"
                s.out.clear()  # the answer is what comes after this input
        for s in sessions:
            if not self._command(s.addr, sid=s.sid, cmd=cmd):
                with self.cond:
                    s.state = "ended"
                    self.sessions.pop(s.key, None)
        return self._answers(sessions, before, ANSWER_WAIT_S)

    def _answers(self, sessions, before, timeout):
        deadline = time.monotonic() + timeout
        resumed_at = {}
        with self.cond:
            while True:
                now = time.monotonic()
                pending = []
                for s in sessions:
                    if s.state == "running":
                        resumed_at.setdefault(s.key, now)
                        if now - resumed_at[s.key] < RESUME_WAIT_S:
                            pending.append(s)
                    elif s.state == "waiting" or s.events == before[s.key]:
                        if s.key in self.sessions:
                            pending.append(s)
                if not pending or now >= deadline:
                    break
                self.cond.wait(0.05)
            for s in sessions:
                s.shown = True  # the answer shows where it stopped now
            return {s: s.take_output() for s in sessions}

    def pause(self, actor, ranks, wait_s=None, idle_too=True):
        """Stops running ranks of the actor mesh `actor` where they are (an attach to a rank that
        is not stopped). {rank: state}: "stopped" (in the table now), "idle" (it stops at the
        start of its next call; with idle_too False it is only reported, "idle-now"), "native"
        (inside a C call or a blocking system call: it stops when it returns to Python),
        "awaiting" (an async endpoint waiting for something: it stops when its coroutine runs
        again), "unknown" (no such live rank here: why_not_paused says why). `continue`
        withdraws a pause that has not stopped its rank yet."""
        wait_s = PAUSE_WAIT_S if wait_s is None else wait_s
        addrs = sorted({p.addr for a in self.rt.owned_allocs() for r, p in a.procs.items() if r in a.alive_ranks()})
        with self.cond:
            for r in ranks:
                self.pauses.pop((actor, r), None)
        for addr in addrs:
            self._command(addr, sid="", pause_actor=actor, pause_ranks=list(ranks), pause_idle=idle_too)
        deadline = time.monotonic() + wait_s
        with self.cond:
            while True:
                states = {r: self._pause_state(actor, r) for r in ranks}
                if all(v in ("stopped", "idle", "idle-now") for v in states.values()) or \
                        time.monotonic() >= deadline:
                    break
                self.cond.wait(0.01)
        return {r: {"pausing": "native", "pausing-async": "awaiting", None: "unknown"}.get(v, v)
                for r, v in states.items()}

    def why_not_paused(self, actor, ranks):
        from .find import why_not_paused

        return why_not_paused(self.rt, actor, ranks)

    def live_proc_count(self):
        return sum(len(a.alive_ranks()) for a in self.rt.owned_allocs())

    def _pause_state(self, actor, rank):
        for s in self.sessions.values():
            if s.actor == actor and s.rank == rank and s.state == "stopped":
                return "stopped"
        return self.pauses.get((actor, rank))

    def unpause(self, actor, ranks):
        """Withdraws pauses that have not stopped their ranks yet (`continue`)."""
        addrs = sorted({p.addr for a in self.rt.owned_allocs() for r, p in a.procs.items() if r in a.alive_ranks()})
        for addr in addrs:
            self._command(addr, sid="", pause_actor=actor, pause_ranks=list(ranks), unpause=True)
        with self.cond:
            for r in ranks:
                self.pauses.pop((actor, r), None)

    def continue_all(self, sessions=None):
        """Clears breakpoints and continues the given (default: every stopped) session; with
        none given, pauses that have not stopped their ranks yet are withdrawn too."""
        with self.command_lock:
            if sessions is None:
                with self.cond:
                    pending = {}
                    for (actor, rank), state in self.pauses.items():
                        if state in ("pausing", "pausing-async", "idle"):
                            pending.setdefault(actor, []).append(rank)
                for actor, ranks in pending.items():
                    self.unpause(actor, ranks)
            return self._continue(self.stopped() if sessions is None else sessions)

    def _continue(self, sessions):
        before = {}
        with self.cond:
            for s in sessions:
                before[s.key] = s.events
        for s in sessions:
            self._command(s.addr, sid=s.sid, resume=True)
        deadline = time.monotonic() + 5.0
        with self.cond:
            while any(s.state == "stopped" and s.key in self.sessions for s in sessions):
                if time.monotonic() >= deadline:
                    break
                self.cond.wait(0.05)
        return sessions

    def set_post_mortem(self, on):
        """Post-mortem debugging for every proc of this controller, now and later."""
        from .._runtime.process import Kind

        self.post_mortem = bool(on)
        addrs = sorted({a.procs[r].addr for a in self.rt.owned_allocs() for r in a.alive_ranks()})
        if not addrs:
            return
        # Wait for the acknowledgements: procs apply it on their control thread, and a call sent
        # right after must not beat it to the actor loop (the setting would come too late for it).
        # (a proc holding its GIL in C answers late: not forever)
        request(self.rt.node, addrs, Kind.Configure, _core.ConfigureBody(post_mortem=self.post_mortem).to_dict(),
                timeout=10, description="post-mortem setting")

    # -- stacks -------------------------------------------------------------------------------------
    def stacks(self, timeout=2.0):
        """Per actor mesh: [(rank, state, frames)] for every rank of every live actor, the
        stopped ones from their pdb session, the others dumped by their proc's I/O thread."""
        from .._runtime.process import Kind

        addrs = sorted({p.addr for a in self.rt.owned_allocs() for r, p in a.procs.items()
                        if r in a.alive_ranks()})
        stopped = {(s.actor, s.rank): s for s in self.stopped()}
        by_mesh = {}
        unanswered = []
        if addrs:
            deadline = time.monotonic() + timeout
            dumping = Request(self.rt.node, addrs, Kind.DumpStacks)
            # What async endpoints await is in their suspended coroutines, which only Python
            # can walk: asked beside the thread dump (which a proc answers even while a thread
            # holds its GIL in C), used where it answers.
            asking = Request(self.rt.node, addrs, Kind.ProcInfo, _core.ProcInfoBody(async_stacks=True).to_dict())
            dumps = dumping.answers(timeout, "`where`")
            tasks = asking.answers(max(0.0, deadline - time.monotonic()), "`where`")
            awaiting = {}
            for ok, body, _ in tasks.values():
                stacks = _core.ProcInfoReply.from_dict(body).async_stacks if ok else None
                for label, frames in (stacks or {}).items():
                    if parse_label(label) is not None:
                        awaiting[parse_label(label)] = [tuple(f) for f in frames]
            answered = set()
            for index, (ok, body, _) in dumps.items():
                answered.add(index)
                if not ok:
                    continue
                dump = _core.DumpStacksReply.from_dict(body)
                labels = dump.labels
                for ident, _current, frames in _core.parse_thread_dump(dump.stacks):
                    parsed = parse_label(labels.get(str(ident), ""))
                    if parsed is None:
                        continue
                    name, rank, actor_id = parsed
                    if (name, rank) in stopped:
                        continue
                    mesh = by_mesh.setdefault((name, actor_id), [])
                    if parsed in awaiting:
                        mesh.append((rank, "awaiting", awaiting[parsed]))
                    else:
                        user = _user_frames(frames)
                        mesh.append((rank, "running" if user else "idle", user))
            unanswered = [addrs[i] for i in range(len(addrs)) if i not in answered]
        for (name, rank), s in stopped.items():
            by_mesh.setdefault((name, ""), []).append((rank, f"stopped in pdb ({s.reason})", s.stack))
        return _named_apart(by_mesh), unanswered

    def _describe_silent(self, addr):
        """A proc that gave no stacks, by rank, with why when /proc tells (stopped, in the kernel)."""
        from .._api.allocation import describe_alloc, proc_at, why_not_answering

        why = why_not_answering(self.rt, addr)
        if why:
            return why
        found = proc_at(self.rt, addr)
        if found is None:
            return addr
        alloc, rank, p = found
        return f"proc rank {rank} of {describe_alloc(alloc)} (pid {p.pid}) did not answer"

    def format_stacks(self, only=None):
        """`where`: every rank's stack, or with only=(actor, ranks) those ranks'."""
        by_mesh, unanswered = self.stacks()
        if only is not None:
            actor, ranks = only
            by_mesh = {title: [t for t in v if t[0] in ranks] for title, v in by_mesh.items()
                       if title == actor or title.endswith(f" named {actor!r})")}
            by_mesh = {a: v for a, v in by_mesh.items() if v}
        if not by_mesh:
            return "no live actors\n"
        out = []
        for actor in sorted(by_mesh):
            ranks = by_mesh[actor]
            out.append(f"{actor}: {len(ranks)} rank{'s' if len(ranks) != 1 else ''}\n")
            for state, frames, group in _core.group_stacks(ranks):
                n = len(group)
                out.append(f"  {n} rank{'s' if n != 1 else ''} ({ranks_text(group)}) {state}"
                           f"{':' if frames else ''}\n")
                out.append(format_stack(frames, "      "))
        if unanswered:
            out.append(f"(no stacks from {len(unanswered)} proc(s) within 2 s: "
                       f"{'; '.join(self._describe_silent(a) for a in unanswered)})\n")
        return "".join(out)


def parse_label(label):
    """(mesh name, rank, actor id) of a thread's label (_debug.proc.thread_label), or None."""
    parts = label.split("\t") if label else []
    if len(parts) != 3 or not parts[1].lstrip("-").isdigit():
        return None
    return parts[0], int(parts[1]), parts[2]


def _named_apart(by_mesh):
    """{(name, actor id): ranks} as {title: ranks}: a mesh's name, and where several meshes were
    spawned with one name (a spawn cell run twice), each by its id ("slow.1a2b3c4d (one of 2
    meshes named 'slow')")."""
    ids = {}
    for name, actor_id in by_mesh:
        ids.setdefault(name, set()).add(actor_id)
    out = {}
    for (name, actor_id), ranks in by_mesh.items():
        same = sorted(ids[name] - {""})  # "": ranks stopped in pdb, whose mesh the table names
        if len(same) < 2 or actor_id == "":
            out.setdefault(name, []).extend(ranks)
        else:
            out[f"{actor_id} (one of {len(same)} meshes named {name!r})"] = ranks
    return out


# -- the prompt --------------------------------------------------------------------------------------
_controller = None
_controller_lock = threading.Lock()


def controller():
    global _controller
    from .._runtime.process import get_runtime

    with _controller_lock:
        if _controller is None:
            _controller = DebugController(get_runtime())
        return _controller


def controller_if_started():
    return _controller


def on_wait(future_description):
    """Called by a waiting get() / await on the main thread: opens the debugger when actors
    stopped since the last look. Raises DebuggerQuit or ActorsStopped for the waiter."""
    ctrl = _controller
    if ctrl is None or not ctrl.new_stop or ctrl.driver is not None or \
            threading.current_thread() is not threading.main_thread():
        return
    ctrl.new_stop = False
    if not ctrl.stopped():
        return
    open_prompt(waiting_for=future_description)


def open_prompt(waiting_for=None, explicit=False):
    """The `xmesh_dbg>` prompt in this process (cell or terminal). explicit: the user asked for it
    (xmesh.debug(), %xmesh_debug): with nothing stopped it still opens while actors run, so
    that `where`, `attach` and `pause` reach them."""
    ctrl = controller()
    mode = os.environ.get("XMESH_DEBUG", "").lower()
    io = _debug_io.frontend().io()
    ctrl.settle()
    driver = ctrl.driver
    if driver is not None:  # a client drives (`xmesh debug`, the panel); it has heard of these stops
        if waiting_for is None:
            io.write(f"[xmesh] the debugger is driven by {driver.label}\n")
        return
    stopped = ctrl.stopped()
    if mode == "error" and stopped:
        raise ActorsStopped(_stopped_text(stopped, "XMESH_DEBUG=error"))
    if not _debug_io.frontend().input_possible():
        if not stopped:
            return
        for s in stopped:
            s.shown = True
        io.write("[xmesh] actors stopped in pdb, and this run cannot take input (no stdin); "
                 "showing where they are and continuing them (XMESH_DEBUG=error fails instead)\n")
        io.show_table(stopped)
        io.write(ctrl.format_stacks())
        ctrl.continue_all(stopped)
        return
    _debug_io.install_takeover_handler()
    with ctrl.cond:
        ctrl.prompt_open = True
    # What came before the prompt is shown before it; then the output owner holds everything
    # else (remote lines and the runtime's own) until the prompt closes, so nothing garbles it.
    logs = ctrl.rt.logs
    if logs is not None:
        logs.deliver_queued()
        logs.hold(True)
    _debug_io.frontend().show_pending_output()
    try:
        outcome = DebugPrompt(ctrl, io).run(stay_open=explicit and not stopped and ctrl.live_proc_count() > 0)
    except TakenOver:
        outcome = "taken over"
    except KeyboardInterrupt:
        ctrl.continue_all()
        raise
    finally:
        with ctrl.cond:
            ctrl.prompt_open = False
            ctrl.cond.notify_all()
        if logs is not None:
            logs.hold(False)
    if outcome == "taken over":
        driver = ctrl.driver
        who = driver.label if driver is not None else "`xmesh debug` (a client that already left)"
        io.write(f"\n[xmesh] {who} took over the debugger; "
                 f"{_debug_io.frontend().where} waits for its call and takes the prompt back when that client leaves\n")
        if _debug_io.frontend().leftover_input_note:  # the front end keeps the input box it was given (see README)
            io.write(_debug_io.frontend().leftover_input_note)
        return
    if outcome == "quit" and waiting_for is not None:
        left = ctrl.stopped()
        if left:
            raise DebuggerQuit(_stopped_text(left, "you left the debugger") +
                               "; xmesh.debug() (or %xmesh_debug) opens it again")


def _stopped_text(sessions, why):
    by_actor = {}
    for s in sessions:
        by_actor.setdefault(s.actor, []).append(s.rank)
    names = "; ".join(f"{a} {ranks_text(r)}" for a, r in sorted(by_actor.items()))
    return f"{why} with actors stopped in pdb: {names}"


class _DebugFunction:
    """`xmesh.debug()`: opens the debugger prompt here (for actors stopped while no call waited
    for them). `xmesh.debug.post_mortem(True)`: an unhandled exception in an endpoint stops that
    rank in pdb at the raising frame."""

    def __call__(self) -> None:
        ctrl = controller()
        ctrl.new_stop = False
        open_prompt(waiting_for=None, explicit=True)

    def post_mortem(self, on: bool = True) -> None:
        controller().set_post_mortem(on)

    def sessions(self) -> list[dict]:
        """The stopped sessions as dicts (actor, rank, coords, host, pid, function, file, line, reason)."""
        return [{f: getattr(s, f) for f in ("actor", "rank", "coords", "host", "pid", "function", "file", "line",
                                            "reason")} for s in controller().stopped()]

    def __repr__(self):
        return "<xmesh.debug: call it to open the debugger prompt>"


debug = _DebugFunction()


def _serve_controller(rt):
    """What the controller runtime hears for the debugger: stops, answers and ends of pdb
    sessions, and procs that died (their sessions leave the table)."""
    from .._runtime.process import Kind

    def on_proc_exited(msg):
        ctrl = controller_if_started()
        if ctrl is not None:
            body = msg.proc_exited()
            ctrl.on_proc_exited(body.addr, body.text)

    rt.control.on(Kind.DebugEvent, lambda msg: controller().on_event(msg))
    rt.control.on(Kind.ProcExited, on_proc_exited)


def _post_mortem_env():
    """Procs start with post-mortem stops on when the debugger (or XMESH_POST_MORTEM) says so."""
    ctrl = controller_if_started()
    on = (ctrl is not None and ctrl.post_mortem) or os.environ.get("XMESH_POST_MORTEM") == "1"
    return {"XMESH_POST_MORTEM": "1" if on else "0"}


def _register():
    from .._runtime.process import add_proc_env, on_controller_start
    from .._runtime.wait import add_wake_hook

    on_controller_start(_serve_controller)
    add_proc_env(_post_mortem_env)
    add_wake_hook(on_wait)  # a waiting get(), await or stream opens the prompt for new stops


_register()
