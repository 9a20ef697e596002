"""Exceptions a caller sees, and the tracebacks shown with them: the user's frames only, xmesh's
own frames left out unless XMESH_DEBUG_TRACEBACKS=1 (on the proc side for remote tracebacks, in
the kernel for local ones)."""
import os
import textwrap
import traceback
import types
from typing import Any, Callable, List, Optional

from .. import _core
from . import pickling as _pickling
from .protocol import ErrorKind, error
from .shape import Point, format_coords

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # xmesh/, above _base/


def show_internal_frames() -> bool:
    """XMESH_DEBUG_TRACEBACKS, read when used (a forked proc's environment is set after imports)."""
    return os.environ.get("XMESH_DEBUG_TRACEBACKS", "") not in ("", "0")


def internal_frame(filename: str) -> bool:
    """Whether a frame is xmesh's own code (not the user's)."""
    return filename.startswith(_PACKAGE_DIR)


def without_internal_frames(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """The traceback without xmesh's frames (a new chain; frames are shared)."""
    kept: List[types.TracebackType] = []
    while tb is not None:
        if not internal_frame(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def hide_internal_frames(exc: BaseException) -> Optional[types.TracebackType]:
    """Strips xmesh's frames from exc and the exceptions chained to it (unless asked not to);
    returns exc's new traceback."""
    if show_internal_frames():
        return exc.__traceback__
    seen = set()
    e: Optional[BaseException] = exc
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = without_internal_frames(e.__traceback__)
        stack.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return exc.__traceback__


def actor_fields(ctx: Any) -> dict:
    """The error body's fields naming where an actor runs (ctx: its ActorContext, or None):
    its name, rank and coordinates."""
    if ctx is None:
        return {}
    where: dict = {"rank": ctx.rank, "actor": ctx.name}
    try:
        where["coords"] = dict(Point(ctx.rank, ctx.shape))
    except Exception:
        pass
    return where


def error_reply(exc: BaseException, ctx: object, method: str) -> "tuple[dict, Optional[bytes]]":
    """(body, frames) of the reply an endpoint's exception makes: kind Actor, the text, the
    user's traceback, where it ran (ctx: the actor's ActorContext, or None); frames hold the
    pickled exception when it also unpickles (else the caller gets the text only)."""
    where = actor_fields(ctx)
    if ctx is not None:
        where["info"] = {"mesh": ctx.mesh_name}  # type: ignore[attr-defined]
    body = error(ErrorKind.Actor, str(exc), type=type(exc).__name__, traceback=format_user_traceback(exc),
                 host=_core.hostname(), method=method, pid=os.getpid(), **where)
    try:
        frames = _pickling.dumps(exc)
        _pickling.loads(frames)  # an exception that pickles but cannot be rebuilt: send text only
    except Exception:
        frames = None
    return body, frames


def format_user_traceback(exc: BaseException) -> str:
    """The traceback text of exc as the user should read it (an endpoint's error)."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    if not show_internal_frames():
        seen = set()
        stack: list = [te]
        while stack:
            t = stack.pop()
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            t.stack = traceback.StackSummary.from_list([f for f in t.stack if not internal_frame(f.filename)])
            stack.extend((t.__cause__, t.__context__))
    return "".join(te.format())


# How remote traceback text is shown here: the kernel turns frames of its notebook cells into
# "Cell In [n]" with their source (injected, as xeus injects its publisher).
_remote_traceback_filter: List[Callable[[str], str]] = []


def set_remote_traceback_filter(fn: Callable[[str], str]) -> None:
    _remote_traceback_filter[:] = [fn]


def shown_remote_traceback(text: str) -> str:
    for fn in _remote_traceback_filter:
        try:
            text = fn(text)
        except Exception:
            pass
    return text


class ActorError(Exception):
    """An endpoint raised. Carries the remote traceback, the rank and coordinates of the actor
    that raised, its host, and the original exception when it could be unpickled."""

    def __init__(self, message, *, exception=None, rank=None, coords=None, host=None,
                 actor=None, method=None, remote_traceback=None, failures=1):
        super().__init__(message)
        self.exception = exception
        self.rank = rank
        self.coords = coords or {}
        self.host = host
        self.actor = actor
        self.method = method
        self.remote_traceback = remote_traceback
        self.failures = failures


class SupervisionError(ActorError, RuntimeError):
    """An actor the call needed is gone: it failed (its __init__ raised, an endpoint raised a
    BaseException or an error nobody could receive, it aborted, it did not handle a failure of
    actors it owns), it was stopped, or its proc or host died. As in Monarch it is a
    RuntimeError, and its text holds Monarch's report ("The actor X and all its descendants have
    failed:" and why); it is also an ActorError (xmesh's callers catch both alike).
    `endpoint` is "mesh.method()" of the call that met it (None outside a call)."""

    def __init__(self, message, endpoint=None, **fields):
        super().__init__(message, **fields)
        self.endpoint = endpoint
        self.proc_died = False  # the actor's proc (or host) died, rather than the actor alone


def failure_report(actor: str, reason: str) -> str:
    """Monarch's report of a failed actor: "The actor X and all its descendants have failed:",
    then why, indented (what a SupervisionError and MeshFailure.report() say)."""
    return f"The actor {actor} and all its descendants have failed:\n{textwrap.indent(reason.rstrip(), '  ')}"


def stopped_report(actor: str, how: str) -> str:
    """Monarch's words for a call to an actor that was stopped."""
    return f"Supervision event: actor {actor} has status: stopped ({how})"


class TakenOverError(RuntimeError):
    """A named allocation this controller used was attached by another controller, which now
    owns it; its procs refuse this one's calls."""


class MeshFailure:
    """A failure of actors that their owner gets (Monarch's MeshFailure): an actor failed
    ("actor": see SupervisionError), a proc died ("proc"), a host agent was lost ("host"). The
    owner is the actor that spawned the failed mesh (its __supervise__) or, for meshes the
    program spawned, the unhandled fault hook. `mesh_name` names the actor mesh or allocation,
    `report()` says what happened; str() is Monarch's "MeshFailure(mesh_name=..., crashed_ranks=[...],
    event=...)"."""

    def __init__(self, mesh_name: str, text: str, kind: str, rank: Optional[int] = None, cell: str = "") -> None:
        self.mesh_name = mesh_name
        self.kind = kind
        self.rank = rank
        self.cell = cell  # the notebook cell whose call it follows ("" when none)
        self._text = text

    @property
    def mesh(self) -> str:
        """What failed, by name (Monarch gives the mesh object; xmesh the name it goes by)."""
        return self.mesh_name

    def report(self) -> str:
        return self._text

    @property
    def crashed_ranks(self) -> "list[int]":
        return [] if self.rank is None else [self.rank]

    def __str__(self) -> str:
        return f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks={self.crashed_ranks}, event={self._text})"

    __repr__ = __str__


def describe_coords(coords):
    return f"({format_coords(coords)})" if coords else ""
