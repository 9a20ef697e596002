"""What the mesh panel shows of a controller (issue 22), asked without its prompt or its cell.

Every controller (kernel or script) answers queries on `<runtime dir>/c/<pid>.panel` (a unix
socket only this user reaches, _unix_server): JSON lines, one request `{"op": "snapshot"}` (with
`"since": DIGEST`, answered `{"unchanged": DIGEST}` while the snapshot has that digest) and
one answer per line, so a Jupyter server can read a kernel whose cell is blocked in a call. A
snapshot lists the allocations the controller owns, each rank's state:

- `dead` (and why: its exit as the agent reported it),
- `stopped` (in pdb: the actor, the function and line),
- `call` (the endpoints it has not answered yet, broadcasts it has not ended and calls cancelled
  that still run, since when: the oldest call's start),
- `idle`.

Calls are tracked by an observer of every call the controller sends (`_runtime.process.observe_calls`):
only the unanswered targets of each (`Call.missing()`) count, and finished calls are dropped as
snapshots and new calls come. `snapshots(rundir)` is the reading side, for every live
controller of a runtime directory.
"""
import collections
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from .. import _core
from .._base.protocol import actor_mesh_name
from .._runtime.process import get_runtime, observe_calls, on_controller_shutdown, on_controller_start
from .._runtime.unix_server import OwnerOnlyServer, live_sockets, read_bounded_line

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
            return  # a send to a port: its answers come when they come
        actor = targets[0][1] if targets and isinstance(targets[0], tuple) else ""  # an id: named when read
        with self._lock:
            self._calls.append((call, what, time.time(), actor))
            if len(self._calls) >= self._prune_at:
                self._drop_done()
            while len(self._calls) > MAX_TRACKED_CALLS:
                self._calls.popleft()

    def _drop_done(self) -> None:
        self._calls = collections.deque(c for c in self._calls if not c[0].settled)
        self._prune_at = max(self.PRUNE_AT, 2 * len(self._calls))

    def busy_addrs(self) -> Dict[str, list]:
        """{proc addr: [(what, since, actor mesh), ...]} for every target that has not answered."""
        with self._lock:
            self._drop_done()
            calls = list(self._calls)
        busy: Dict[str, list] = {}
        for call, what, since, actor_id in calls:
            actor = actor_mesh_name(actor_id) if actor_id else ""
            for i in call.missing():
                busy.setdefault(call.target_addr(i), []).append((what, since, actor))
            for i in call.lingering():  # cancelled, still inside a C call
                busy.setdefault(call.target_addr(i), []).append((f"{what} (cancelled, still running)", since, actor))
        return busy


_tracker = CallTracker()


def _stopped_sessions() -> Dict[str, Any]:
    """{proc addr: the debugger Session stopped there}."""
    from .._debug import controller as _debug

    return {s.addr: s for s in _debug.controller().stopped()}


def _rank_state(rank: int, proc: Any, exited: Any, stopped: Any, busy: list, now: float) -> dict:
    row: Dict[str, Any] = {"rank": rank, "pid": proc.pid, "host": proc.host, "addr": proc.addr}
    if exited is not None:
        row.update(state="dead", why=exited.text or "it exited")
    elif stopped is not None:
        row.update(state="stopped", actor=stopped.actor, where=f"{stopped.function} line {stopped.line}",
                   file=stopped.file, line=stopped.line, reason=stopped.reason)
    elif busy:
        oldest = min(busy, key=lambda b: b[1])
        row.update(state="call", endpoints=sorted({b[0] for b in busy}),
                   since=round(oldest[1], 3))  # when (epoch s): a reader derives the age
        if oldest[2]:
            row["actor"] = oldest[2]  # the actor mesh running it (what `pause` names)
    else:
        row.update(state="idle")
    return row


def _held_back(rt: Any, alloc_id: str) -> dict:
    """The lines of an allocation a flood made the display hold back (they are in its log
    files): {"total": N, "ranks": {rank: n}}."""
    logs = getattr(rt, "logs", None)
    by_rank = logs.router.held_back(alloc_id) if logs is not None else {}
    return {"total": sum(by_rank.values()), "ranks": {str(r): n for r, n in sorted(by_rank.items())}}


