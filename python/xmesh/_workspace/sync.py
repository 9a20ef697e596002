"""sync_workspace (DESIGN §8): push local directories to every host agent of a mesh, incrementally,
and optionally reload the changed modules in live actors. The work is C++ (workspace_sync/):
this module picks the hosts and the procs, and turns the outcome into a report."""
import hashlib
import html
import json
import os
import threading
import time
import weakref
from typing import Optional, Union

from .. import _core
from .._base.display import html_table
from .._base.env import env_float
from .._base.protocol import read_error
from .._runtime.process import Kind, get_runtime
from .._base.shape import ranks_text
from .._runtime.wait import Request
from .._base.threads import start_thread

DEFAULT_MAX_FILE_SIZE = 100 * 2**20


class Workspace:
    """One or more local directories to sync (Monarch's `Workspace`). `dirs`: a list of paths
    (each lands in a directory of its own name under every host's workspace root, $XMESH_WORKSPACE),
    or a dict {local path: destination relative to that root}."""

    def __init__(self, dirs: Union[None, str, os.PathLike, list, tuple, dict] = None,
                 env: Optional[dict] = None) -> None:
        if dirs is None:
            dirs = [os.getcwd()]
        if isinstance(dirs, (str, os.PathLike)):
            dirs = [dirs]
        if isinstance(dirs, dict):
            pairs = [(os.fspath(k), os.fspath(v)) for k, v in dirs.items()]
        else:
            pairs = []
            for d in dirs:
                path = os.path.abspath(os.fspath(d))
                pairs.append((d, os.path.basename(path.rstrip("/")) or ""))
        self.dirs = {os.path.abspath(local): dest.strip("/") for local, dest in pairs}
        self.env = env
        dests = list(self.dirs.values())
        if len(set(dests)) != len(dests):
            raise ValueError(f"two workspace directories would land in the same place on the hosts: {self.dirs}")

    def __repr__(self):
        return f"Workspace({self.dirs!r})"


def workspace_dir(runtime_dir, space_for=None):
    """Where the host agent of runtime_dir keeps this controller's synced workspace, or that of
    the named allocation space_for: the $XMESH_WORKSPACE of their procs there."""
    space = _core.layout_named_space(space_for) if space_for else \
        _core.layout_controller_space(get_runtime().node.id)
    return os.path.join(_core.layout_workspace_root(runtime_dir), space)


def _targets(workspace, dest):
    """[(local directory, destination)] for the forms sync_workspace accepts."""
    if isinstance(workspace, Workspace):
        if dest is not None:
            raise ValueError("dest= goes with a single directory; a Workspace names its destinations itself")
        return list(workspace.dirs.items())
    if isinstance(workspace, (list, tuple, dict)):
        return _targets(Workspace(workspace), dest)
    if not isinstance(workspace, (str, os.PathLike)):
        raise TypeError(f"sync_workspace() takes a directory, a list of them or a Workspace, got {workspace!r}")
    return [(os.path.abspath(os.fspath(workspace)), (os.fspath(dest) if dest is not None else "").strip("/"))]


def _cache_path(local):
    """The local manifest cache of a tree (hashes reused under the racy-file rule)."""
    directory = _core.layout_sync_cache_dir(_core.runtime_dir())
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.path.join(directory, hashlib.sha1(local.encode()).hexdigest()[:20] + ".manifest")


def _label(agent, agents):
    """A host's name in messages: its hostname, with the runtime directory when several agents
    run on one machine."""
    same_host = [a for a in agents if a.host == agent.host]
    return f"{agent.host}:{agent.runtime_dir}" if len(same_host) > 1 else str(agent.host)


human_bytes = _core.format_bytes


def _check_local(local):
    if not os.path.exists(local):
        raise FileNotFoundError(f"sync_workspace: {local} does not exist")
    if not os.path.isdir(local):
        raise NotADirectoryError(f"sync_workspace: {local} is not a directory")


