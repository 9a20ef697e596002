"""Future: the result of a call. `get(timeout)` and `await` go through the one wait (_runtime/wait.py):
without the GIL, woken by the call, by output or debugger stops for the main thread, or by
Ctrl-C; a timeout does not consume the future; the outcome is cached."""
import asyncio
import collections
import dataclasses
import functools
import threading
import time
import weakref
from typing import Any, Callable, Dict, Generic, List, Optional, Tuple, TypeVar

from .. import _core
from .._base import context as _context
from .._base import pickling as _pickling
from .._runtime import wait as _wait
from .._base.errors import (ActorError, SupervisionError, TakenOverError, describe_coords, failure_report,
                            shown_remote_traceback)
from .._base.protocol import ErrorKind, error, error_kind, read_error
from .._runtime.process import Kind, get_runtime
from .._base.shape import ranks_text
from .._base.threads import start_thread

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class CallTarget:
    """What errors and waits say about one target of a call: its rank and coordinates in the
    mesh that was called, and what runs there."""
    rank: int
    coords: dict = dataclasses.field(default_factory=dict)
    actor: str = ""      # "Trainer 'trainers'", or "proc"
    actor_id: str = ""   # the actor's id on its proc ("" for procs)
    mesh: str = ""       # the actor mesh's name ("trainers"), as Monarch's texts name it


def error_from(body: Any, frames: Any, target: "CallTarget | None", method: str = "") -> BaseException:
    """Turns an error reply (or a supervision failure) into the exception the caller sees, in
    Monarch's words first ("Actor call mesh.method failed", "Endpoint call mesh.method() failed,
    The actor ... and all its descendants have failed:"), then xmesh's (where, the traceback)."""
    kind = error_kind(body) or ErrorKind.Actor
    err = read_error(body)
    info = err.info if isinstance(err.info, dict) else {}
    rank = target.rank if target else err.rank
    coords = (target.coords if target else None) or err.coords or {}
    actor = (target.actor if target else None) or err.actor
    mesh = (target.mesh if target else "") or info.get("mesh") or ""
    where = f"{actor} " if actor else ""
    where += f"rank {rank} {describe_coords(coords)}".rstrip()
    if kind in (ErrorKind.Supervision, ErrorKind.NoActor):
        return _supervision_error(kind, err, info, where, mesh, method, rank, coords, actor)
    if kind == ErrorKind.TakenOver:
        return TakenOverError(f"{where}: {err.text or 'the allocation was taken over'}")
    if kind == ErrorKind.Cancelled:
        return asyncio.CancelledError(f"{where}: cancelled")
    exc = None
    if frames:
        try:
            exc = _pickling.loads(frames)
        except Exception:
            exc = None
    tb, host, method = shown_remote_traceback(err.traceback or ""), err.host, err.method or method
    head = f"Actor call {mesh or '?'}.{method or '?'} failed: " + (f"{where} on {host}" if host else where)
    msg = f"{head}:\n{tb.rstrip()}" if tb else f"{head}: {err.text}"
    return ActorError(msg, exception=exc, rank=rank, coords=coords, host=host, actor=actor, method=method,
                      remote_traceback=tb)


def _supervision_error(kind: ErrorKind, err: Any, info: dict, where: str, mesh: str, method: str, rank: Any,
                       coords: dict, actor: Any) -> SupervisionError:
    """The actor a call needed is gone. A failed or stopped actor's tombstone is a whole report
    (info.report); the runtime's words for a proc or host that died are put in Monarch's."""
    text = err.text or "its proc died"
    if not info.get("report"):
        if kind == ErrorKind.NoActor:
            text = f"Supervision event: actor {where} has status: gone ({text})"
        else:
            text = failure_report(where, text)
    endpoint = f"{mesh}.{method}()" if mesh and method else None
    e = SupervisionError(f"Endpoint call {endpoint} failed, {text}" if endpoint else text, endpoint=endpoint,
                         rank=rank, coords=coords, host=info.get("host") or err.host, actor=actor)
    e.proc_died = kind == ErrorKind.Supervision and not info.get("report")
    return e


