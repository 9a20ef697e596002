"""A proc's main program: `python3 -m xmesh._proc.worker`, started by xmesh-hostd with its rank,
shape and controller in the environment."""
import json
import os
import signal
import sys


def _flush_and_exit(signum, frame):
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(128 + signum)


def _stop_gracefully(rt):
    """SIGTERM (the proc mesh is stopping): the actors end as Monarch's do (concurrent calls
    cancelled, then __cleanup__), within most of the agent's grace period (XMESH_STOP_GRACE_MS,
    after which it kills), and Python exits normally, so atexit handlers and the finalizers of
    module globals run. A second SIGTERM exits at once."""
    from .._base.env import env_float

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, _flush_and_exit)
        grace_s = env_float("XMESH_STOP_GRACE_MS", 3000.0) / 1000.0
        rt.ensure_actor_host().end_all("its proc got SIGTERM: its proc mesh was stopped, or the process was killed",
                                       timeout=0.7 * grace_s)
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(128 + signum)

    return handler


def main():
    from .. import _core

    hostd_pid = int(os.environ.get("XMESH_HOSTD_PID", "0"))
    # Die with the host agent; if it is already gone, do not start.
    if not _core.set_parent_death_signal(signal.SIGKILL, hostd_pid):
        sys.exit(f"xmesh proc: host agent {hostd_pid} is gone")
    signal.signal(signal.SIGTERM, _flush_and_exit)  # until the runtime is up (then: _stop_gracefully)
    for p in reversed(json.loads(os.environ.get("XMESH_SYS_PATH", "[]"))):
        if p not in sys.path:
            sys.path.insert(1, p)
    # The host's copy of the synced workspace comes first: `import mymodule` gets the synced code.
    workspace = os.environ.get("XMESH_WORKSPACE")
    if workspace:
        sys.path.insert(0, workspace)

    # Import the whole package now: a proc never imports code from a newer install later.
    import xmesh  # noqa: F401

    from .._debug import proc as _debug_proc
    from .._output import capture as _proc_output
    from . import actor_logging as _actor_logging
    from .._runtime.process import Kind, init_proc_runtime

    _proc_output.install(os.environ.get("XMESH_LOG_LEVEL", "20"))
    _actor_logging.install(_actor_logging.enabled_in_procs)
    _debug_proc.install()
    _debug_proc.set_post_mortem(os.environ.get("XMESH_POST_MORTEM") == "1")

    rt = init_proc_runtime()
    _core.enable_stack_dumps(rt.node)  # the debugger's `where`, answered by the I/O thread
    rt.ensure_actor_host()
    signal.signal(signal.SIGTERM, _stop_gracefully(rt))
    rt.control.on(Kind.Adopt, lambda msg: _adopt(rt, msg))
    rank = int(os.environ["XMESH_RANK"])
    rt.node.send(os.environ["XMESH_CONTROLLER_ADDR"], int(Kind.Reply),
                 {"pid": os.getpid(), "host": _core.hostname()},
                 corr=int(os.environ["XMESH_READY_CORR"]), index=rank, ok=True)
    # The main thread serves control messages (cancellations, the output barrier, settings,
    # debugger commands; see ActorHost) and is where Python runs signal handlers.
    rt.control.serve(rt.node.control, poll_s=1.0)


def _adopt(rt, msg):
    """A controller attached our (named) allocation, or shares a cookie of its procs."""
    from .._debug import proc as _debug_proc
    from .._base.protocol import ErrorKind, error

    body = msg.adopt()
    for cookie in body.cookies:
        rt.node.add_accepted_cookie(cookie)
    for addr in body.refuse:
        rt.node.refuse_calls_from(addr, error(ErrorKind.TakenOver, body.refuse_text))
    _debug_proc.adopted_by(msg.sender_addr)
    if msg.corr:
        rt.node.reply(msg, True, {"pid": os.getpid()})


if __name__ == "__main__":
    if sys.argv[1:] == ["--fork-server"]:  # the host agent's fork server: its procs keep this command line
        from .forkserver import main as fork_server_main

        fork_server_main()
    else:
        main()
