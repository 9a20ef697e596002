"""xmesh: drive a mesh of processes and actors from one Python program or notebook.

    from xmesh import Actor, endpoint, this_host
    procs = this_host().spawn_procs({"gpus": 4})
    ...
"""
try:
    from . import _core
except ImportError as _error:  # a build for other Pythons, or a library missing: said plainly
    from ._base.install import core_import_error

    raise ImportError(core_import_error(_error)) from None
# The composition root: these register themselves with the runtime (python/README.md, layers).
# (Bound under private names: the package's public namespace is __all__.)
from ._proc import actor_host as _actor_host  # noqa: F401
from ._debug import remote as _debug_remote  # noqa: F401
from ._panel import view as _panel_view  # noqa: F401
from ._api.controllers import get_or_spawn_controller
from ._api.actor import Accumulator, Actor, ActorMesh, Endpoint, as_endpoint, concurrent_endpoint, endpoint, send
from ._base.context import current_rank, current_size
from ._debug.controller import debug
from ._base.errors import ActorError, SupervisionError, TakenOverError
from ._api.future import Future, returns_future
from ._api.instance import Context, Instance, context, current_actor_name
from ._jobs.job import KubernetesJob, SlurmJob, SSHJob
from ._jobs.kubernetes import KubeConfig
from ._jobs.records import JobError
from ._api.named import allocations
from ._api.ports import Channel, Port, PortReceiver, RankedPortReceiver
from ._api.proc_mesh import HostMesh, ProcMesh, attach, hosts, proc_mesh, shutdown_context, this_host, this_proc
from ._base.shape import Extent, Point
from ._base.value_mesh import ValueMesh
from ._workspace.sync import SyncReport, Workspace

__version__ = _core.version()

__all__ = [
    "Accumulator", "Actor", "ActorError", "ActorMesh", "Channel", "Context", "Endpoint", "Extent", "Future",
    "HostMesh", "Instance", "JobError", "KubeConfig", "KubernetesJob", "Point", "Port", "PortReceiver", "ProcMesh", "RankedPortReceiver", "SupervisionError",
    "SSHJob", "SlurmJob", "SyncReport", "TakenOverError", "ValueMesh", "Workspace", "allocations", "as_endpoint", "attach", "concurrent_endpoint", "context",
    "current_actor_name", "current_rank", "current_size", "debug", "endpoint", "get_or_spawn_controller", "hosts",
    "proc_mesh",
    "returns_future", "send", "shutdown_context", "this_host", "this_proc",
]