def push(agents, workspace, *, dest=None, exclude=(), max_file_size=DEFAULT_MAX_FILE_SIZE, compress="auto",
         ignore_files=True, space_for=None):
    """Syncs to every agent (once each, concurrently) into the workspace of the named
    allocation `space_for`, or of this controller (None). Returns a SyncReport (no reloads)."""
    if isinstance(exclude, str):
        exclude = [exclude]
    exclude = [str(p) for p in exclude]
    if max_file_size is not None and (not isinstance(max_file_size, int) or max_file_size <= 0):
        raise ValueError(f"max_file_size must be a positive number of bytes or None, got {max_file_size!r}")
    rt = get_runtime()
    unique = list({a.runtime_dir: a.connect() for a in agents}.values())
    suffix = f" [{space_for}]" if space_for else ""
    hosts = [(a.addr, _label(a, unique) + suffix) for a in unique]
    parts = []
    start = time.monotonic()
    for local, target in _targets(workspace, dest):
        _check_local(local)
        options = {"dest": target, "exclude": exclude, "max_file_size": max_file_size or 0,
                   "cache_path": _cache_path(local), "compress": compress, "ignore_files": ignore_files,
                   "step_timeout_ms": int(env_float("XMESH_SYNC_STEP_TIMEOUT", 60) * 1000),
                   "space_for": space_for or "",
                   "incremental": os.environ.get("XMESH_SYNC_INCREMENTAL", "1") != "0"}
        report = json.loads(_core.workspace_push(rt.node, local, hosts, json.dumps(options)))
        report["local"] = local
        report["dest"] = target
        report["space_for"] = space_for
        for h, a in zip(report["hosts"], unique):
            h["agent"] = a
        parts.append(report)
    return SyncReport(parts, time.monotonic() - start)


def reload_procs(report, procs):
    """Asks procs [(rank, addr, agent, space_for)] to reload the modules of the files the sync
    changed in their workspace (their host's copy for their allocation); fills report.reloads."""
    rt = get_runtime()
    changed_by_host: dict = {}
    for part in report.parts:
        for h in part["hosts"]:
            if h.get("same"):
                continue
            files = [os.path.join(h["dir"], p) for p in h.get("py_paths", [])]
            changed_by_host.setdefault((h["agent"].runtime_dir, part.get("space_for")), []).extend(files)
    by_host: dict = {}
    for rank, addr, agent, space_for in procs:
        key = (agent.runtime_dir, space_for)
        if changed_by_host.get(key) and rt.node.dead_reason(addr) is None:
            by_host.setdefault(key, []).append((rank, addr))
    asked = [(members, Request(rt.node, [addr for _, addr in members], Kind.Reload,
                               _core.ReloadBody(files=changed_by_host[host]).to_dict()))
             for host, members in by_host.items()]
    deadline = time.monotonic() + 30
    for members, req in asked:
        answers = req.answers(max(0.0, deadline - time.monotonic()), "the procs' reloads")
        for i, (rank, _) in enumerate(members):
            ok, body, _ = answers.get(i, (False, None, None))
            if ok:
                report.reloads.append(dict(_core.ReloadReply.from_dict(body).to_dict(), rank=rank))
            else:
                why = read_error(body).text if body is not None else "no answer within 30 s"
                report.reloads.append({"rank": rank, "reloaded": [], "failed": [["*", why]]})
    report.reloads.sort(key=lambda r: r["rank"])


_CHANGED_SHOWN = 10  # a report names up to this many files sent, else the largest
REPORT_PATHS = 1000  # what a report lists of each kind of path at most (kReportPaths, workspace_sync/sender.cpp)


