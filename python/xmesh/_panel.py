"""What the mesh panel shows of a controller (issue 22), asked without its prompt or its cell.

Every controller (kernel or script) answers queries on `<runtime dir>/c/<pid>.panel` (a unix
socket only this user reaches, _unix_server): JSON lines, one request `{"op": "snapshot"}` and
one answer per line, so a Jupyter server can read a kernel whose cell is blocked in a call. A
snapshot lists the allocations the controller owns, each rank's state:

- `dead` (and why: its exit as the agent reported it),
- `stopped` (in pdb: the actor, the function and line),
- `call` (the endpoints it has not answered yet, the oldest call's age),
- `idle`.

Calls are tracked by an observer of every call the controller sends (`_runtime.observe_calls`):
only the unanswered targets of each (`Call.pending()`) count, and finished calls are dropped as
snapshots and new calls come. `snapshots(rundir)` is the reading side, for every live
controller of a runtime directory.
"""
import collections
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from . import _core
from ._runtime import get_runtime, observe_calls, on_controller_shutdown, on_controller_start
from ._unix_server import OwnerOnlyServer, live_sockets, read_bounded_line

SUFFIX = ".panel"
MAX_REQUEST = 1 << 12     # a request is a few bytes; a longer line is refused unread
MAX_TRACKED_CALLS = 4096  # unanswered calls remembered; beyond it the oldest are forgotten
QUERY_TIMEOUT_S = 2.0     # a controller that does not answer a snapshot in time is reported so


class CallTracker:
    """The calls this controller sent that still wait for some target: (call, what, since)."""

    PRUNE_AT = 256  # finished calls are dropped when this many accumulated since the last time

    def __init__(self) -> None:
        self._calls: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._prune_at = self.PRUNE_AT

    def note(self, targets: list, call: Any, what: str) -> None:
        """On every call's path: an append, and now and then a pass that drops finished calls
        (amortized: the next pass waits until as many calls came again as are still running)."""
        if call is None or call.is_port:
            return  # a broadcast waits for nobody; a port's answers come when they come
        with self._lock:
            self._calls.append((call, what, time.time()))
            if len(self._calls) >= self._prune_at:
                self._drop_done()
            while len(self._calls) > MAX_TRACKED_CALLS:
                self._calls.popleft()

    def _drop_done(self) -> None:
        self._calls = collections.deque(c for c in self._calls if not c[0].done)
        self._prune_at = max(self.PRUNE_AT, 2 * len(self._calls))

    def busy_addrs(self) -> Dict[str, list]:
        """{proc addr: [(what, since), ...]} for every target that has not answered."""
        with self._lock:
            self._drop_done()
            calls = list(self._calls)
        busy: Dict[str, list] = {}
        for call, what, since in calls:
            for i in call.pending():
                busy.setdefault(call.target_addr(i), []).append((what, since))
        return busy


_tracker = CallTracker()


def _stopped_sessions() -> Dict[str, Any]:
    """{proc addr: the debugger Session stopped there}."""
    from . import _debug

    return {s.addr: s for s in _debug.controller().stopped()}


def _rank_state(rank: int, proc: Any, exited: Any, stopped: Any, busy: list, now: float) -> dict:
    row: Dict[str, Any] = {"rank": rank, "pid": proc.pid, "host": proc.host, "addr": proc.addr}
    if exited is not None:
        row.update(state="dead", why=exited.text or "it exited")
    elif stopped is not None:
        row.update(state="stopped", actor=stopped.actor, where=f"{stopped.function} line {stopped.line}",
                   file=stopped.file, line=stopped.line, reason=stopped.reason)
    elif busy:
        row.update(state="call", endpoints=sorted({what for what, _ in busy}),
                   since_s=round(now - min(since for _, since in busy), 3))
    else:
        row.update(state="idle")
    return row


