"""Who is running: the current actor (set by the actor host once it is spawned) and the message
it handles (set for each message, in contextvars so async endpoints see their own), else this
proc. current_rank() is the message's point, as in Monarch: where the actor sits in the mesh or
slice the message was sent to."""
import contextvars
import os
import weakref

from .. import _core
from . import pickling as _pickling
from .shape import Point
from .threads import OWN_ACTOR_PREFIX

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
    __slots__ = ("actor_id", "name", "rank", "shape", "proc_rank", "mesh_name", "class_name", "handles",
                 "stop_requested", "abort_reason", "owned")

    def __init__(self, actor_id, name, rank, shape, proc_rank, mesh_name="?", class_name="", handles=None):
        self.actor_id = actor_id
        self.name = name          # "Class 'mesh name'", for messages
        self.rank = rank          # in the actor mesh that was spawned
        self.shape = shape
        self.proc_rank = proc_rank
        self.mesh_name = mesh_name
        self.class_name = class_name  # qualified
        self.handles = handles    # (its ProcMesh, its ActorMesh, its creator, its controller's registry):
        #                           frames until first read
        self.stop_requested = False  # context().actor_instance.stop(): it stops after this message
        self.abort_reason = None     # context().actor_instance.abort(reason): it fails after this message
        self.owned = []              # weak references to the meshes it spawned: they stop when it ends


# The message being handled: (message, its CallBody or None). Its point is its target index in
# the actor's own mesh, unless the body names another extent (a slice) or rank (choose).
_message = contextvars.ContextVar("xmesh_message", default=None)


def set_message(msg, body):
    return _message.set((msg, body))


def reset_message(token):
    _message.reset(token)


def current_message():
    """(message, CallBody or None) of the message this code handles, or None."""
    return _message.get()


def actor_handles(ctx):
    """(ProcMesh, ActorMesh, creator, registry) an actor was spawned with (unpickled when first
    asked)."""
    if isinstance(ctx.handles, list):  # still the pickled frames
        ctx.handles = _pickling.loads(ctx.handles)
    return ctx.handles


def creator_record():
    """What an actor spawned by the code running now records as its creator: None from the
    controller, else (mesh name, class name, the actor's Point, its own creator record)."""
    ctx = _actor_context.get()
    if ctx is None or ctx.handles is None:
        return None
    return (ctx.mesh_name, ctx.class_name, Point(ctx.rank, ctx.shape), actor_handles(ctx)[2])


def owning_actor():
    """The actor whose code runs now, as the owner of what it spawns (its failures go to it, it
    stops them when it ends); None for the program, and for xmesh's own actors (the controllers'
    registry spawns on the program's behalf)."""
    ctx = _actor_context.get()
    if ctx is None or ctx.actor_id.startswith(OWN_ACTOR_PREFIX):
        return None
    return ctx


def note_owned(mesh):
    """A mesh spawned by the code running now: when that is an actor's, the mesh is the actor's
    and stops when the actor ends (a weak reference: dropping the mesh still stops it sooner)."""
    ctx = owning_actor()
    if ctx is not None:
        ctx.owned = [r for r in ctx.owned if r() is not None] + [weakref.ref(mesh)]


def set_actor_context(ctx):
    return _actor_context.set(ctx)


def actor_context():
    return _actor_context.get()


def _proc_point():
    shape_json = os.environ.get("XMESH_SHAPE")
    if not shape_json:
        return Point(0, _core.Shape([], 0, [], []))
    shape = _core.Shape.from_json(shape_json)
    return Point(int(os.environ.get("XMESH_RANK", "0")), shape)


def actor_point() -> Point:
    """The Point of the calling actor in the mesh it was spawned as (else of this proc)."""
    ctx = _actor_context.get()
    if ctx is not None:
        return Point(ctx.rank, ctx.shape)
    return _proc_point()


def current_rank() -> Point:
    """The message's point (Monarch's current_rank): where the calling actor sits in the mesh
    or slice the message was sent to, `.rank` plus one coordinate per dimension. A call on the
    whole actor mesh (and __init__) gives the actor's own point; a call on `mesh.slice(gpus=1)`
    the actor's point within that slice. Outside a message: the actor's (else this proc's)."""
    return message_point(_actor_context.get(), _message.get())


def message_point(ctx, handling) -> Point:
    """The point of a message being handled ((message, CallBody or None)) by the actor of ctx."""
    if handling is None or ctx is None:
        return actor_point()
    msg, body = handling
    if body is None:
        return Point(msg.index, ctx.shape)
    rank = body.rank if body.rank is not None else msg.index
    if body.labels is None:
        return Point(rank, ctx.shape)
    return Point(rank, _core.Shape.dense(list(body.labels), list(body.sizes)) if body.labels else
                 _core.Shape([], 0, [], []))


def current_size() -> dict[str, int]:
    """Sizes of the mesh or slice the message was sent to, by dimension name (Monarch's)."""
    shape = current_rank().shape
    return dict(zip(shape.labels, shape.sizes))