def sync_workspace(spaces, procs_of, workspace=".", *, dest=None, exclude=(), auto_reload=False,
                   max_file_size=DEFAULT_MAX_FILE_SIZE, watch=False, compress="auto", conda=False):
    """The body of HostMesh.sync_workspace and ProcMesh.sync_workspace. spaces: [(space_for,
    agents)], the workspaces to sync (this controller's: None; a named allocation's: its name)
    and their hosts; procs_of() the [(rank, addr, agent, space_for)] to reload in (asked after
    each sync)."""
    if conda:
        raise NotImplementedError("sync_workspace(conda=True) is not supported by xmesh: it syncs directories; "
                                  "sync an environment's site-packages directory with Workspace(dirs=...) instead")
    spec = dict(dest=dest, exclude=exclude, max_file_size=max_file_size, compress=compress)

    def once():
        parts, start = [], time.monotonic()
        for space_for, agents in spaces:
            parts += push(agents, workspace, space_for=space_for, **spec).parts
            if space_for is None:
                _remember_host_sync(agents, workspace, spec)
        report = SyncReport(parts, time.monotonic() - start)
        if auto_reload and not report.up_to_date:
            reload_procs(report, procs_of())
        _ledger.note_report(report)
        return report

    first = once()
    if not watch:
        return first
    watcher = WorkspaceWatcher(once, [local for local, _ in _targets(workspace, dest)], on_report=_print_report)
    watcher.reports.append(first)
    _ledger.note_watcher(watcher)
    return watcher


