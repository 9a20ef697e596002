"""`monarch.actor` on xmesh. The names in __all__ behave as in Monarch 0.7 (README's table says
where xmesh differs); any other name Monarch's module exports raises NotImplementedError that
says why, never a silent difference and never AttributeError."""
import sys

import xmesh
from xmesh import (  # noqa: F401
    Accumulator,
    ActorError,
    ActorMesh,
    Channel,
    Context,
    Endpoint,
    Extent,
    Future,
    HostMesh,
    Point,
    Port,
    PortReceiver,
    ProcMesh,
    ValueMesh,
    as_endpoint,
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    get_or_spawn_controller,
    proc_mesh,
    returns_future,
    send,
    shutdown_context,
    this_host,
    this_proc,
)
from xmesh._base.errors import MeshFailure, SupervisionError  # noqa: F401
from xmesh._proc import actor_logging as _actor_logging
from xmesh._runtime.process import add_proc_env, in_notebook, report_fault, set_unhandled_fault_hook

from ._workers import attach_to_workers, run_worker_loop_forever  # noqa: F401

__all__ = [
    "Accumulator", "Actor", "ActorError", "ActorMesh", "Channel", "Context", "Endpoint", "Extent", "Future",
    "HostMesh", "MeshFailure", "Point", "Port", "PortReceiver", "ProcMesh", "SupervisionError", "ValueMesh",
    "as_endpoint", "concurrent_endpoint", "context", "current_actor_name", "current_rank", "current_size",
    "endpoint", "get_or_spawn_controller", "proc_mesh", "returns_future", "send", "shutdown_context",
    "attach_to_workers", "config", "run_worker_loop_forever", "this_host", "this_proc", "unhandled_fault_hook",
]


class Actor(xmesh.Actor):
    """Monarch's Actor: xmesh's, with Monarch's rule that an actor's endpoints are all sync or
    all async (spawn raises ValueError for a class that mixes them; xmesh.Actor allows it)."""

    _monarch_endpoint_rule = True


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Gets every failure of actors the program spawned that no owner handled (an actor failed:
    its __init__ raised, an error nobody could receive, a BaseException; a proc or host died).
    As Monarch's default, in a script it stops the program (the failure is said, then a
    KeyboardInterrupt in its main thread, so atexit handlers run); in a notebook on xmesh's
    kernel it says the failure in the cell that caused it and the kernel lives on. Replace it as in Monarch
    (`monarch.actor.unhandled_fault_hook = my_hook`): return to drop the failure, raise to stop
    a script (in a notebook the kernel lives on)."""
    if in_notebook():
        report_fault(failure)
    else:
        sys.exit(1)


class _Config:
    """`monarch.actor.config`: what Monarch lets a program switch at run time here."""

    prefix_python_logs_with_actor = True  # logging records start with "[actor=<...>] " (actors and the program)


config = _Config()
_actor_logging.install(lambda: config.prefix_python_logs_with_actor, root_too=True)
# The procs of a Monarch program prefix their actors' log records too (read when each is spawned).
add_proc_env(lambda: {"XMESH_LOG_ACTOR_PREFIX": "1" if config.prefix_python_logs_with_actor else "0"})


def _to_the_current_hook(failure: MeshFailure) -> None:
    globals()["unhandled_fault_hook"](failure)  # whatever the program assigned since


set_unhandled_fault_hook(_to_the_current_hook)

# Monarch 0.7's other public names, and why xmesh has none of them yet (or ever).
_MISSING = {
    **{name: "is part of Monarch's manual worker bootstrap that xmesh does not have: run_worker_loop_forever(address) "
             "on each worker and attach_to_workers(workers=[...]) in the client are xmesh's (host agents); "
             "monarch.job.SlurmJob / SSHJob start the nodes' agents for you"
       for name in ("run_worker_loop_until_shutdown",
                    "start_worker_loop_forever", "attach", "enable_transport", "ChannelTransport",
                    "default_bootstrap_cmd")},
    **{name: "is Monarch's own runtime internals (hyperactor ids, its debugger actor); xmesh has "
             "its own (xmesh.debug(), `xmesh debug`)"
       for name in ("ProcId", "Uid", "debug_controller")},
    **{name: "is Monarch's OpenTelemetry instrumentation, which xmesh does not have"
       for name in ("get_meter", "span", "traced")},
}


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    why = _MISSING.get(name)
    if why is not None:
        raise NotImplementedError(f"monarch.actor.{name} {why}")
    raise NotImplementedError(f"monarch.actor.{name} is not supported by xmesh (supported: {', '.join(__all__)})")
