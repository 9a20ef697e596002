"""An actor's life as Monarch defines it, for the actor host (actor_host.py): which errors end an
actor, the report its failure makes ("The actor X and all its descendants have failed: ..."), the
answer its later messages get, and the hooks a class may define (`__supervise__` for failures of
the actors it owns, `__cleanup__` when it ends). docs/architecture/13-actor-lifecycle.md has
the rules; this module only phrases and decides, it sends nothing."""
import asyncio
import os
from typing import Any, Callable, Optional

from .. import _core
from .._api.actor import overrides_hook
from .._base.errors import actor_fields, failure_report, format_user_traceback, stopped_report
from .._base.protocol import ErrorKind, error
from .._base.shape import Point, format_coords

SUPERVISE = "__supervise__"  # the method name of the wake-up a sync actor gets for a failure of its children


def describe_actor(ctx: Any) -> str:
    """"Trainer 'trainers' rank 3 (gpus=3) on host1": who failed, in reports."""
    if ctx is None:
        return "an actor whose spawn failed"
    try:
        coords = format_coords(dict(Point(ctx.rank, ctx.shape)))
    except Exception:
        coords = ""
    return f"{ctx.name} rank {ctx.rank}" + (f" ({coords})" if coords else "") + f" on {_core.hostname()}"


def fatal_reason(exc: BaseException, method: str, unanswerable: str) -> Optional[str]:
    """Why exc, raised by endpoint `method`, ends its actor (None: the caller gets it as an
    ActorError and the actor lives on). A BaseException that is not an Exception always ends it;
    an Exception does when nobody can receive it (unanswerable says why: a broadcast, an
    explicit-port endpoint that raised instead of answering; "" when its caller gets it)."""
    if isinstance(exc, (asyncio.CancelledError, SystemExit)):
        return None  # a cancellation is answered as one; SystemExit ends the whole proc
    tb = format_user_traceback(exc)
    if not isinstance(exc, Exception):
        return f"Actor call {method}() failed with BaseException ({type(exc).__name__}), which ends the actor:\n{tb}"
    if unanswerable:
        return f"Actor call {method}() failed and nobody could receive the error ({unanswerable}):\n{tb}"
    return None


def init_failed(exc: BaseException) -> str:
    return f"__init__ raised:\n{format_user_traceback(exc)}"


def aborted(reason: Optional[str]) -> str:
    return f"it aborted itself (context().actor_instance.abort()): {reason or 'no reason provided'}"


def unhandled_child_failure(ctx: Any, child_report: str) -> str:
    """The report of an owner that did not handle its child's failure (Monarch's words)."""
    return (f"The actor {describe_actor(ctx)} failed because it did not handle a supervision event from its "
            f"child. The event was:\n" + _indent(child_report))


def supervise_raised(ctx: Any, exc: BaseException, child_report: str) -> str:
    return failure_report(describe_actor(ctx), f"__supervise__ raised:\n{format_user_traceback(exc)}"
                          "This error occurred while handling another failure:\n" + _indent(child_report))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.rstrip().splitlines())


def tombstone(ctx: Any, text: str, mesh: str) -> dict:
    """The Supervision error body every later message to a failed or stopped actor is answered
    with (info.report: the text is a whole report, shown as it is)."""
    return error(ErrorKind.Supervision, text, host=_core.hostname(), pid=os.getpid(),
                 info={"mesh": mesh, "report": True}, **actor_fields(ctx))


def stopped(ctx: Any, how: str, mesh: str) -> dict:
    return tombstone(ctx, stopped_report(describe_actor(ctx), how), mesh)


def user_hook(instance: Any, name: str) -> Optional[Callable]:
    """The instance's own __supervise__ / __cleanup__, bound; None when its class keeps Actor's
    (documentation only)."""
    return getattr(instance, name) if overrides_hook(type(instance), name) else None