class WeakValue:
    """A Future value that the Future does not keep alive: `get()` calls `make()` each time.
    A mesh's readiness Future resolves to the mesh; holding it strongly would make a cycle
    (mesh -> future -> mesh) that keeps an unreferenced allocation's procs running until the
    cyclic garbage collector happens to run."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


def all_ok_then(value):
    """A Future converter: raise the first failed target's error, else resolve to value."""

    def convert(results, fut):
        for index in sorted(results):
            ok, body, frames = results[index]
            if not ok:
                raise fut.error_for(index, body, frames)
        return value

    return convert


def live_or_rebuilt(mesh, rebuild):
    """A readiness Future's value: the mesh itself while it lives, else an equal handle from
    rebuild() (which must not reference the mesh or the Future: see WeakValue)."""
    ref = weakref.ref(mesh)
    return WeakValue(lambda: ref() or rebuild())


def show_output_of(rt, call, replies):
    """The flush barrier: what the targets printed before they answered is shown before their
    results are returned. replies: (index, body) of answers; those of calls that printed carry
    the seq of their output marker (body "m")."""
    if rt.logs is None:  # a proc calling other actors: its own output is its host agent's
        return
    marks = [(call.target_addr(i), body["m"]) for i, body in replies if body and body.get("m")]
    if marks:
        rt.logs.barrier(marks)
        _wait.show_output()