class RemoteAgents:
    """What this controller's host agents on other machines (TCP, jobs) hold besides its own
    allocations: detached named ones, other controllers'. Their Status is asked at most every
    TTL_S (a snapshot is read every second or so) with a short timeout, so an unreachable host
    costs a snapshot TIMEOUT_S at most, every TTL_S; it is listed with why."""

    TTL_S = 5.0
    TIMEOUT_S = 1.0

    def __init__(self) -> None:
        self._seen: Dict[str, tuple] = {}  # locator -> (when, its entry)
        self._lock = threading.Lock()

    def entries(self, owned: set) -> List[dict]:
        from .._runtime.agents import TcpAgentClient, connected_agents

        out = []
        for a in connected_agents():
            if isinstance(a, TcpAgentClient):
                out.append(self._entry(a, owned))
        return out

    def _entry(self, a: Any, owned: set) -> dict:
        with self._lock:
            when, entry = self._seen.get(a.runtime_dir, (0.0, None))
            if entry is None or time.monotonic() - when >= self.TTL_S:
                try:
                    status = a.status(timeout=self.TIMEOUT_S).to_dict()
                    entry = {"locator": a.runtime_dir, "status": status}
                except Exception as e:  # an unreachable host: listed with why
                    entry = {"locator": a.runtime_dir, "error": f"{type(e).__name__}: {e}"}
                self._seen[a.runtime_dir] = (time.monotonic(), entry)
        if "status" not in entry:
            return entry
        status = dict(entry["status"], allocations=[x for x in entry["status"].get("allocations", [])
                                                    if x.get("alloc") not in owned])
        return dict(entry, status=status)


_remote = RemoteAgents()


def snapshot() -> dict:
    """This controller's allocations and the state of each of their ranks, and what its host
    agents on other machines hold besides (`remote`)."""
    rt = get_runtime()
    busy, stopped, now = _tracker.busy_addrs(), _stopped_sessions(), time.time()
    allocations = []
    for alloc in rt.owned_allocs():
        procs = dict(alloc.procs)
        exited = dict(alloc.exited)
        ranks = [_rank_state(r, procs[r], exited.get(r), stopped.get(procs[r].addr), busy.get(procs[r].addr, []), now)
                 for r in sorted(procs)]
        allocations.append({"id": alloc.id, "name": alloc.name or "", "created": alloc.created,
                            "labels": list(alloc.shape.labels),
                            "sizes": list(alloc.shape.sizes), "ranks": ranks, "held_back": _held_back(rt, alloc.id)})
    from .._workspace.sync import sync_state

    return {"pid": os.getpid(), "kind": _controller_kind,
            "argv": "" if _controller_kind == "kernel" else " ".join(sys.argv), **_notebook,
            "allocations": allocations, "sync": sync_state(), "remote": _remote.entries({a["id"] for a in allocations})}


_controller_kind = "program"
_notebook: Dict[str, str] = {}  # a kernel's: {"notebook": path, "kernel_id": id} where known


def set_controller_kind(kind: str, notebook: str = "", kernel_id: str = "") -> None:
    """What snapshots call this controller: "program" (a script), or "kernel" (the kernel's
    set-up says so: this module does not import the kernel's), with the notebook it runs (the
    path its Jupyter server started it for) and its kernel id (what the server's sessions name)."""
    global _controller_kind
    _controller_kind = kind
    _notebook.clear()
    _notebook.update({k: v for k, v in (("notebook", notebook), ("kernel_id", kernel_id)) if v})