def snapshot() -> dict:
    """This controller's allocations and the state of each of their ranks."""
    rt = get_runtime()
    busy, stopped, now = _tracker.busy_addrs(), _stopped_sessions(), time.time()
    allocations = []
    for alloc in rt.owned_allocs():
        procs = dict(alloc.procs)
        exited = dict(alloc.exited)
        ranks = [_rank_state(r, procs[r], exited.get(r), stopped.get(procs[r].addr), busy.get(procs[r].addr, []), now)
                 for r in sorted(procs)]
        allocations.append({"id": alloc.id, "name": alloc.name or "", "labels": list(alloc.shape.labels),
                            "sizes": list(alloc.shape.sizes), "ranks": ranks})
    return {"pid": os.getpid(), "kind": _controller_kind,
            "argv": "" if _controller_kind == "kernel" else " ".join(sys.argv), "allocations": allocations}


_controller_kind = "program"


def set_controller_kind(kind: str) -> None:
    """What snapshots call this controller: "program" (a script), or "kernel" (the kernel's
    set-up says so: this module does not import the kernel's)."""
    global _controller_kind
    _controller_kind = kind


# -- serving ------------------------------------------------------------------------------------
def socket_path(rundir: str, pid: int) -> str:
    return os.path.join(_core.layout_controller_dir(rundir), f"{pid}{SUFFIX}")


def _answer(request: bytes) -> dict:
    try:
        msg = json.loads(request)
    except ValueError:
        return {"error": "a request is one JSON object per line"}
    if not isinstance(msg, dict) or msg.get("op") != "snapshot":
        return {"error": "unknown request: the panel asks {\"op\": \"snapshot\"}"}
    return snapshot()


def _serve_client(conn: socket.socket, peer_pid: int) -> None:
    with conn:
        rfile = conn.makefile("rb")
        while True:
            try:
                raw = read_bounded_line(rfile, MAX_REQUEST)
            except (OSError, ValueError):
                return
            if raw == b"":  # the end of its requests (None: a line too long, answered below)
                return
            try:
                answer = {"error": f"a request is at most {MAX_REQUEST} bytes"} if raw is None else _answer(raw)
            except Exception as e:  # the panel must learn why; the controller lives on
                answer = {"error": f"the snapshot failed: {e!r}"}
            try:
                conn.sendall((json.dumps(answer) + "\n").encode())
            except OSError:
                return


_server: Optional[OwnerOnlyServer] = None


def _start(rt: Any) -> None:
    global _server, _observing
    if not _observing:  # calls are tracked in controllers only (procs' calls are nobody's panel)
        observe_calls(_tracker.note)
        _observing = True
    server = OwnerOnlyServer(socket_path(_core.runtime_dir(), os.getpid()), _serve_client, "xmesh-panel")
    if server.start("the mesh panel"):
        _server = server


def _stop(rt: Any) -> None:
    if _server is not None:
        _server.stop()


_observing = False
on_controller_start(_start)
on_controller_shutdown(_stop)


# -- reading ------------------------------------------------------------------------------------
def live_panels(rundir: str) -> Dict[int, str]:
    """{pid: socket path} of the live controllers of a runtime directory."""
    return live_sockets(rundir, SUFFIX)


