"""The protocol's enums for Python, from the same lists as the C++ side's: `Kind` (message
kinds, runtime/protocol/kinds.def, bound by pybind11) and `ErrorKind` (the "kind" of an error body,
runtime/protocol/errors.def, generated into _base/error_kinds.py at build time). An ErrorKind compares equal
to its wire string, so `ErrorKind.Supervision == body.get("kind")` reads a body from either
side."""
from typing import Any, Optional

from .. import _core
from .error_kinds import ErrorKind

Kind = _core.Kind

__all__ = ["ErrorKind", "Kind", "actor_mesh_name", "error", "error_kind", "new_actor_id", "read_error"]


def new_actor_id(mesh_name: str) -> str:
    """The id of one spawn of an actor mesh on its procs: "MESH.HEX" (a name may be spawned again)."""
    return f"{mesh_name}.{_core.random_hex(4)}"


def actor_mesh_name(actor_id: str) -> str:
    """The actor mesh's name in an actor id ("trainer.1a2b3c4d" -> "trainer"): what the debugger's
    commands name."""
    return actor_id.rsplit(".", 1)[0]


def error(kind: ErrorKind, text: str, **fields: Any) -> dict:
    """An error body (ErrorBody, runtime/protocol/bodies.hpp) as it goes on the wire, as the C++ side's
    error_body() makes it; fields: those ErrorBody lists (TypeError for another)."""
    return _core.ErrorBody(kind=str(kind), text=text, **fields).to_dict()


def read_error(body: Any) -> Any:
    """The ErrorBody (a `_core.ErrorBody`) of a failed reply; never raises: a body that does not
    read is an actor error whose text shows what came."""
    try:
        return _core.ErrorBody.from_dict(body)
    except (ValueError, TypeError):
        return _core.ErrorBody(kind=str(ErrorKind.Actor), text=f"a malformed error reply: {body!r}")


def error_kind(body: Any) -> Optional[ErrorKind]:
    """The ErrorKind of a reply body; None when it has none or one not in the list."""
    kind = body.get("kind") if isinstance(body, dict) else None
    if not isinstance(kind, str):
        return None
    try:
        return ErrorKind(kind)
    except ValueError:
        return None