def check_timeout(timeout):
    """A timeout is None (no limit) or a number of seconds >= 0."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if not timeout >= 0:  # also NaN
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")


class Done:
    """An awaitable that is already resolved (what a settings call such as logging_option
    returns, so that `await mesh.logging_option(...)` works as in Monarch)."""

    def __init__(self, value):
        self._value = value

    def get(self, timeout: Optional[float] = None) -> Any:
        return self._value

    result = get

    def done(self) -> bool:
        return True

    def __await__(self):
        return self._value
        yield  # noqa: unreachable; makes this a generator

    def __repr__(self):
        return "<xmesh.Future done>"


@dataclasses.dataclass(eq=False)
class _Sent:
    """A call to actors that may still run (see _SentCalls)."""
    call: Any
    targets: List[CallTarget]
    description: str
    cell: str
    at: float

    def key(self, index: int) -> Optional[Tuple[str, str]]:
        """(proc address, actor id) of a target that is an actor; None for a proc."""
        t = self.targets[index] if index < len(self.targets) else None
        return (self.call.target_addr(index), t.actor_id) if t is not None and t.actor_id else None

    def finished(self) -> bool:
        """Nothing of it runs any more (a cancelled target runs until its own answer comes)."""
        return self.call.settled or self.call.fatal


class _SentCalls:
    """This controller's calls to actors that may still run, oldest first. An actor handles one
    message at a time, so a rank of a call whose actor still has an earlier call unanswered is
    queued behind that call, not running: waits and interrupts say so (issue 17)."""

    MAX = 512  # the newest calls are enough to explain a wait

    def __init__(self) -> None:
        self._calls: "collections.OrderedDict[int, _Sent]" = collections.OrderedDict()

    def add(self, sent: _Sent) -> None:
        self._calls[sent.call.id] = sent
        while len(self._calls) > self.MAX:
            self._calls.popitem(last=False)

    def discard(self, call_id: int) -> None:
        self._calls.pop(call_id, None)

    def get(self, call_id: int) -> Optional[_Sent]:
        return self._calls.get(call_id)

    def blockers(self, sent: _Sent) -> Dict[int, _Sent]:
        """{index: the earlier call its actor still runs} for the targets of sent that wait."""
        busy: Dict[Tuple[str, str], _Sent] = {}
        for call_id, earlier in list(self._calls.items()):
            if call_id >= sent.call.id:
                break
            if earlier.finished():
                self.discard(call_id)
                continue
            for i in earlier.call.running():
                key = earlier.key(i)
                if key is not None:
                    busy.setdefault(key, earlier)  # the oldest is the one running
        found = {}
        for i in sent.call.missing():
            key = sent.key(i)
            if key is not None and key in busy:
                found[i] = busy[key]
        return found


_sent = _SentCalls()


def track_sent(call: Any, targets: List[CallTarget], description: str) -> None:
    """A call nobody waits on (a broadcast) whose actors still run it: a later call's wait says
    that it queues behind it."""
    if any(t.actor_id for t in targets):
        _sent.add(_Sent(call, targets, description, _context.controller_cell, time.monotonic()))

# Procs whose death an error given to the caller named (their own notice is then not needed).
_reported_deaths: "collections.OrderedDict[str, None]" = collections.OrderedDict()


def _note_reported_death(addr: str) -> None:
    _reported_deaths[addr] = None
    while len(_reported_deaths) > 1024:
        _reported_deaths.popitem(last=False)


def death_reported(addr: str) -> bool:
    return addr in _reported_deaths


def _queued_behind(sent: _Sent) -> "list[tuple[_Sent, list[int]]]":
    by_blocker: "dict[int, tuple[_Sent, list[int]]]" = {}
    for i, earlier in _sent.blockers(sent).items():
        t = sent.targets[i] if i < len(sent.targets) else None
        by_blocker.setdefault(earlier.call.id, (earlier, []))[1].append(t.rank if t is not None else i)
    return list(by_blocker.values())


_queue_noticed: "collections.OrderedDict[int, set]" = collections.OrderedDict()


def _notice_queued_calls(call: Any, description: str) -> None:
    """A wait that goes on says, once per earlier call, that its ranks have not started: their
    actors still run an earlier call (after an interrupted get(), the call it left running)."""
    sent = _sent.get(call.id)
    if sent is None:
        return
    said = _queue_noticed.setdefault(call.id, set())
    while len(_queue_noticed) > 64:
        _queue_noticed.popitem(last=False)
    for earlier, ranks in _queued_behind(sent):
        if earlier.call.id in said:
            continue
        said.add(earlier.call.id)
        age = time.monotonic() - earlier.at
        one = len(ranks) == 1
        cancelled = " (cancelled, but still inside a C call that Python cannot interrupt)" \
            if earlier.call.lingering() else ""
        get_runtime().diag(f"{description} waits: {ranks_text(ranks)} {'has' if one else 'have'} not started it, "
                           f"{'its actor still runs' if one else 'their actors still run'} {earlier.description}"
                           f"{cancelled} (sent {age:.0f} s ago); an actor handles one message at a time")


_wait.add_slow_wait_hook(_notice_queued_calls)


class Future(Generic[T]):
    """The eventual result of a call (`Future[int]` in annotations, as in Monarch).
    `convert(results)` turns the list of (index, ok, body, frames) into the value; targets
    describes each index (rank, coords, actor) for errors."""

    def __init__(self, call: Any, convert: Callable[[dict, "Future"], Any],
                 targets: Optional[list[CallTarget]] = None, description: str = "call", keepalive: Any = None,
                 method: str = "") -> None:
        self._call = call
        self._method = method  # the endpoint called ("" for spawns and proc requests): errors name it
        # What the call needs alive until it finishes: the lease of an unnamed allocation,
        # whose procs would otherwise stop under the call when its meshes were temporaries.
        self._keepalive = keepalive
        self._convert = convert
        self._targets = targets or []
        self._description = description
        self._results: dict = {}
        self._done = False
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._sent = _Sent(call, self._targets, description, _context.controller_cell, time.monotonic())
        if any(t.actor_id for t in self._targets):
            _sent.add(self._sent)

    @classmethod
    def _from_coro(cls, coro: Any) -> "Future[Any]":
        """A Future of one coroutine object (Monarch's private constructor, which code written
        for Monarch uses): a CoroutineFuture, run when first observed."""
        return CoroutineFuture(lambda: coro, getattr(coro, "__qualname__", "coroutine"))

    # -- waiting ---------------------------------------------------------------------------
    def _collect(self):
        for index, ok, body, frames in self._call.take():
            self._results[index] = (ok, body, frames)

    def _finish(self):
        if self._done:
            return
        self._collect()
        rt = get_runtime()
        if not self._call.lingering():  # a cancelled target's own answer says when it ended
            _sent.discard(self._call.id)
            rt.node.forget_call(self._call.id)
        self._wait_for_output(rt)
        try:
            self._value = self._convert(self._results, self)
        except BaseException as e:  # errors are cached like values
            self._error = e
        self._results = {}
        self._done = True
        self._keepalive = None

    def _wait_for_output(self, rt):
        show_output_of(rt, self._call, ((i, body) for i, (ok, body, frames) in self._results.items()))

    @property
    def description(self) -> str:
        """What this is the result of, as errors name it ("step.call()")."""
        return self._description

    def release(self) -> None:
        """Its results were taken another way (a stream): what it kept alive may go."""
        self._keepalive = None

    def target(self, index: int) -> "CallTarget | None":
        return self._targets[index] if index < len(self._targets) else None

    def error_for(self, index: int, body: Any, frames: Any) -> BaseException:
        err = error_from(body, frames, self.target(index), self._method)
        if isinstance(err, SupervisionError) and err.proc_died:
            _note_reported_death(self._call.target_addr(index))
        return err

    def _rank(self, index: int) -> int:
        t = self.target(index)
        return t.rank if t is not None else index

    @property
    def cell(self) -> str:
        """The notebook cell that made the call ("" outside the kernel)."""
        return self._sent.cell

    def pending_ranks(self) -> list[int]:
        """Ranks that have not answered (running, or queued behind an earlier call)."""
        return [self._rank(i) for i in self._call.missing()]

    def dead_unanswered(self) -> list[str]:
        """"rank 0: proc rank 0 (pid 42) was killed by SIGKILL" for the targets that had not
        answered when the call failed, whose procs are known dead."""
        rt = get_runtime()
        out = []
        for i in self._call.missing():
            addr = self._call.target_addr(i)
            reason = rt.node.dead_reason(addr)
            if reason is not None:
                out.append(f"rank {self._rank(i)}: {read_error(reason).text or 'its proc died'}")
                _note_reported_death(addr)
        return out

    def running_ranks(self) -> list[int]:
        """Ranks that have not answered and are not queued behind an earlier call."""
        queued = _sent.blockers(self._sent)
        return [self._rank(i) for i in self._call.missing() if i not in queued]

    def queued_behind(self) -> "list[tuple[_Sent, list[int]]]":
        """[(an earlier call, ranks of this one waiting behind it)]."""
        return _queued_behind(self._sent)

    def lingering_ranks(self) -> list[int]:
        """Ranks cancelled (cancel()) that have not ended the call yet: a sync endpoint inside a
        C call (time.sleep, a blocking read) runs on until that call returns."""
        return [self._rank(i) for i in self._call.lingering()]

    def describe_pending(self) -> str:
        """"ranks still running: [0, 1]; ranks [2, 3] queued behind X" (what an interrupt or a
        timeout leaves behind)."""
        parts = []
        running = self.running_ranks()
        if running:
            parts.append(f"ranks still running: {running}")
        for earlier, ranks in self.queued_behind():
            parts.append(f"{ranks_text(ranks)} not started, queued behind {earlier.description}")
        return "; ".join(parts) if parts else "every rank had answered (get() returns the result)"

    def get(self, timeout: Optional[float] = None) -> Any:
        """Waits for the result (seconds; None: no limit). Raises TimeoutError without
        consuming the future, KeyboardInterrupt naming the ranks still running on Ctrl-C."""
        check_timeout(timeout)
        if not self._done:
            try:
                ready = self._wait(timeout)
            except KeyboardInterrupt:
                raise self.interrupted_error() from None
            if not ready:
                raise TimeoutError(f"{self._description} did not finish within {timeout} s; "
                                   f"{self.describe_pending()}")
            self._finish()
        if self._error is not None:
            raise self._error
        return self._resolved()

    result = get

    def interrupted_error(self) -> KeyboardInterrupt:
        """Ctrl-C broke a wait on this future: the calls go on (a second interrupt or cancel()
        stops them); the error names the ranks still running."""
        _wait.interrupted(self)
        pending = self.describe_pending()
        hint = f" ({_wait.cancel_hint()})" if self._call.missing() else ""
        return KeyboardInterrupt(f"interrupted while waiting for {self._description}; {pending}{hint}")

    def _wait(self, timeout):
        """The one wait (_wait.wait_call): on the main thread it also shows the procs' output
        as it comes and opens the debugger prompt for actors that stopped in pdb (DESIGN §7)."""
        return _wait.wait_call(self._call, timeout, self._description)

    def _resolved(self):
        v = self._value
        return v.make() if isinstance(v, WeakValue) else v

    def done(self) -> bool:
        return self._done or self._call.done or self._call.fatal

    def cancel(self) -> bool:
        """Cancels the ranks still running: async endpoints see CancelledError, sync ones an
        asynchronous exception (raised when they next run Python code). A future not yet
        finished then raises CancelledError; one that already failed because a proc died keeps
        that error, and its other ranks stop. Returns False if nothing was running."""
        missing = list(self._call.missing())
        if not missing:
            return False
        targets = [(i, self._call.target_addr(i), t.actor_id if (t := self.target(i)) is not None else "")
                   for i in missing]
        # Failed here before the Cancel messages leave: an actor's answer to them (a cancelled
        # endpoint's error) that comes back first must not become this future's outcome. The
        # targets count as running until that answer comes (lingering_ranks()).
        self._call.cancel_all(error(ErrorKind.Cancelled, "cancelled by the caller"))
        if not self._done:
            self._finish()
        rt = get_runtime()
        for i, addr, actor in targets:
            try:
                rt.node.send(addr, int(Kind.Cancel), _core.CancelBody(corr=self._call.id, index=i).to_dict(),
                             actor=actor)
            except Exception:
                pass
        return True

    def __await__(self):
        if not self._done:
            try:
                yield from _wait.wait_call_async(self._call, self._description).__await__()
            except KeyboardInterrupt:
                raise self.interrupted_error() from None
            self._finish()
        if self._error is not None:
            raise self._error
        return self._resolved()

    def __repr__(self):
        state = "done" if self._done else f"{self._call.received}/{len(self._call)} answered"
        return f"<xmesh.Future {self._description}: {state}>"


class LocalFuture(Future[T]):
    """A Future with no call of actors underneath (a coroutine's, a stream reply, a port
    receiver's): what a call's Future says of its ranks, it has none of. Its outcome, once known,
    is `_outcome` = (True, value) or (False, the error); subclasses set it instead of Future's
    state and provide get, __await__, cancel and describe_pending."""

    _outcome: Optional[Tuple[bool, Any]] = None

    def _result(self) -> Any:
        assert self._outcome is not None
        ok, value = self._outcome
        if not ok:
            raise value
        return value

    def done(self) -> bool:
        return self._outcome is not None

    def release(self) -> None:
        pass

    def target(self, index: int) -> "CallTarget | None":
        return None

    @property
    def cell(self) -> str:
        return ""

    def pending_ranks(self) -> list[int]:
        return []

    running_ranks = pending_ranks
    lingering_ranks = pending_ranks

    def dead_unanswered(self) -> list[str]:
        return []

    def queued_behind(self) -> "list[tuple[_Sent, list[int]]]":
        return []


class CoroutineFuture(LocalFuture[T]):
    """The Future of a coroutine (Monarch's `returns_future`, `Accumulator`): nothing runs until
    it is first observed; `await` runs it on the awaiting loop, `get()` on a loop of its own in
    the calling thread (in a helper thread when that thread already runs a loop). It runs once;
    its outcome is kept, and a `get()` that times out leaves it to finish at the next one."""

    def __init__(self, make: Callable[[], Any], description: str) -> None:
        # No call underneath: Future's call-specific state is not set, and not used.
        self._make = make
        self._description = description
        self._outcome: Optional[Tuple[bool, Any]] = None
        self._task: Optional[asyncio.Task] = None
        self._task_loop: Optional[asyncio.AbstractEventLoop] = None
        self._private_loop: Optional[asyncio.AbstractEventLoop] = None
        self._lock = threading.Lock()

    async def _body(self) -> None:
        try:
            self._outcome = (True, await self._make())
        except (Exception, asyncio.CancelledError) as e:
            self._outcome = (False, e)

    def get(self, timeout: Optional[float] = None) -> Any:
        check_timeout(timeout)
        if self._outcome is None:
            if asyncio._get_running_loop() is None:
                self._run_privately(timeout)
            else:  # this thread's loop is busy running the caller: a helper thread runs it
                failed: list = []
                helper = threading.Thread(target=self._run_in_helper, args=(timeout, failed), daemon=True,
                                          name="xmesh-future")
                start_thread(helper)
                helper.join()
                if failed:
                    raise failed[0]
        return self._result()

    result = get

    def _run_in_helper(self, timeout: Optional[float], failed: list) -> None:
        try:
            self._run_privately(timeout)
        except BaseException as e:  # raised again in the caller's thread
            failed.append(e)

    def _run_privately(self, timeout: Optional[float]) -> None:
        with self._lock:
            if self._outcome is not None:
                return
            if self._task is not None and self._task_loop is not self._private_loop:
                raise RuntimeError(f"{self._description} is being awaited on another event loop: await it there")
            if self._private_loop is None:
                self._private_loop = self._task_loop = asyncio.new_event_loop()
                self._task = self._private_loop.create_task(self._body())
            assert self._task is not None
            self._private_loop.run_until_complete(asyncio.wait([self._task], timeout=timeout))
            if not self._task.done():
                raise TimeoutError(f"{self._description} did not finish within {timeout} s")
            self._private_loop.close()

    def describe_pending(self) -> str:
        if self._outcome is not None:
            return "done"
        return "running" if self._task is not None else "not started (it starts when first observed)"

    def cancel(self) -> bool:
        """Cancels the coroutine if it runs (it then raises CancelledError); False otherwise."""
        if self._outcome is not None or self._task is None:
            return False
        self._task.cancel()
        return True

    def __await__(self):
        if self._outcome is None:
            loop = asyncio.get_running_loop()
            if self._task is None:
                self._task_loop = loop
                self._task = loop.create_task(self._body())
            if self._task_loop is loop:
                # Shielded: an awaiter that is cancelled leaves the run to the others.
                yield from asyncio.shield(self._task).__await__()
            else:  # a get() started it on its own loop: finished there, off this loop
                yield from loop.run_in_executor(None, self.get).__await__()
        return self._result()

    def __repr__(self):
        return f"<xmesh.Future {self._description}: {'done' if self._outcome is not None else 'not done'}>"


def returns_future(fn: Callable[..., Any]) -> Callable[..., "CoroutineFuture"]:
    """Monarch's decorator: an `async def` whose calls return a Future (`.get()` or `await`),
    run when that Future is first observed."""
    if not asyncio.iscoroutinefunction(fn):
        raise TypeError(f"returns_future decorates an async def, not {fn!r}")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> CoroutineFuture:
        return CoroutineFuture(lambda: fn(*args, **kwargs), f"{getattr(fn, '__qualname__', 'coroutine')}()")

    return wrapper


class Readiness:
    """What a mesh that becomes usable later shares (ProcMesh: its procs run; ActorMesh: every
    __init__ ran): `.initialized` is the Future that says so and awaiting the mesh waits for it.
    The Future resolves to the mesh itself (or, once the handle is gone, an equal one rebuilt),
    so it is set after the mesh exists."""

    _ready: "Optional[Future]" = None

    def ready_when(self, call: Any, rebuild: Callable[[], Any], described: list, what: str) -> "Future":
        """Readiness is `call` answered ok by every target (`described`); `rebuild` makes an
        equal handle without referencing this one (see WeakValue)."""
        self._ready = Future(call, all_ok_then(live_or_rebuilt(self, rebuild)), described, what)
        return self._ready

    @property
    def initialized(self) -> "Optional[Future]":
        """A Future that resolves once the mesh is usable (raises if a target failed)."""
        return self._ready

    def __await__(self):
        if self._ready is not None:
            yield from self._ready.__await__()
        return self