def query(path: str, timeout: float = QUERY_TIMEOUT_S) -> dict:
    """One controller's snapshot (or {"error": why} when it does not answer)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(b'{"op": "snapshot"}\n')
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
        return json.loads(data)
    except (OSError, ValueError) as e:
        return {"error": f"the controller at {path} did not answer: {e}"}


def snapshots(rundir: Optional[str] = None) -> List[dict]:
    """The snapshots of every live controller of a runtime directory (default: this user's)."""
    rundir = os.path.abspath(rundir or _core.runtime_dir())
    out = []
    for pid, path in sorted(live_panels(rundir).items()):
        if pid == os.getpid():
            continue  # the reader itself (a controller too)
        snap = query(path)
        snap.setdefault("pid", pid)
        out.append(snap)
    return out


# -- the panel's sidecar ------------------------------------------------------------------------
def _agent_rows(status: Any, owners: Dict[str, dict]) -> List[dict]:
    """Every allocation of one host agent, each rank from its owner's snapshot where that
    controller answered, else from the agent (alive or not: a detached allocation's procs)."""
    rows = []
    for a in status.allocations:
        shape = dict(a.shape) if a.shape else {}
        labels = list(shape.get("labels", []))
        owner = owners.get(a.alloc)
        from_owner = {r["rank"]: r for r in owner["ranks"]} if owner else {}
        ranks = []
        for p in sorted(a.procs, key=lambda p: p.rank):
            row = from_owner.get(p.rank) or {"rank": p.rank, "pid": p.pid, "host": status.host, "addr": p.addr,
                                             "state": "detached" if p.alive else "dead",
                                             **({} if p.alive else {"why": "it exited"})}
            coords = dict(p.coords)
            row["coords"] = {label: coords[label] for label in labels if label in coords}  # in the mesh's order
            if p.state and row["state"] not in ("dead", "stopped"):
                row["process_state"] = p.state  # what /proc says of a proc that does not run normally
            ranks.append(row)
        rows.append({"id": a.alloc, "name": a.name, "labels": labels,
                     "sizes": list(shape.get("sizes", [])), "host": status.host, "runtime_dir": status.runtime_dir,
                     "controller_pid": a.controller_pid, "attached": a.attached, "created": a.created,
                     "age_s": round(time.time() - a.created, 1), "stopping": a.stopping,
                     "procs": len(a.procs), "procs_alive": sum(p.alive for p in a.procs),
                     "owner": owner["owner"] if owner else None, "ranks": ranks})
    return rows


def meshes(rundir: Optional[str] = None) -> dict:
    """What the panel lists: every allocation of this user's agent (named and unnamed, live,
    whichever controller owns it or none), its ranks' states, and the controllers that answered."""
    from ._hostd import agent

    rundir = os.path.abspath(rundir or _core.runtime_dir())
    snaps = snapshots(rundir)
    owners = {a["id"]: dict(a, owner={"pid": s.get("pid"), "kind": s.get("kind", "program"), "argv": s.get("argv", "")})
              for s in snaps for a in s.get("allocations", [])}
    from ._pids import running_agent_pid

    if running_agent_pid(rundir) is None:
        return {"runtime_dir": rundir, "agent": None, "meshes": [], "controllers": snaps}
    status = agent(rundir).status()
    return {"runtime_dir": rundir, "agent": {"pid": status.pid, "host": status.host},
            "meshes": _agent_rows(status, owners), "controllers": snaps}



# -- %xmesh -------------------------------------------------------------------------------------
STATE_COLUMNS = (("idle", "Idle"), ("call", "In a call"), ("stopped", "Stopped"), ("dead", "Dead"))


class MeshStatus:
    """What `%xmesh` shows in a cell: this kernel's allocations, a row each, with how many of
    their ranks are idle, in a call, stopped in pdb and dead (the panel's states)."""

    HEADERS = ("Name", "Shape", "Hosts", *(title for _, title in STATE_COLUMNS), "Busy in")

    def __init__(self, snap: dict) -> None:
        self.rows = []
        for a in snap.get("allocations", []):
            states = [r["state"] for r in a["ranks"]]
            busy = sorted({e for r in a["ranks"] for e in r.get("endpoints", [])})
            shape = " x ".join(f"{label}={size}" for label, size in zip(a["labels"], a["sizes"])) or "-"
            hosts = len({r["host"] for r in a["ranks"]})
            self.rows.append([a["name"] or f"(unnamed {a['id']})", shape, hosts,
                              *(states.count(state) for state, _ in STATE_COLUMNS), ", ".join(busy) or "-"])

    def __repr__(self) -> str:
        if not self.rows:
            return "no meshes in this kernel"
        table = [list(self.HEADERS)] + [[str(c) for c in row] for row in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(self.HEADERS))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table)

    def _repr_html_(self) -> str:
        from ._display import html_table

        if not self.rows:
            return "<p>no meshes in this kernel</p>"
        return html_table(f"{len(self.rows)} mesh{'es' if len(self.rows) != 1 else ''} in this kernel",
                          list(self.HEADERS), self.rows, left=(0, 1, 8))


def status() -> MeshStatus:
    """`%xmesh`: this controller's meshes and their ranks by state."""
    return MeshStatus(snapshot())
