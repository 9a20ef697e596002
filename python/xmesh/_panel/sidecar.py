"""The mesh panel's sidecar (issue 22): the process a Jupyter server's extension (jupyter_ext/)
runs with Debian's Python, so that the server, in its own environment, never loads xmesh's
runtime. It reads this user's host agent and controllers through _panel and answers JSON lines on
its standard input and output."""
import hashlib
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import view as _panel
from .._base.env import env_float
from .._base.shape import parse_ranks
from .._base.threads import start_thread


class DebugLinks:
    """The panel's connections to the controllers' debuggers, one per controller, kept open
    while its user works in the panel and closed hold_s (XMESH_PANEL_DEBUG_HOLD_S, 20 s) after the last command (or at once on
    `release`): the cell's prompt is taken over once for a series of commands, not once per
    command, and comes back when the panel leaves (_debug_remote.DebugClient)."""

    def __init__(self) -> None:
        self.hold_s = env_float("XMESH_PANEL_DEBUG_HOLD_S", 20.0)
        self._links: Dict[int, Any] = {}
        self._used: Dict[int, float] = {}
        self._lock = threading.Lock()
        self._reaper: Optional[threading.Thread] = None

    def type(self, pid: int, path: str, lines: List[str]) -> Tuple[str, List[str]]:
        """(the transcript, each line's answer) of typing `lines` at controller pid's debugger."""
        from .._debug import remote as _debug_remote

        with self._lock:
            link = self._links.get(pid)
            fresh = link is None or link.closed
            if fresh:
                link = self._links[pid] = _debug_remote.DebugClient(path, DEBUG_TIMEOUT_S)
            self._used[pid] = time.monotonic()
            shown, answers = _debug_remote.transcript(link, lines, fresh)
            if link.closed:
                self._links.pop(pid, None)
            self._start_reaper()
        return shown, answers

    def release(self, pid: int) -> bool:
        """Leaves controller pid's debugger now (its waiting call takes the prompt back)."""
        with self._lock:
            link = self._links.pop(pid, None)
            self._used.pop(pid, None)
        if link is not None:
            link.close()
        return link is not None

    def _start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="xmesh-panel-debug-links", daemon=True)
            start_thread(self._reaper)

    def _reap(self) -> None:
        while True:
            time.sleep(min(1.0, self.hold_s / 4))
            with self._lock:  # taken out under the lock: a command cannot pick an idle link up meanwhile
                idle = [pid for pid in self._links if time.monotonic() - self._used.get(pid, 0) >= self.hold_s]
                links = [self._links.pop(pid) for pid in idle]
                for pid in idle:
                    self._used.pop(pid, None)
            for link in links:
                link.close()


_links = DebugLinks()


def _debug(msg: dict, rundir: Optional[str]) -> dict:
    """Types `lines` at the debugger of controller `pid` (taking it over while the panel works in
    it, then handing it back)."""
    pid, lines = msg.get("pid"), msg.get("lines")
    if not isinstance(lines, list) or not lines or not all(isinstance(x, str) and "\n" not in x for x in lines):
        raise ValueError("lines is a non-empty list of debugger commands, one line each")
    path = _controller_debugger(pid, rundir)
    return {"pid": pid, "transcript": _links.type(pid, path, lines)[0]}


def _release(msg: dict, rundir: Optional[str]) -> dict:
    """The panel is done with controller `pid`'s debugger (its console detached)."""
    pid = msg.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise ValueError("pid is the controller's process id (a whole number)")
    return {"pid": pid, "released": _links.release(pid)}


MAX_PDB_COMMAND = 4096


def _controller_debugger(pid: Any, rundir: Optional[str]) -> str:
    """The debug socket of controller `pid` of this runtime directory (ValueError if none)."""
    from .. import _core
    from .._debug import remote as _debug_remote

    if isinstance(pid, bool) or not isinstance(pid, int):
        raise ValueError("pid is the controller's process id (a whole number)")
    live = _debug_remote.live_controllers(os.path.abspath(rundir or _core.runtime_dir()))
    if pid not in live:
        raise ValueError(f"pid {pid} is no xmesh kernel or program of this runtime directory")
    return live[pid]


def _one_rank(answer: str, actor: str, rank: int) -> str:
    """A cast's answer for one rank without its "[actor rank N]" heading."""
    heading = f"[{actor} rank {rank}]\n"
    return answer[len(heading):] if answer.startswith(heading) else answer


