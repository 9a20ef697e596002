"""The mesh panel's sidecar (issue 22): the process a Jupyter server's extension (jupyter_ext/)
runs with Debian's Python, so that the server, in its own environment, never loads xmesh's
runtime. It reads this user's host agent and controllers through _panel and answers JSON lines on
its standard input and output."""
import json
import os
import sys
from typing import Any, Callable, Dict, Optional

from . import _panel


def _debug(msg: dict, rundir: Optional[str]) -> dict:
    """Types `lines` at the debugger of controller `pid` (taking it over, then handing it back)."""
    from . import _core, _debug_remote

    pid, lines = msg.get("pid"), msg.get("lines")
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise ValueError("pid is the controller's process id (a whole number)")
    if not isinstance(lines, list) or not lines or not all(isinstance(x, str) and "\n" not in x for x in lines):
        raise ValueError("lines is a non-empty list of debugger commands, one line each")
    live = _debug_remote.live_controllers(os.path.abspath(rundir or _core.runtime_dir()))
    if pid not in live:
        raise ValueError(f"pid {pid} is no xmesh kernel or program of this runtime directory")
    return {"pid": pid, "transcript": _debug_remote.run_commands(live[pid], lines, timeout=DEBUG_TIMEOUT_S)}


def _stop(msg: dict, rundir: Optional[str]) -> dict:
    """Stops the allocation `id` of this user's agent (its procs and actors), named or not."""
    from . import _core
    from ._hostd import HostdError, agent
    from ._pids import running_agent_pid

    alloc = msg.get("id")
    if not isinstance(alloc, str) or not alloc:
        raise ValueError("id is the allocation's id (as the meshes list gives it)")
    rundir = os.path.abspath(rundir or _core.runtime_dir())
    if running_agent_pid(rundir) is None:
        raise ValueError(f"no host agent runs for {rundir}")
    try:
        agent(rundir).stop_procs(alloc=alloc)
    except HostdError as e:
        raise ValueError(str(e)) from None
    return {"stopping": alloc}


MAX_LOG_RECORDS = 2000


def _logs(msg: dict, rundir: Optional[str]) -> dict:
    """The last `tail` lines (default 500) of an allocation's per-rank log files (its `id`, and
    its `name` for a named one), filtered by `rank`, `stream` and `grep` (a regular expression),
    oldest first."""
    from . import _core, _logfiles

    alloc, name, rank, tail = msg.get("id"), msg.get("name") or None, msg.get("rank"), msg.get("tail", 500)
    if not isinstance(alloc, str) or not alloc:
        raise ValueError("id is the allocation's id")
    if name is not None and not isinstance(name, str):
        raise ValueError("name is the allocation's name")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise ValueError("rank is a whole number")
    if isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail <= MAX_LOG_RECORDS:
        raise ValueError(f"tail is a whole number from 0 to {MAX_LOG_RECORDS}")
    grep = msg.get("grep") or None
    if grep is not None and not isinstance(grep, str):
        raise ValueError("grep is a regular expression")
    # A named allocation's directory is NAME-ID (earlier ones of that name have other ids).
    dirs = [d for d in _logfiles.find_logdirs(os.path.abspath(rundir or _core.runtime_dir()), name or alloc)
            if os.path.basename(d) in (alloc, f"{name}-{alloc}")]
    if not dirs:
        raise ValueError(f"no logs of allocation {name or alloc!r} (id {alloc})")
    records = _logfiles.read_records(dirs[-1], ranks={rank} if rank is not None else None,
                                     stream=msg.get("stream") or None, grep=grep)
    records.sort(key=lambda r: (r.time, r.rank))
    return {"id": alloc, "total": len(records),
            "records": [r._asdict() for r in _logfiles.last(records, tail)]}


DEBUG_TIMEOUT_S = 10.0  # under the server's wait for the sidecar


OPS: Dict[str, Callable[[dict, Optional[str]], dict]] = {
    "meshes": lambda msg, rundir: _panel.meshes(rundir),
    "debug": _debug,
    "stop": _stop,
    "logs": _logs,
}


def serve_stdio(stdin: Any, stdout: Any) -> int:
    """The sidecar a Jupyter server's extension runs (`python -m xmesh._panel_sidecar`): JSON lines,
    `{"op": "meshes"}` (the panel's list) or `{"op": "debug", "pid": N, "lines": [...]}` (commands
    typed at that controller's debugger: a transcript), each with an optional "runtime_dir", in;
    one answer line out each, until the end of input. A bad request is answered with {"error": why}; the sidecar lives on."""
    for raw in stdin:
        try:
            msg = json.loads(raw)
            op = msg.get("op") if isinstance(msg, dict) else None
            if op not in OPS:
                raise ValueError(f"unknown request: the sidecar answers {{\"op\": ...}} with one of {sorted(OPS)}")
            rundir = msg.get("runtime_dir")
            if rundir is not None and not isinstance(rundir, str):
                raise ValueError("runtime_dir is a path")
            answer = OPS[op](msg, rundir)
        except ValueError as e:  # the request's fault
            answer = {"error": str(e), "bad_request": True}
        except Exception as e:  # an agent that does not answer, say: the panel shows why
            answer = {"error": f"{type(e).__name__}: {e}"}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve_stdio(sys.stdin, sys.stdout))
