"""Who is running: the rank and shape of the current actor (set by the actor host for each
message, in a contextvar so async endpoints see their own), else of this proc."""
import contextvars
import os

from ._shape import Point

_actor_context = contextvars.ContextVar("xmesh_actor_context", default=None)
# The causal context of the code running now: the controller cell whose call led here. In a
# proc it is the cell of the message being handled (so actor-to-actor calls carry it on); in
# the kernel the cell executing (set by _kernel); in a script "".
_cell = contextvars.ContextVar("xmesh_cell", default=None)
controller_cell = ""  # the kernel sets it while a cell executes


def current_cell():
    c = _cell.get()
    return controller_cell if c is None else c


def set_current_cell(cell):
    return _cell.set(cell)


class ActorContext:
    __slots__ = ("actor_id", "name", "rank", "shape", "proc_rank", "mesh_name")

    def __init__(self, actor_id, name, rank, shape, proc_rank, mesh_name="?"):
        self.actor_id = actor_id
        self.name = name          # "Class 'mesh name'", for messages
        self.rank = rank
        self.shape = shape
        self.proc_rank = proc_rank
        self.mesh_name = mesh_name


def set_actor_context(ctx):
    return _actor_context.set(ctx)


def actor_context():
    return _actor_context.get()


def _proc_point():
    from . import _core

    shape_json = os.environ.get("XMESH_SHAPE")
    if not shape_json:
        return Point(0, _core.Shape([], 0, [], []))
    shape = _core.Shape.from_json(shape_json)
    return Point(int(os.environ.get("XMESH_RANK", "0")), shape)


def current_rank() -> Point:
    """The Point of the calling actor in its mesh: `.rank` plus one coordinate per dimension."""
    ctx = _actor_context.get()
    if ctx is not None:
        return Point(ctx.rank, ctx.shape)
    return _proc_point()


def current_size() -> dict[str, int]:
    """Sizes of the calling actor's mesh, by dimension name."""
    ctx = _actor_context.get()
    shape = ctx.shape if ctx is not None else _proc_point().shape
    return dict(zip(shape.labels, shape.sizes))