def _pdb(msg: dict, rundir: Optional[str]) -> dict:
    """The panel's console on one stopped rank: types `command` (a pdb command; none: only
    look) at rank `rank` of actor mesh `actor` in controller `pid`'s debugger, then pdb's `ll`
    (the source of the frame it is in now, "->" at its line). {"output", "source", "stopped"}:
    stopped is False once the rank runs on (continued, or its call returned)."""
    actor, rank, command = msg.get("actor"), msg.get("rank"), msg.get("command") or ""
    if not isinstance(actor, str) or not actor.isidentifier():
        raise ValueError("actor is the name of an actor mesh (as the stopped table shows it)")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError("rank is a whole number, 0 or more")
    if not isinstance(command, str) or "\n" in command or len(command) > MAX_PDB_COMMAND:
        raise ValueError(f"command is one pdb command line of at most {MAX_PDB_COMMAND} characters")
    path = _controller_debugger(msg.get("pid"), rundir)
    lines = ([f"cast {actor} ranks({rank}) {command.strip()}"] if command.strip() else []) + [f"cast {actor} ranks({rank}) ll"]
    answers = [_one_rank(a, actor, rank) for a in _links.type(msg["pid"], path, lines)[1]]
    source = answers[-1]
    stopped = not source.startswith("[xmesh] ")  # the debugger's own note: that rank is not stopped (any more)
    output = answers[0] if command.strip() else ""
    note = source.strip()
    if not stopped and output.strip() == note:
        output = ""  # the same note twice (it was not stopped to begin with): said once
    elif not stopped and command.strip():
        note = f"{actor} rank {rank} runs on"  # the command resumed it (continue, or its call returned)
    return {"pid": msg["pid"], "actor": actor, "rank": rank, "output": output, "source": source if stopped else "",
            "stopped": stopped, **({} if stopped else {"note": note})}


def _stop(msg: dict, rundir: Optional[str]) -> dict:
    """Stops the allocation `id` of this user's agent (its procs and actors), named or not."""
    from .. import _core
    from .._runtime.agents import HostdError, agent
    from .._base.pids import running_agent_pid

    alloc = msg.get("id")
    if not isinstance(alloc, str) or not alloc:
        raise ValueError("id is the allocation's id (as the meshes list gives it)")
    rundir = os.path.abspath(rundir or _core.runtime_dir())
    if running_agent_pid(rundir) is None:
        raise ValueError(f"no host agent runs for {rundir}")
    try:
        agent(rundir).stop_procs(alloc=alloc, by="the xmesh panel (its stop button)")
    except HostdError as e:
        raise ValueError(str(e)) from None
    return {"stopping": alloc}


MAX_LOG_RECORDS = 2000


def _logs(msg: dict, rundir: Optional[str]) -> dict:
    """The last `tail` lines (default 500) of an allocation's per-rank log files (its `id`, and
    its `name` for a named one), filtered by `rank`, `stream` and `grep` (a regular expression),
    oldest first."""
    from .. import _core
    from .._output import logfiles as _logfiles

    alloc, name, rank, tail = msg.get("id"), msg.get("name") or None, msg.get("rank"), msg.get("tail", 500)
    if not isinstance(alloc, str) or not alloc:
        raise ValueError("id is the allocation's id")
    if name is not None and not isinstance(name, str):
        raise ValueError("name is the allocation's name")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, (int, str))):
        raise ValueError("rank is a whole number or a list of ranks (0-3, 1,4)")
    ranks = None if rank is None else {rank} if isinstance(rank, int) else parse_ranks(rank)
    if isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail <= MAX_LOG_RECORDS:
        raise ValueError(f"tail is a whole number from 0 to {MAX_LOG_RECORDS}")
    grep = msg.get("grep") or None
    if grep is not None and not isinstance(grep, str):
        raise ValueError("grep is a regular expression")
    stream = msg.get("stream")
    _logfiles.check_stream(stream)  # named before anything is looked up
    # A named allocation's directory is NAME-ID (earlier ones of that name have other ids).
    dirs = [d for d in _logfiles.find_logdirs(os.path.abspath(rundir or _core.runtime_dir()), name or alloc)
            if os.path.basename(d) in (alloc, f"{name}-{alloc}")]
    if not dirs:
        raise ValueError(f"no logs of allocation {name or alloc!r} (id {alloc})")
    _logfiles.compile_grep(grep)  # a pattern that does not compile is named as such
    _check_ranks(ranks, set(_logfiles.rank_files(dirs[-1])), name or alloc)

    def read() -> dict:
        records = _logfiles.read_records(dirs[-1], ranks=ranks, stream=stream, grep=grep)
        records.sort(key=lambda r: (r.time, r.rank))
        return {"id": alloc, "total": len(records),
                "records": [r._asdict() for r in _logfiles.last(records, tail)]}

    # A search by a user's regular expression may backtrack for minutes ((a+)+$ on a long line),
    # and Python's re cannot be interrupted: it runs in a child of its own, given SEARCH_LIMIT_S.
    return read() if grep is None else _in_child(read, SEARCH_LIMIT_S, f"search too slow: the regular expression "
                                                 f"{grep!r} took over {SEARCH_LIMIT_S:.0f} s on these logs; "
                                                 "try a simpler one")