def controller_label(snap: dict) -> str:
    """How a controller is named to a person: a kernel by its notebook, a program by its
    command line ("notebook train.ipynb (kernel pid 42)", "program python3 run.py (pid 43)")."""
    pid = snap.get("pid", "?")
    if snap.get("kind") == "kernel":
        where = f"notebook {snap['notebook']}" if snap.get("notebook") else "a kernel with no notebook known"
        return f"{where} (kernel pid {pid})"
    if snap.get("error"):
        return f"pid {pid} (did not answer: {snap['error']})"
    return f"program {snap.get('argv') or '?'} (pid {pid})"


# -- serving ------------------------------------------------------------------------------------
def socket_path(rundir: str, pid: int) -> str:
    return os.path.join(_core.layout_controller_dir(rundir), f"{pid}{SUFFIX}")


def _answer(request: bytes) -> str:
    """The answer's JSON text: the snapshot with its `digest` (a hash of it), or, asked `since`
    that digest, {"unchanged": digest}: a reader that polls an idle controller gets a few bytes,
    not the state of 512 ranks (SnapshotReader)."""
    try:
        msg = json.loads(request)
    except ValueError:
        return json.dumps({"error": "a request is one JSON object per line"})
    if not isinstance(msg, dict) or msg.get("op") != "snapshot":
        return json.dumps({"error": "unknown request: the panel asks {\"op\": \"snapshot\"}"})
    data = json.dumps(snapshot())
    digest = hashlib.sha1(data.encode()).hexdigest()[:16]
    if msg.get("since") == digest:
        return json.dumps({"unchanged": digest})
    return f'{data[:-1]}, "digest": "{digest}"}}'  # data is a JSON object: "{...}"


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
                answer = json.dumps({"error": f"a request is at most {MAX_REQUEST} bytes"}) if raw is None \
                    else _answer(raw)
            except Exception as e:  # the panel must learn why; the controller lives on
                answer = json.dumps({"error": f"the snapshot failed: {e!r}"})
            try:
                conn.sendall((answer + "\n").encode())
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


def query_raw(path: str, timeout: float = QUERY_TIMEOUT_S, since: str = "") -> bytes:
    """One controller's snapshot as it came (one JSON line; {"unchanged": since} when its digest is
    still `since`), or an error object when it does not answer."""
    request = json.dumps({"op": "snapshot", **({"since": since} if since else {})}).encode() + b"\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(request)
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
        return data
    except OSError as e:
        return json.dumps({"error": f"the controller at {path} did not answer: {e}"}).encode()


def decode(pid: int, raw: bytes) -> dict:
    try:
        snap = json.loads(raw)
    except ValueError as e:
        snap = {"error": f"controller {pid} answered something that is not a snapshot: {e}"}
    snap.setdefault("pid", pid)
    return snap


class SnapshotReader:
    """A reader that polls (the panel's sidecar): each controller is asked `since` the digest of
    the snapshot last read from it, and an unchanged one is the bytes read then."""

    _DIGEST = re.compile(rb', "digest": "([0-9a-f]+)"}\s*$')

    def __init__(self) -> None:
        self._last: Dict[str, Tuple[str, bytes]] = {}  # socket path -> (digest, snapshot)

    def read(self, path: str) -> bytes:
        digest, raw = self._last.get(path, ("", b""))
        answer = query_raw(path, since=digest)
        if digest and answer.startswith(b'{"unchanged": ') and digest.encode() in answer:
            return raw
        found = self._DIGEST.search(answer[-64:])
        if found:
            self._last[path] = (found.group(1).decode(), answer)
        return answer

    def forget_others(self, paths: Any) -> None:
        """Drops what it kept of controllers not among paths (they ended)."""
        for path in set(self._last) - set(paths):
            del self._last[path]


def raw_snapshots(rundir: Optional[str] = None, reader: Optional[SnapshotReader] = None) -> List[Tuple[int, bytes]]:
    """[(pid, its snapshot as it came)] of every live controller of a runtime directory (default:
    this user's): a reader that polls compares these before decoding anything (and passes its
    SnapshotReader, so that an idle controller answers in a few bytes)."""
    rundir = os.path.abspath(rundir or _core.runtime_dir())
    live = {pid: path for pid, path in live_panels(rundir).items() if pid != os.getpid()}  # not the reader itself
    if reader is not None:
        reader.forget_others(live.values())
    return [(pid, reader.read(path) if reader is not None else query_raw(path)) for pid, path in sorted(live.items())]


