"""`monarch.actor` on xmesh. The names below behave as in Monarch; any other name Monarch's
module has raises NotImplementedError naming it, never a silent difference."""
from xmesh import (  # noqa: F401
    Actor,
    ActorError,
    ActorMesh,
    Future,
    HostMesh,
    Point,
    ProcMesh,
    ValueMesh,
    current_rank,
    current_size,
    endpoint,
    proc_mesh,
    this_host,
    this_proc,
)
from xmesh._errors import SupervisionError  # noqa: F401

__all__ = [
    "Actor", "ActorError", "ActorMesh", "Future", "HostMesh", "Point", "ProcMesh", "SupervisionError",
    "ValueMesh", "current_rank", "current_size", "endpoint", "proc_mesh", "this_host", "this_proc",
]


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"monarch.actor.{name} is not supported by xmesh (supported: {', '.join(__all__)})")