def _check_ranks(wanted: Optional[set], have: set, what: str) -> None:
    """ValueError naming the ranks asked for that the allocation has no logs of (a rank past its
    end, say), rather than an empty view that reads as "they printed nothing"."""
    missing = sorted((wanted or set()) - have)
    if missing:
        from .._base.shape import ranks_text

        has = f"its ranks are {ranks_text(sorted(have))[len('ranks '):]}" if len(have) > 1 else \
            f"it has {ranks_text(sorted(have))}" if have else "it has no rank logs yet"
        raise ValueError(f"{what} has no {ranks_text(missing)}: {has}")


SEARCH_LIMIT_S = 5.0  # well under the server's wait for the sidecar (15 s)


def _in_child(work: Callable[[], dict], limit_s: float, too_slow: str) -> dict:
    """work() in a forked child, its JSON answer read back; past limit_s the child is killed and
    ValueError(too_slow) raised. The child only reads files and computes: nothing of this
    process's threads is needed there."""
    import select
    import signal

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        try:
            data = json.dumps(work()).encode()
        except ValueError as e:
            data = json.dumps({"__error__": str(e)}).encode()
        except BaseException as e:  # noqa: BLE001 - said to the parent, never raised here
            data = json.dumps({"__error__": f"{type(e).__name__}: {e}"}).encode()
        with os.fdopen(w, "wb") as out:
            out.write(data)
        os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + limit_s
    try:
        with os.fdopen(r, "rb") as pipe:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([pipe], [], [], left)[0]:
                    os.kill(pid, signal.SIGKILL)
                    raise ValueError(too_slow)
                chunk = os.read(pipe.fileno(), 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.waitpid(pid, 0)
    answer = json.loads(b"".join(chunks) or b"{}")
    if "__error__" in answer:
        raise ValueError(answer["__error__"])
    return answer


DEBUG_TIMEOUT_S = 10.0  # under the server's wait for the sidecar


class MeshesOp:
    """The panel's list, with a revision (a hash of everything but the time): asked `since` the
    revision it has, an unchanged list is answered {"unchanged": true}, so a panel that polls an
    idle cluster costs the server a few bytes, not a list of 512 ranks. The list is made again
    only when a controller's snapshot (compared as it came, before decoding) or the host agent
    changed, or the agent's cached Status aged out (_panel.StatusCache)."""

    def __init__(self) -> None:
        self._cache = _panel.StatusCache()
        self._reader = _panel.SnapshotReader()  # an idle controller answers "unchanged" in a few bytes
        self._inputs: Any = None
        self._reply: dict = {}
        self._revision = ""

    def __call__(self, msg: dict, rundir: Optional[str]) -> dict:
        from .. import _core
        from .._base.pids import running_agent_pid

        since = msg.get("since")
        if since is not None and not isinstance(since, str):
            raise ValueError("since is the revision of the list the panel has")
        notebooks = msg.get("notebooks") or {}
        if not isinstance(notebooks, dict) or not all(isinstance(v, str) for v in notebooks.values()):
            raise ValueError("notebooks maps a kernel id to its notebook's path")
        rundir = os.path.abspath(rundir or _core.runtime_dir())
        raws = _panel.raw_snapshots(rundir, self._reader)
        inputs = (rundir, running_agent_pid(rundir), raws, sorted(notebooks.items()))
        if inputs != self._inputs or not self._cache.fresh():
            self._reply = name_notebooks(_panel.meshes(rundir, self._cache, raws), notebooks)
            self._revision = hashlib.sha1(json.dumps(self._reply, sort_keys=True).encode()).hexdigest()[:20]
            self._inputs = inputs
        if since == self._revision:
            return {"unchanged": True, "revision": self._revision, "server_time": time.time()}
        return dict(self._reply, revision=self._revision, server_time=time.time())


def name_notebooks(reply: dict, notebooks: Dict[str, str]) -> dict:
    """The panel's list with each kernel named by the notebook its server's session has now
    (the kernel knows only the path it was started for: a notebook renamed since has another)."""
    for row in reply.get("controllers", []) + [m["owner"] for m in reply.get("meshes", []) if m.get("owner")]:
        path = notebooks.get(row.get("kernel_id", ""))
        if path:
            row["notebook"] = path
    return reply


OPS: Dict[str, Callable[[dict, Optional[str]], dict]] = {
    "meshes": MeshesOp(),
    "debug": _debug,
    "pdb": _pdb,
    "release": _release,
    "stop": _stop,
    "logs": _logs,
}


def serve_stdio(stdin: Any, stdout: Any) -> int:
    """The sidecar a Jupyter server's extension runs (`python -m xmesh._panel.sidecar`): JSON lines,
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
    from .._runtime.process import set_reader_only

    set_reader_only()  # not a program of the user's: `xmesh debug` and the panel do not list it
    sys.exit(serve_stdio(sys.stdin, sys.stdout))
