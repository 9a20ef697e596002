"""`monarch.actor` on xmesh. The names in __all__ behave as in Monarch 0.7 (README's table says
where xmesh differs); any other name Monarch's module exports raises NotImplementedError that
says why, never a silent difference and never AttributeError."""
from xmesh import (  # noqa: F401
    Accumulator,
    Actor,
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
from xmesh._runtime.process import report_fault, set_unhandled_fault_hook

__all__ = [
    "Accumulator", "Actor", "ActorError", "ActorMesh", "Channel", "Context", "Endpoint", "Extent", "Future",
    "HostMesh", "MeshFailure", "Point", "Port", "PortReceiver", "ProcMesh", "SupervisionError", "ValueMesh",
    "as_endpoint", "concurrent_endpoint", "context", "current_actor_name", "current_rank", "current_size",
    "endpoint", "get_or_spawn_controller", "proc_mesh", "returns_future", "send", "shutdown_context",
    "this_host", "this_proc", "unhandled_fault_hook",
]


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Gets every failure nobody handled (an actor's broadcast raised, a proc or host died with
    no call to report it). Monarch's default exits the program; xmesh's says the failure where
    it belongs (the cell that caused it, or stderr) and the program or notebook lives on.
    Replace it as in Monarch (`monarch.actor.unhandled_fault_hook = my_hook`): return to drop
    the failure, raise to stop a script (in a notebook the kernel lives on)."""
    report_fault(failure)


def _to_the_current_hook(failure: MeshFailure) -> None:
    globals()["unhandled_fault_hook"](failure)  # whatever the program assigned since


set_unhandled_fault_hook(_to_the_current_hook)

# Monarch 0.7's other public names, and why xmesh has none of them yet (or ever).
_MISSING = {
    **{name: "is Monarch's manual worker bootstrap, which xmesh does its own way: monarch.job.SlurmJob / SSHJob "
             "start the nodes' agents for you; by hand, run `xmesh-hostd --listen tcp://ADDR:PORT --key-file KEY` "
             "on each node and connect with xmesh.hosts(['node:PORT', ...], key_file=KEY)"
       for name in ("attach_to_workers", "run_worker_loop_forever", "run_worker_loop_until_shutdown",
                    "start_worker_loop_forever", "attach", "enable_transport", "ChannelTransport",
                    "default_bootstrap_cmd")},
    **{name: "is Monarch's own runtime internals (hyperactor ids, its debugger actor, its config); xmesh has "
             "its own (xmesh.debug(), `xmesh debug`)"
       for name in ("ProcId", "Uid", "debug_controller", "config")},
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