def snapshots(rundir: Optional[str] = None) -> List[dict]:
    """The snapshots of every live controller of a runtime directory (default: this user's)."""
    return [decode(pid, raw) for pid, raw in raw_snapshots(rundir)]


# -- the panel's sidecar ------------------------------------------------------------------------
def _coords(rank: int, labels: List[str], sizes: List[int]) -> Dict[str, int]:
    """A rank's coordinates in a dense row-major shape (the last label varies fastest)."""
    out: Dict[str, int] = {}
    for label, size in reversed(list(zip(labels, sizes))):
        out[label] = rank % max(size, 1)
        rank //= max(size, 1)
    return {label: out[label] for label in labels}


def _agent_rank(p: Any, host: str) -> dict:
    """A rank as only its host agent knows it: no controller reports on it."""
    return {"rank": p.rank, "pid": p.pid, "host": host, "addr": p.addr, "state": "detached" if p.alive else "dead",
            **({} if p.alive else {"why": "it exited"})}


def _mesh_row(alloc_id: str, owner: Optional[dict], local: Any, status: Any) -> dict:
    """One allocation: its ranks from the controller that owns it where one answered (every rank,
    on every host it spans), else from this host's agent; facts from both."""
    shape = dict(local.shape) if local is not None and local.shape else {}
    labels = list(owner["labels"] if owner else shape.get("labels", []))
    sizes = list(owner["sizes"] if owner else shape.get("sizes", []))
    agent_procs = {p.rank: p for p in (local.procs if local is not None else [])}
    if owner:
        ranks = [dict(r) for r in owner["ranks"]]
    else:
        ranks = [_agent_rank(p, status.host) for _, p in sorted(agent_procs.items())]
    for row in ranks:
        p = agent_procs.get(row["rank"])
        row["coords"] = dict(p.coords) if p is not None else _coords(row["rank"], labels, sizes)
        row["coords"] = {label: row["coords"][label] for label in labels if label in row["coords"]}
        if p is not None and p.state and row["state"] not in ("dead", "stopped"):
            row["process_state"] = p.state  # what /proc says of a proc that does not run normally
    hosts = sorted({r["host"] for r in ranks if r.get("host")}) or [status.host if status else ""]
    return {"id": alloc_id, "name": (owner or {}).get("name") or (local.name if local is not None else ""),
            "labels": labels, "sizes": sizes, "host": ", ".join(hosts), "hosts": hosts,
            **_allocation_facts(owner, local, status),
            "procs": len(ranks), "procs_alive": sum(r["state"] != "dead" for r in ranks),
            "owner": owner["owner"] if owner else None, "held_back": owner.get("held_back") if owner else None,
            "ranks": ranks}


def _remote_rows(snaps: List[dict], listed: set) -> List[dict]:
    """The allocations no controller here owns on the other hosts this user's controllers use
    (detached named ones, mostly), as those controllers' last look at the agents' Status found
    them (an agent serves one user: all are this user's)."""
    rows = []
    for snap in snaps:
        for entry in snap.get("remote", []):
            if "status" not in entry:
                continue
            status = _core.StatusReply.from_dict(entry["status"])
            for a in status.allocations:
                if a.alloc not in listed:
                    listed.add(a.alloc)
                    rows.append(_mesh_row(a.alloc, None, a, status))
    return rows


def _allocation_facts(owner: Optional[dict], local: Any, status: Any) -> dict:
    """Who made it and when, from this host's agent where it knows the allocation, else from
    its owner (an allocation on other hosts)."""
    if local is not None:
        return {"runtime_dir": status.runtime_dir, "controller_pid": local.controller_pid, "attached": local.attached,
                "created": round(local.created, 3), "stopping": bool(local.stopping)}
    assert owner is not None, "an allocation is listed by this host's agent or by its owner"
    return {"runtime_dir": None, "controller_pid": owner["owner"]["pid"], "attached": True,
            "created": round(owner.get("created", time.time()), 3), "stopping": False}


