"""A proc's main program: `python3 -m xmesh._worker`, started by xmesh-hostd with its rank,
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


def main():
    from . import _core

    hostd_pid = int(os.environ.get("XMESH_HOSTD_PID", "0"))
    # Die with the host agent; if it is already gone, do not start.
    if not _core.set_parent_death_signal(signal.SIGKILL, hostd_pid):
        sys.exit(f"xmesh proc: host agent {hostd_pid} is gone")
    signal.signal(signal.SIGTERM, _flush_and_exit)
    for p in reversed(json.loads(os.environ.get("XMESH_SYS_PATH", "[]"))):
        if p not in sys.path:
            sys.path.insert(1, p)
    # The host's copy of the synced workspace comes first: `import mymodule` gets the synced code.
    workspace = os.environ.get("XMESH_WORKSPACE")
    if workspace:
        sys.path.insert(0, workspace)

    # Import the whole package now: a proc never imports code from a newer install later.
    import xmesh  # noqa: F401

    from . import _debug_proc, _proc_output
    from ._runtime import Kind, init_proc_runtime

    _proc_output.install(os.environ.get("XMESH_LOG_LEVEL", "20"))
    _debug_proc.install()
    _debug_proc.set_post_mortem(os.environ.get("XMESH_POST_MORTEM") == "1")

    rt = init_proc_runtime()
    _core.enable_stack_dumps(rt.node)  # the debugger's `where`, answered without the GIL
    host = rt.ensure_actor_host()
    rank = int(os.environ["XMESH_RANK"])
    rt.node.send(os.environ["XMESH_CONTROLLER_ADDR"], int(Kind.Reply),
                 {"pid": os.getpid(), "host": _core.hostname()},
                 corr=int(os.environ["XMESH_READY_CORR"]), index=rank, ok=True)
    # The main thread serves control messages (cancellations, supervision notices) and is
    # where Python runs signal handlers.
    while True:
        msg = rt.node.control.pop(timeout=1.0)
        if msg is None:
            if rt.node.control.closed:
                return
            continue
        body = msg.body or {}
        if msg.kind == Kind.Cancel:
            host.cancel(msg.actor, body.get("corr"), body.get("index"))
        elif msg.kind == Kind.Adopt:
            # A controller attached our (named) allocation, or shares a cookie of its procs.
            for cookie in body.get("cookies", []):
                rt.node.add_accepted_cookie(cookie)
            for addr in body.get("refuse", []):
                rt.node.refuse_calls_from(addr, {"kind": "taken_over", "text": body.get("refuse_text", "")})
            _debug_proc.adopted_by(msg.sender_addr)
            if msg.corr:
                rt.node.reply(msg, True, {"pid": os.getpid()})
        elif msg.kind == Kind.ProcInfo:
            info = {"pid": os.getpid(), "actors": host.describe()}
            if body.get("async_stacks"):  # the debugger's `where`: what async endpoints await
                info["async_stacks"] = host.async_stacks()
            rt.node.reply(msg, True, info)
        elif msg.kind == Kind.FlushOutput:
            # The controller's flush barrier (end of a cell): everything written so far, then a marker.
            rt.node.reply(msg, True, {"m": _proc_output.flush_marker()})
        elif msg.kind == Kind.DebugCommand:
            _debug_proc.deliver(body)
        elif msg.kind == Kind.Reload:
            # A sync changed these files: reload their modules here, between two messages of
            # no particular actor (the GIL makes each reload whole).
            from . import _reload

            result = _reload.reload_files(body.get("files", []))
            host.forget_endpoint_cache()
            rt.node.reply(msg, True, result)
        elif msg.kind == Kind.Configure:
            if "log_level" in body:
                _proc_output.set_log_level(body["log_level"])
            if "post_mortem" in body:
                _debug_proc.set_post_mortem(body["post_mortem"])
            if msg.corr:
                rt.node.reply(msg, True, {})


if __name__ == "__main__":
    main()