class SyncLedger:
    """What this controller last synced to each host, and its `watch=True` watchers: the mesh
    panel's sync view (through _panel's snapshot)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hosts: dict = {}  # host label -> its row of the last report that reached it
        self._watchers: list = []  # weak references: a watcher dropped by the user leaves the list

    def note_report(self, report: "SyncReport") -> None:
        """A sync that found a host already up to date only says when it looked (`checked`):
        the row keeps what the last sync that changed something sent there."""
        now = time.time()
        with self._lock:
            for row in report.hosts:
                known = self._hosts.get(row["host"])
                if row["same"] and known is not None:
                    known["checked"] = now
                    continue
                self._hosts[row["host"]] = dict(row, time=now, checked=now, seconds=round(report.seconds, 3),
                                                files=report.changed_files[:_CHANGED_SHOWN])

    def note_watcher(self, watcher: "WorkspaceWatcher") -> None:
        with self._lock:
            self._watchers.append(weakref.ref(watcher))

    def state(self) -> dict:
        """{"hosts": [last sync per host], "watchers": [each live watcher's state]}."""
        with self._lock:
            hosts = [dict(row) for _, row in sorted(self._hosts.items())]
            self._watchers = [w for w in self._watchers if w() is not None]
            watchers = [w() for w in self._watchers]
        return {"hosts": hosts, "watchers": [w.state() for w in watchers if w is not None]}


_ledger = SyncLedger()


def sync_state() -> dict:
    """This controller's sync view: the last sync per host and its watchers."""
    return _ledger.state()


# What this controller synced into its own workspace on each host (runtime dir -> {targets:
# (workspace, spec)}): a named allocation spawned there later starts from the same files.
_host_syncs: dict = {}
_host_syncs_lock = threading.Lock()


def _remember_host_sync(agents, workspace, spec):
    key = tuple(_targets(workspace, spec["dest"]))
    with _host_syncs_lock:
        for a in agents:
            _host_syncs.setdefault(a.runtime_dir, {})[key] = (workspace, spec)


def seed_named_workspace(agents, name):
    """Before a named allocation's procs start: its workspace on each host gets what this
    controller synced to its own workspace there (a named allocation has a workspace of its
    own, which outlives this controller)."""
    with _host_syncs_lock:
        todo = {a.runtime_dir: (a, list(_host_syncs.get(a.runtime_dir, {}).values())) for a in agents}
    for a, syncs in todo.values():
        for workspace, spec in syncs:
            try:
                push([a], workspace, space_for=name, **spec)
            except Exception as e:  # the spawn goes on: the user can sync the allocation itself
                get_runtime().diag(f"allocation {name!r} on {a.host} starts without the workspace this program "
                                    f"synced there earlier ({workspace}): {e}; procs.sync_workspace(...) gives it")


def _print_report(report, error):
    print(f"xmesh sync failed: {error}" if error is not None else report.summary(), flush=True)


class SyncReport:
    """What a sync_workspace did: per host the files added / changed / deleted / unchanged and
    the bytes sent and received, the largest files and directories sent, what was skipped, and
    with auto_reload the modules reloaded per rank. Awaitable (for code written against
    Monarch's async API): awaiting it returns itself."""

    def __init__(self, parts: list[dict], seconds: float) -> None:
        self.parts = parts
        self.seconds = seconds
        self.reloads: list[dict] = []

    def __await__(self):
        if False:
            yield
        return self

    # -- figures -----------------------------------------------------------------------------
    def _trees(self):
        """The host rows of each local directory synced (and its destination), whatever the
        workspaces (this controller's, named allocations') it went to."""
        trees: dict = {}
        for p in self.parts:
            trees.setdefault((p["local"], p["dest"]), []).extend(p["hosts"])
        return trees

    def _first_parts(self):
        """One part per directory synced (the others are the same scan, for other workspaces)."""
        first: dict = {}
        for p in self.parts:
            first.setdefault((p["local"], p["dest"]), p)
        return list(first.values())

    def _sum(self, key):
        """Per directory synced, the most of any host (hosts usually move alike), summed."""
        return sum(max((h.get(key, 0) for h in hosts), default=0) for hosts in self._trees().values())

    @property
    def added(self) -> int:
        return self._sum("added")

    @property
    def changed(self) -> int:
        return self._sum("changed")

    @property
    def deleted(self) -> int:
        return self._sum("deleted")

    @property
    def unchanged(self) -> int:
        total = 0
        scans = {(p["local"], p["dest"]): p["scan"] for p in self.parts}
        for tree, hosts in self._trees().items():
            counts = [h["unchanged"] for h in hosts if "unchanged" in h]
            total += min(counts) if counts else scans[tree]["files"] + scans[tree]["symlinks"]
        return total

    @property
    def bytes_sent(self) -> int:
        return sum(h.get("bytes_sent", 0) for p in self.parts for h in p["hosts"])

    @property
    def bytes_received(self) -> int:
        """What the host agents counted (all hosts)."""
        return sum(h.get("bytes_received", 0) for p in self.parts for h in p["hosts"])

    @property
    def hosts(self) -> list[dict]:
        """Per host: label, directory, whether it was already equal, counts and bytes."""
        out: dict = {}
        for p in self.parts:
            for h in p["hosts"]:
                e = out.setdefault(h["label"], {"host": h["label"], "dirs": [], "same": True, "added": 0, "changed": 0,
                                                "deleted": 0, "bytes_sent": 0, "bytes_received": 0})
                e["dirs"].append(h.get("dir", ""))
                e["same"] = e["same"] and bool(h.get("same"))
                for k in ("added", "changed", "deleted", "bytes_sent", "bytes_received"):
                    e[k] += h.get(k, 0)
        return list(out.values())

    def _sent_rows(self, key: str) -> list[tuple[str, int, int]]:
        rows = []
        for p in self._first_parts():
            prefix = (p["dest"] + "/") if p["dest"] else ""
            rows += [(prefix + path, size, stored) for path, size, stored in p["sent"][key]]
        return rows

    @property
    def files_sent_count(self) -> int:
        """How many files' content travelled (files_sent lists up to REPORT_PATHS of them)."""
        return sum(p["sent"]["files"] for p in self._first_parts())

    @property
    def files_sent(self) -> list[tuple[str, int, int]]:
        """[(path, size, bytes sent)] of the content that travelled, largest first: every file, or
        the REPORT_PATHS largest of each directory synced when more were sent (files_sent_count
        says how many), so that a million-file sync's report stays small."""
        return sorted(self._sent_rows("largest"), key=lambda r: -r[1])

    @property
    def dirs_sent(self) -> list[tuple[str, int]]:
        """[(top-level directory, bytes)] of the content that travelled, largest first (every
        file counted)."""
        totals: dict = {}
        for p in self._first_parts():
            for top, size in p["sent"]["dirs"]:
                key = p["dest"] + "/" if p["dest"] else top
                totals[key] = totals.get(key, 0) + size
        return sorted(totals.items(), key=lambda kv: -kv[1])

    @property
    def skipped(self) -> list[tuple[str, str, str]]:
        return [(p["local"], path, why) for p in self._first_parts() for path, why in p["scan"]["skipped"]]

    @property
    def up_to_date(self) -> bool:
        return all(h.get("same") for p in self.parts for h in p["hosts"])

    # -- display -------------------------------------------------------------------------------
    def _reload_lines(self):
        """(lines, warnings): what each rank reloaded, and what it could not (identical lines
        of several ranks merged)."""
        lines = []
        by_modules: dict = {}
        failures: dict = {}
        for r in self.reloads:
            for mod, err in r.get("failed", []):
                failures.setdefault((mod, err), []).append(r["rank"])
            if r.get("reloaded") or not r.get("failed"):  # a rank that only failed says so below
                by_modules.setdefault(tuple(r.get("reloaded", [])), []).append(r["rank"])
        for mods, ranks in sorted(by_modules.items(), key=lambda kv: min(kv[1])):
            what = ", ".join(mods) if mods else "nothing (no changed module was loaded)"
            lines.append(f"reloaded on {ranks_text(ranks)}: {what}")
        warnings = [f"warning: {ranks_text(ranks)} could not reload {mod}: {err}"
                    for (mod, err), ranks in sorted(failures.items(), key=lambda kv: min(kv[1]))]
        return lines, warnings

    @property
    def changed_files(self) -> list[str]:
        """Paths whose content was sent (added or changed), in path order: all of them, or the
        first REPORT_PATHS of each directory synced when more were sent (files_sent_count)."""
        return sorted({path for path, _, _ in self._sent_rows("first")})

    def summary(self) -> str:
        dirs = ", ".join(local + (f" -> {dest}" if dest else "") for local, dest in self._trees())
        n_hosts = len({h["agent"].runtime_dir for p in self.parts for h in p["hosts"]})
        skipped = len(self.skipped)
        not_sent = f"; {skipped} skipped (see .skipped)" if skipped else ""
        if self.up_to_date:
            return (f"workspace {dirs}: {n_hosts} host{'s' if n_hosts != 1 else ''} already up to date "
                    f"({self.unchanged} files{not_sent}; {self.seconds * 1000:.0f} ms)")
        return (f"workspace {dirs} -> {n_hosts} host{'s' if n_hosts != 1 else ''}: {self.added} added, "
                f"{self.changed} changed, {self.deleted} deleted, {self.unchanged} unchanged{not_sent}; sent "
                f"{human_bytes(self.bytes_sent)}, host agents received {human_bytes(self.bytes_received)}; "
                f"{self.seconds:.2f} s")

    def __repr__(self):
        lines = [self.summary()]
        hosts = self.hosts
        if len(hosts) > 1 or not self.up_to_date:
            for h in hosts:
                state = "already up to date" if h["same"] else (
                    f"{h['added']} added, {h['changed']} changed, {h['deleted']} deleted, "
                    f"received {human_bytes(h['bytes_received'])}")
                lines.append(f"  {h['host']}: {', '.join(h['dirs'])}: {state}")
        files = self.files_sent
        changed = self.changed_files
        if changed:
            count = self.files_sent_count
            more = f" and {count - _CHANGED_SHOWN} more" if count > _CHANGED_SHOWN else ""
            lines.append("  sent: " + ", ".join(changed[:_CHANGED_SHOWN]) + more)
        if len(files) > _CHANGED_SHOWN:
            lines.append("  largest files sent: " + ", ".join(f"{p} ({human_bytes(s)})" for p, s, _ in files[:5]))
            lines.append("  largest directories sent: " + ", ".join(f"{d} ({human_bytes(s)})"
                                                                    for d, s in self.dirs_sent[:5]))
        for local, path, why in self.skipped[:10]:
            lines.append(f"  skipped {path}: {why}")
        if len(self.skipped) > 10:
            lines.append(f"  and {len(self.skipped) - 10} more skipped (see .skipped)")
        reloaded, warnings = self._reload_lines()
        lines += ["  " + line for line in reloaded + warnings]
        return "\n".join(lines)

    def _repr_html_(self):
        rows = [[h["host"], ", ".join(h["dirs"]), "up to date" if h["same"] else str(h["added"]),
                 "" if h["same"] else str(h["changed"]), "" if h["same"] else str(h["deleted"]),
                 human_bytes(h["bytes_received"])] for h in self.hosts]
        parts = [html_table(html.escape(self.summary()), ["Host", "Directory", "Added", "Changed", "Deleted",
                                                          "Received"], rows, left=(0, 1))]
        files = self.files_sent
        if files:
            title = "Files sent" if len(files) <= _CHANGED_SHOWN else "Largest files sent"
            shown = sorted(files) if len(files) <= _CHANGED_SHOWN else files[:5]
            parts.append(html_table(title, ["File", "Size"], [[p, human_bytes(s)] for p, s, _ in shown], left=(0,)))
        if len(files) > _CHANGED_SHOWN:
            parts.append(html_table("Largest directories sent", ["Directory", "Size"],
                                    [[d, human_bytes(s)] for d, s in self.dirs_sent[:5]], left=(0,)))
        reloaded, warnings = self._reload_lines()
        extra = [f"skipped {path}: {why}" for _, path, why in self.skipped[:10]] + reloaded
        if extra:
            parts.append("<pre>" + html.escape("\n".join(extra)) + "</pre>")
        if warnings:  # styled as a warning, as notebooks show stderr
            parts.append('<pre style="background: var(--jp-rendermime-error-background, #fdd); padding: 2px 4px">'
                         + html.escape("\n".join(warnings)) + "</pre>")
        return "\n".join(parts)


class WorkspaceWatcher:
    """Keeps syncing a workspace on local changes (inotify) until stop(). `reports` holds the
    report of every sync, `errors` the failures (a failed sync is retried on the next change)."""

    def __init__(self, sync_once, locals_, on_report=None, quiet_ms=200):
        self._sync_once = sync_once
        self._locals = list(locals_)
        self._watchers = [_core.TreeWatcher(d) for d in locals_]
        self._stop = threading.Event()
        self._on_report = on_report
        self._quiet_ms = quiet_ms
        self.reports = []
        self.errors = []
        self._thread = threading.Thread(target=self._run, name="xmesh-workspace-watch", daemon=True)
        start_thread(self._thread)

    def _run(self):
        while not self._stop.is_set():
            changed = False
            for w in self._watchers:
                changed = w.wait(100 if not changed else 0, self._quiet_ms) or changed
            if not changed or self._stop.is_set():
                continue
            try:
                report = self._sync_once()
            except Exception as e:  # noqa: BLE001 - shown, and the next change tries again
                self.errors.append(e)
                if self._on_report:
                    self._on_report(None, e)
                continue
            self.reports.append(report)
            if self._on_report:
                self._on_report(report, None)

    @property
    def running(self):
        return self._thread.is_alive()

    def state(self) -> dict:
        """What the panel shows of this watcher: its directories, whether it runs, its syncs and
        errors, and the last of each."""
        last = self.reports[-1] if self.reports else None
        return {"dirs": list(self._locals), "running": self.running, "syncs": len(self.reports),
                "errors": len(self.errors), "last_error": str(self.errors[-1]) if self.errors else "",
                "last_summary": last.summary() if last is not None else ""}

    def stop(self, timeout=5.0):
        self._stop.set()
        self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        state = "watching" if self.running else "stopped"
        return f"<WorkspaceWatcher {state}: {len(self.reports)} syncs, {len(self.errors)} errors>"
