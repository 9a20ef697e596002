"""Exceptions a caller sees."""
from ._shape import format_coords


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


class SupervisionError(ActorError):
    """The proc hosting an actor died (signal or exit) or its host agent was lost."""


class TakenOverError(RuntimeError):
    """A named allocation this controller used was attached by another controller, which now
    owns it; its procs refuse this one's calls."""


def describe_coords(coords):
    return f"({format_coords(coords)})" if coords else ""
