"""xmesh: drive a mesh of processes and actors from one Python program or notebook.

    from xmesh import Actor, endpoint, this_host
    procs = this_host().spawn_procs({"gpus": 4})
    ...
"""
from . import _core
# The composition root: these register themselves with the runtime (python/README.md, layers).
from . import _actor_host, _debug_remote, _panel  # noqa: F401
from ._controllers import get_or_spawn_controller
from ._actor import Accumulator, Actor, ActorMesh, Endpoint, as_endpoint, concurrent_endpoint, endpoint, send
from ._context import current_rank, current_size
from ._debug import debug
from ._errors import ActorError, SupervisionError, TakenOverError
from ._future import Future, returns_future
from ._instance import Context, Instance, context, current_actor_name
from ._jobs import JobError, SlurmJob, SSHJob
from ._named import allocations
from ._ports import Channel, Port, PortReceiver, RankedPortReceiver
from ._proc_mesh import HostMesh, ProcMesh, attach, hosts, proc_mesh, shutdown_context, this_host, this_proc
from ._shape import Extent, Point
from ._value_mesh import ValueMesh
from ._workspace import SyncReport, Workspace

__version__ = _core.version()

__all__ = [
    "Accumulator", "Actor", "ActorError", "ActorMesh", "Channel", "Context", "Endpoint", "Extent", "Future",
    "HostMesh", "Instance", "JobError", "Point", "Port", "PortReceiver", "ProcMesh", "RankedPortReceiver", "SupervisionError",
    "SSHJob", "SlurmJob", "SyncReport", "TakenOverError", "ValueMesh", "Workspace", "allocations", "as_endpoint", "attach", "concurrent_endpoint", "context",
    "current_actor_name", "current_rank", "current_size", "debug", "endpoint", "get_or_spawn_controller", "hosts",
    "proc_mesh",
    "returns_future", "send", "shutdown_context", "this_host", "this_proc",
]