class StatusCache:
    """The host agent's Status for a reader that asks often (the panel's sidecar, every second
    per shown panel): read again when `key` changes (the controllers reported a new allocation or
    a death) or after TTL_S, so the agent walks its procs at most every few seconds while
    nothing happens. What only the agent sees (a detached allocation's proc dying, /proc's state
    of a stopped proc) shows within TTL_S."""

    TTL_S = 5.0

    def __init__(self) -> None:
        self._status: Any = None
        self._key: Any = None
        self._at = 0.0

    def fresh(self) -> bool:
        """Whether what it holds may still be shown (read within TTL_S)."""
        return self._status is not None and time.monotonic() - self._at < self.TTL_S

    def get(self, rundir: str, key: Any) -> Any:
        from .._runtime.agents import agent

        now = time.monotonic()
        if self._status is None or key != self._key or now - self._at >= self.TTL_S \
                or self._status.runtime_dir != rundir:
            self._status, self._key, self._at = agent(rundir).status(), key, now
        return self._status


def _agent_status(rundir: str, owners: Dict[str, dict], cache: Optional[StatusCache]) -> Any:
    """This host's agent's Status (None where none runs), through the cache if one is given."""
    from .._runtime.agents import agent
    from .._base.pids import running_agent_pid

    if running_agent_pid(rundir) is None:
        return None
    if cache is None:
        return agent(rundir).status()
    deaths = sum(r["state"] == "dead" for a in owners.values() for r in a["ranks"])
    return cache.get(rundir, (tuple(sorted(owners)), deaths))


def meshes(rundir: Optional[str] = None, cache: Optional[StatusCache] = None,
           raws: Optional[List[Tuple[int, bytes]]] = None) -> dict:
    """What the panel lists: every allocation of this user's agent (named and unnamed, live,
    whichever controller owns it or none) and every allocation this user's controllers own on
    other hosts (TCP host agents, jobs), its ranks' states, and the controllers that answered
    (their pid, kind and sync view; their allocations are the meshes). raws: the controllers'
    snapshots where the caller has read them already (raw_snapshots)."""
    rundir = os.path.abspath(rundir or _core.runtime_dir())
    snaps = [decode(pid, raw) for pid, raw in (raws if raws is not None else raw_snapshots(rundir))]
    owners = {a["id"]: dict(a, owner={"pid": s.get("pid"), "kind": s.get("kind", "program"), "argv": s.get("argv", ""),
                                      **{k: s[k] for k in ("notebook", "kernel_id") if s.get(k)}})
              for s in snaps for a in s.get("allocations", [])}
    status = _agent_status(rundir, owners, cache)
    local = {a.alloc: a for a in status.allocations} if status is not None else {}
    rows = [_mesh_row(i, owners.get(i), local.get(i), status) for i in list(local) + [i for i in owners if i not in local]]
    rows += _remote_rows(snaps, {r["id"] for r in rows})
    controllers = [{k: v for k, v in s.items() if k not in ("allocations", "remote", "digest")} for s in snaps]
    unreachable = {e["locator"]: e["error"] for s in snaps for e in s.get("remote", []) if "error" in e}
    return {"runtime_dir": rundir, "agent": {"pid": status.pid, "host": status.host} if status is not None else None,
            "meshes": rows, "controllers": controllers,
            "unreachable": [{"locator": k, "error": v} for k, v in sorted(unreachable.items())]}


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
        from .._base.display import html_table

        if not self.rows:
            return "<p>no meshes in this kernel</p>"
        return html_table(f"{len(self.rows)} mesh{'es' if len(self.rows) != 1 else ''} in this kernel",
                          list(self.HEADERS), self.rows, left=(0, 1, 8))


def status() -> MeshStatus:
    """`%xmesh`: this controller's meshes and their ranks by state."""
    return MeshStatus(snapshot())
