"""Future: the result of a call. `get(timeout)` and `await` go through the one wait (_wait.py):
without the GIL, woken by the call, by output or debugger stops for the main thread, or by
Ctrl-C; a timeout does not consume the future; the outcome is cached."""
import asyncio

from . import _core, _pickling, _wait
from ._errors import ActorError, SupervisionError, TakenOverError, describe_coords
from ._protocol import ErrorKind, error, error_kind
from ._runtime import Kind, get_runtime


def _error_from(body, frames, target):
    """Turns an error reply (or a supervision failure) into the exception the caller sees."""
    kind = error_kind(body) or ErrorKind.Actor
    rank = target.get("rank") if target else body.get("rank")
    coords = (target or {}).get("coords") or body.get("coords") or {}
    actor = (target or {}).get("actor") or body.get("actor")
    where = f"{actor} " if actor else ""
    where += f"rank {rank} {describe_coords(coords)}".rstrip()
    if kind == ErrorKind.Supervision:
        info = body.get("info", {})
        return SupervisionError(f"{where}: {body.get('text', 'proc died')}", rank=rank, coords=coords,
                                host=info.get("host"), actor=actor)
    if kind == ErrorKind.TakenOver:
        return TakenOverError(f"{where}: {body.get('text', 'the allocation was taken over')}")
    if kind == ErrorKind.Cancelled:
        return asyncio.CancelledError(f"{where}: cancelled")
    exc = None
    if frames:
        try:
            exc = _pickling.loads(frames)
        except Exception:
            exc = None
    tb = body.get("traceback")
    host = body.get("host")
    method = body.get("method")
    head = f"{where} on {host}" if host else where
    if method:
        head += f" failed in endpoint {method}()"
    text = body.get("text", "")
    msg = f"{head}:\n{tb.rstrip()}" if tb else f"{head}: {text}"
    return ActorError(msg, exception=exc, rank=rank, coords=coords, host=host, actor=actor, method=method,
                      remote_traceback=tb)


class WeakValue:
    """A Future value that the Future does not keep alive: `get()` calls `make()` each time.
    A mesh's readiness Future resolves to the mesh; holding it strongly would make a cycle
    (mesh -> future -> mesh) that keeps an unreferenced allocation's procs running until the
    cyclic garbage collector happens to run."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


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

    def get(self, timeout=None):
        return self._value

    result = get

    def done(self):
        return True

    def __await__(self):
        return self._value
        yield  # noqa: unreachable; makes this a generator

    def __repr__(self):
        return "<xmesh.Future done>"


class Future:
    """The eventual result of a call. `convert(results)` turns the list of (index, ok, body,
    frames) into the value; targets describes each index (rank, coords, actor) for errors."""

    def __init__(self, call, convert, targets=None, description="call", keepalive=None):
        self._call = call
        # What the call needs alive until it finishes: the lease of an unnamed allocation,
        # whose procs would otherwise stop under the call when its meshes were temporaries.
        self._keepalive = keepalive
        self._convert = convert
        self._targets = targets or []
        self._description = description
        self._results = {}
        self._done = False
        self._value = None
        self._error = None

    # -- waiting ---------------------------------------------------------------------------
    def _collect(self):
        for index, ok, body, frames in self._call.take():
            self._results[index] = (ok, body, frames)

    def _finish(self):
        if self._done:
            return
        self._collect()
        rt = get_runtime()
        rt.node.forget_call(self._call.id)
        self._wait_for_output(rt)
        try:
            self._value = self._convert(self._results, self)
        except BaseException as e:  # errors are cached like values
            self._error = e
        self._results = None
        self._done = True
        self._keepalive = None

    def _wait_for_output(self, rt):
        show_output_of(rt, self._call, ((i, body) for i, (ok, body, frames) in self._results.items()))

    def target(self, index):
        return self._targets[index] if index < len(self._targets) else {}

    def error_for(self, index, body, frames):
        return _error_from(body, frames, self.target(index))

    def running_ranks(self):
        return [self.target(i).get("rank", i) for i in self._call.missing()]

    def get(self, timeout=None):
        """Waits for the result (seconds; None: no limit). Raises TimeoutError without
        consuming the future, KeyboardInterrupt naming the ranks still running on Ctrl-C."""
        check_timeout(timeout)
        if not self._done:
            try:
                ready = self._wait(timeout)
            except KeyboardInterrupt:
                _wait.interrupted(self)
                ranks = self.running_ranks()
                raise KeyboardInterrupt(f"interrupted while waiting for {self._description}; ranks still running: "
                                        f"{ranks} ({_wait.cancel_hint()})") from None
            if not ready:
                raise TimeoutError(f"{self._description} did not finish within {timeout} s; "
                                   f"ranks still running: {self.running_ranks()}")
            self._finish()
        if self._error is not None:
            raise self._error
        return self._resolved()

    result = get

    def _wait(self, timeout):
        """The one wait (_wait.wait_call): on the main thread it also shows the procs' output
        as it comes and opens the debugger prompt for actors that stopped in pdb (DESIGN §7)."""
        return _wait.wait_call(self._call, timeout, self._description)

    def _resolved(self):
        v = self._value
        return v.make() if isinstance(v, WeakValue) else v

    def done(self):
        return self._done or self._call.done or self._call.fatal

    def cancel(self):
        """Cancels the ranks still running: async endpoints see CancelledError, sync ones an
        asynchronous exception (raised when they next run Python code). A future not yet
        finished then raises CancelledError; one that already failed because a proc died keeps
        that error, and its other ranks stop. Returns False if nothing was running."""
        if not self._call.missing():
            return False
        rt = get_runtime()
        for i in self._call.missing():
            addr = self._call.target_addr(i)
            try:
                rt.node.send(addr, int(Kind.Cancel), _core.CancelBody(self._call.id, i).to_dict(),
                             actor=self.target(i).get("actor_id", ""))
            except Exception:
                pass
        if not self._done:
            self._call.fail_all(error(ErrorKind.Cancelled, "cancelled by the caller"))
            self._finish()
        return True

    def __await__(self):
        if not self._done:
            yield from _wait.wait_call_async(self._call, self._description).__await__()
            self._finish()
        if self._error is not None:
            raise self._error
        return self._resolved()

    def __repr__(self):
        state = "done" if self._done else f"{self._call.received}/{len(self._call)} answered"
        return f"<xmesh.Future {self._description}: {state}>"
