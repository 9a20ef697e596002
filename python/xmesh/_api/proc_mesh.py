"""Host meshes, proc meshes and spawning: the controller's side of allocations."""
import html
import json
import logging
import math
import os
from collections.abc import Iterable
from typing import Any, Callable, Optional, Union

from .. import _core
from .._output import logfiles as _logfiles
from .._base import pickling as _pickling
from .actor import Actor, ActorMesh, ActorMeshRef, check_endpoint_kinds, endpoints_of
from .allocation import Allocation, Lease, ProcRecord, addrs_list
from .._base.context import creator_record, current_cell, note_owned, owning_actor
from .._base.display import html_table
from .future import CallTarget, CoroutineFuture, Done, Future, Readiness
from .._runtime.agents import (REACH_MODES, AgentClient, HostdError, TcpAgentClient, agent, agent_at,
                               set_controller_reach, tcp_locator, use_gateway)
from .named import actors_of, allocations, attach_named
from .._base.pids import running_agent_pid
from .._base.env import env_seconds_from_ms
from .._base.protocol import ErrorKind, error, error_kind, new_actor_id
from .._runtime.process import Kind, get_runtime, interpreter, note_call, proc_environment, shutdown_client
from .._base.shape import MeshTrait, Point, dense_shape
from .._runtime.wait import request
from .._workspace.sync import DEFAULT_MAX_FILE_SIZE, Workspace, seed_named_workspace, sync_workspace


def _rank_env(rank, coords, shape, per_host):
    env = {
        "XMESH_RANK": str(rank),
        "XMESH_COORDS": json.dumps(coords),
        "XMESH_SHAPE": shape.to_json(),
    }
    if "gpus" in per_host:
        env["CUDA_VISIBLE_DEVICES"] = str(coords["gpus"])
        env["LOCAL_RANK"] = str(coords["gpus"])
    return env


# What every spawn hands its actors for get_or_spawn_controller (their controller's registry
# actor): provided by _controllers, which the composition root imports.
_registry_provider: Callable[[], Any] = lambda: None


def set_registry_provider(provider: Callable[[], Any]) -> None:
    global _registry_provider
    _registry_provider = provider


class ProcMesh(Readiness, MeshTrait):
    """A mesh of procs (worker processes). Spawn actors on it with `spawn`. Awaiting it (or its
    .initialized) waits until every proc runs."""

    def __init__(self, alloc: Optional[Allocation], shape: Any, ready: Optional[Future] = None,
                 local_addr: Optional[str] = None, lease: Optional[Lease] = None) -> None:
        self._alloc = alloc
        self._shape = shape
        self._ready = ready
        self._local_addr = local_addr  # set for this_proc(): the process itself
        self._lease = lease            # unnamed allocations: see _Lease

    def _new_with_shape(self, shape):
        return ProcMesh(self._alloc, shape, self._ready, self._local_addr, self._lease)

    # -- what the runtime's other parts read (actor meshes, attach) --------------------------
    @property
    def allocation(self) -> Optional[Allocation]:
        """The allocation under these procs (None for this_proc())."""
        return self._alloc

    @property
    def lease(self) -> Optional[Lease]:
        """What keeps an unnamed allocation alive while handles or calls use it (None: named)."""
        return self._lease

    def proc_addrs(self) -> dict:
        """{rank: node address} of every proc of the allocation."""
        if self._local_addr is not None:
            return {0: self._local_addr}
        return {r: p.addr for r, p in self._require_alloc("proc_addrs").procs.items()}

    # -- actors ----------------------------------------------------------------------------
    def spawn(self, name: str, actor_class: type, *args: Any, **kwargs: Any) -> ActorMesh:
        """Spawns one actor per proc; returns the ActorMesh at once. Awaiting it (or its
        .initialized) resolves after every __init__ ran; __init__ always runs before the
        first message, and a failing __init__ surfaces at the first call."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn() needs a name (a non-empty str) first, got {name!r}")
        if not isinstance(actor_class, type) or not issubclass(actor_class, Actor):
            raise TypeError(f"spawn() needs a subclass of Actor, got {actor_class!r}")
        if self._alloc is not None and self._alloc.stopped:
            raise RuntimeError("cannot spawn: this `ProcMesh` has already been stopped")
        if getattr(actor_class, "_monarch_endpoint_rule", False):
            check_endpoint_kinds(actor_class)
        rt = get_runtime()
        if self._local_addr is not None:
            rt.ensure_actor_host()
        actor_id = new_actor_id(name)
        addrs = self.proc_addrs()
        proc_ranks = list(self._shape.ranks())
        # The actor mesh has this proc mesh's (possibly sliced) dimensions, ranks 0..n-1.
        actor_shape = _core.Shape.dense(list(self._shape.labels), list(self._shape.sizes)) \
            if self._shape.ndim else _core.Shape([], 0, [], [])
        ref = ActorMeshRef(actor_id, name, actor_class.__name__, endpoints_of(actor_class), addrs_list(addrs),
                           actor_shape, proc_ranks)
        # What context() tells each actor: its procs, its own mesh, who spawned it.
        # Pickled apart (frames as bytes) so that a proc unpickles them only when context() asks.
        handles = [bytes(f) for f in _pickling.dumps((self, ActorMesh(ref, actor_shape), creator_record(),
                                                      _registry_provider()))]
        try:
            frames = _pickling.dumps((actor_class, args, kwargs, handles))
        except Exception as e:
            raise TypeError(f"cannot send {actor_class.__name__} and its arguments to the procs: "
                            f"{type(e).__name__}: {e}") from e
        targets = [(addrs[r], actor_id) for r in proc_ranks]
        spawner = owning_actor()  # an actor spawning this mesh owns it (its __supervise__)
        body = _core.SpawnActorBody(name=name, class_name=actor_class.__qualname__, shape=actor_shape.to_json(),
                                    proc_ranks=proc_ranks, owner=spawner.actor_id if spawner is not None else "")
        call = rt.node.call(targets, int(Kind.SpawnActor), "", body.to_dict(), frames, True, current_cell())
        note_call(targets, call, f"{actor_class.__name__}.__init__")
        described = [CallTarget(i, dict(Point(i, actor_shape)), f"{actor_class.__name__} {name!r}", mesh=name)
                     for i in range(len(targets))]
        mesh: ActorMesh[Any] = ActorMesh(ref, actor_shape, None, self, actor_class)

        # Rebuilt only after a successful initialization, so it needs no initialized Future.
        def rebuild() -> ActorMesh[Any]:
            return ActorMesh(ref, actor_shape, None, self, actor_class)

        mesh.ready_when(call, rebuild, described, f"spawn of {name!r}")
        note_owned(mesh)
        return mesh

    def actors(self, name: Optional[str] = None) -> Union[ActorMesh, dict[str, ActorMesh]]:
        """The live actor meshes on these procs, as the procs report them: the one named `name`
        (its latest spawn), or a dict of all of them by name. Works after attaching to a named
        allocation from a new kernel, where the actor classes need not be defined: endpoints
        are called by name."""
        if self._alloc is None:
            raise RuntimeError("actors() needs a proc mesh of spawned procs, not this_proc()")
        return actors_of(self, name)

    # -- output ----------------------------------------------------------------------------
    def logging_option(self, stream_to_client: bool = True, aggregate_window_sec: Optional[float] = 3,
                       level: int = logging.INFO) -> Done:
        """How these procs' output is shown, from now on (Monarch's signature). stream_to_client:
        show it in the cell / on this program's stdout (else only the log files keep it);
        aggregate_window_sec: collapse the lines ranks print within this window (None: off);
        level: the procs' Python logging level. Applies to the whole allocation. Returns an
        awaitable that is already done, so `await mesh.logging_option(...)` works too."""
        alloc = self._require_alloc("logging_option")
        if not isinstance(stream_to_client, bool):
            raise TypeError(f"stream_to_client must be True or False, got {stream_to_client!r}")
        if aggregate_window_sec is not None and (isinstance(aggregate_window_sec, bool) or
                                                 not isinstance(aggregate_window_sec, (int, float)) or
                                                 aggregate_window_sec < 0):
            raise ValueError(f"aggregate_window_sec must be a number of seconds >= 0 or None, got "
                             f"{aggregate_window_sec!r}")
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 255:
            raise ValueError(f"invalid logging level: {level!r} (an int from 0 to 255, such as logging.INFO)")
        rt = get_runtime()
        window_ms = -1 if aggregate_window_sec is None else int(aggregate_window_sec * 1000)
        rt.logs.router.set_options(alloc.id, stream_to_client, window_ms)
        live = alloc.alive_ranks()
        if live and level != alloc.log_level:
            request(rt.node, [alloc.procs[r].addr for r in live], Kind.Configure,
                    _core.ConfigureBody(log_level=level).to_dict(),
                    timeout=10, description="logging_option")
            alloc.log_level = level
        return Done(None)

    def logs(self, rank: Union[None, int, Iterable[int]] = None, stream: Optional[str] = None,
             grep: Optional[str] = None, tail: Optional[int] = None) -> list:
        """The lines these procs wrote, from the host agents' per-rank log files (every line,
        also those the display held back or a restarted kernel never saw), as LogRecords with
        host, pid, rank, coords, actor, stream, time and text, oldest first. rank: one rank (of
        the allocation) or a list; stream: "stdout" or "stderr"; grep: a regular expression;
        tail: only the last N records."""
        self._require_alloc("logs")
        _logfiles.check_stream(stream)  # named even where no rank has a log yet
        ranks = list(self._shape.ranks())
        if rank is not None:
            wanted = [rank] if isinstance(rank, int) else list(rank)
            missing = [r for r in wanted if r not in ranks]
            if missing:
                raise IndexError(f"rank(s) {missing} not in this proc mesh (ranks {ranks})")
            ranks = wanted
        return self.read_logs(ranks, stream, grep, tail)

    def read_logs(self, ranks: list[int], stream: Optional[str], grep: Optional[str], tail: Optional[int],
                  actor: Optional[str] = None) -> list:
        """The LogRecords of these ranks of the allocation (see logs())."""
        alloc = self._require_alloc("logs")
        dirs: dict[str, list[int]] = {}
        for r in ranks:
            a = alloc.procs[r].agent
            if a is not None:
                dirs.setdefault(alloc.logdir(a), []).append(r)
        records = []
        for d, rs in dirs.items():
            records.extend(_logfiles.read_records(d, ranks=rs, stream=stream, grep=grep, actor=actor))
        records.sort(key=lambda rec: (rec.time, rec.rank))
        self._say_log_losses(alloc, ranks)
        return _logfiles.last(records, tail)

    @staticmethod
    def _say_log_losses(alloc: Allocation, ranks: list[int]) -> None:
        """A warning naming what the log files lack (a full disk on a host): the lines returned
        are then not all the procs wrote, and the last of them not the latest."""
        import warnings

        agents = {alloc.procs[r].agent.runtime_dir: alloc.procs[r].agent for r in ranks
                  if alloc.procs[r].agent is not None}
        for a in agents.values():
            if not a.over_tcp and running_agent_pid(a.runtime_dir) is None:
                continue  # no agent runs there (never started one for this)
            try:
                losses = a.log_losses(alloc.id, set(ranks), timeout=2.0)
            except (HostdError, RuntimeError, TimeoutError, ConnectionError):
                continue  # an agent that does not answer: its files are all there is to say
            if losses:
                warnings.warn("; ".join(losses) + " (the lines returned are what the files kept)", RuntimeWarning,
                              stacklevel=4)

    def _require_alloc(self, what: str) -> Allocation:
        if self._alloc is None:
            raise RuntimeError(f"{what}() needs a proc mesh of spawned procs, not this_proc()")
        return self._alloc

    # -- lifecycle -------------------------------------------------------------------------
    def sync_workspace(self, workspace: Union[str, os.PathLike, Workspace] = ".", *, dest: Optional[str] = None,
                       exclude: Iterable[str] = (), auto_reload: bool = False,
                       max_file_size: Optional[int] = DEFAULT_MAX_FILE_SIZE, watch: bool = False,
                       compress: str = "auto", conda: bool = False) -> Any:
        """Pushes a local directory (or a Workspace) to each host of these procs, once per host:
        only what changed travels; `import` in an actor picks up the synced code
        ($XMESH_WORKSPACE is first on each proc's sys.path). `dest`: where under that root
        (default: the root itself). `exclude`: gitignore-style patterns (.gitignore and
        .xmeshignore apply too). Files over `max_file_size` bytes are refused (None: no limit).
        `auto_reload=True`: these procs reload the modules whose files changed. `watch=True`:
        keep syncing on local changes; returns a WorkspaceWatcher (stop() it). Returns a
        SyncReport (what moved, to which hosts, bytes, time)."""
        alloc = self._require_alloc("sync_workspace")
        ranks = list(self._shape.ranks())
        agents = list({alloc.procs[r].agent.runtime_dir: alloc.procs[r].agent for r in ranks}.values())
        space_for = alloc.name or None  # a named allocation's own workspace, else this controller's

        def procs_of():
            alive = set(alloc.alive_ranks())
            return [(r, alloc.procs[r].addr, alloc.procs[r].agent, space_for) for r in ranks if r in alive]

        return sync_workspace([(space_for, agents)], procs_of, workspace, dest=dest, exclude=exclude, auto_reload=auto_reload,
                              max_file_size=max_file_size, watch=watch, compress=compress, conda=conda)

    def stop(self, timeout: Optional[float] = None) -> Done:
        """Stops every proc of the allocation (SIGTERM, then SIGKILL after the grace) and
        returns once they exited, with a done Future (so `procs.stop().get()` and `await
        procs.stop()` work as in Monarch)."""
        if self._alloc is None:
            raise RuntimeError("this_proc() cannot be stopped")
        self._alloc.request_stop(immediately=False)
        grace = env_seconds_from_ms("XMESH_STOP_GRACE_MS", 3000)
        self._alloc.wait_exited(timeout if timeout is not None else grace + 5.0, get_runtime().node)
        return Done(None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._alloc is not None and not self._alloc.stopped:
            self.stop()
        return False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        if self._alloc is not None and not self._alloc.stopped:
            self.stop()
        return False

    @property
    def pids(self) -> list[int]:
        return [self._alloc.procs[r].pid for r in self._shape.ranks()] if self._alloc else [os.getpid()]

    def rank_states(self, whole: bool = False) -> list:
        """(rank, coords, host, pid, state) for each proc of this (possibly sliced) mesh, or of
        the whole allocation."""
        alloc = self._require_alloc("rank_states")
        shape = alloc.shape if whole else self._shape
        rows = []
        for i, g in enumerate(shape.ranks()):
            p = alloc.procs.get(g) or ProcRecord("")
            exited = alloc.exited.get(g)
            if exited is not None:
                state = "stopped" if exited.stopping else "died (" + str(
                    exited.signal or f"exit code {exited.exit_code}") + ")"
            elif alloc.stopped:
                state = "stopping"
            elif p.pid is None:
                state = "starting"
            else:  # a proc of this machine that cannot answer says so: "stopped", "in the kernel"
                st = _core.process_status(p.pid) if p.host in ("", _core.hostname()) else None
                state = (st[2] if st else "") or "running"
            rows.append((g, dict(Point(i, self._shape)), p.host, p.pid, state))
        return rows

    def _summary(self):
        if self._alloc is None:
            return "ProcMesh this_proc"
        states = [r[4] for r in self.rank_states()]
        running = states.count("running")
        state = "stopped" if self._alloc.stopped else f"{running}/{len(states)} running"
        name = f" {self._alloc.name!r}" if self._alloc.name else ""
        return f"ProcMesh{name} {self.sizes} {state}"

    def __repr__(self):
        return f"<{self._summary()}>"

    def _repr_html_(self):
        if self._alloc is None:
            return f"<b>{html.escape(self._summary())}</b>"
        rows = [[g] + [c[d] for d in self._shape.labels] + [host, pid, state]
                for g, c, host, pid, state in self.rank_states()]
        return html_table(html.escape(self._summary()), ["rank"] + list(self._shape.labels) + ["host", "pid", "state"],
                          rows)

    def __reduce__(self):
        if self._alloc is None:
            return (_rebuild_local_proc_mesh, (self._local_addr,))
        procs = {r: p.addr for r, p in self._alloc.procs.items()}
        return (_rebuild_proc_mesh, (self._alloc.id, self._alloc.name, self._alloc.shape, procs, self._shape))


def _rebuild_proc_mesh(alloc_id, name, shape, procs, view):
    alloc = Allocation(alloc_id, name, shape, [])
    alloc.procs = {r: ProcRecord(addr) for r, addr in procs.items()}
    return ProcMesh(alloc, view)


def _rebuild_local_proc_mesh(addr):
    return ProcMesh(None, _core.Shape([], 0, [], []), local_addr=addr)


def checked_env(env):
    """spawn_procs(env=...) as the procs' environment entries: names are non-empty strings
    without '=', values strings or numbers (4 becomes "4")."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise TypeError(f"env must be a dict of environment variables, got {env!r}")
    out = {}
    for k, v in env.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise ValueError(f"env names must be non-empty strings without '=', got {k!r}")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)) or "\0" in str(v):
            raise ValueError(f"env[{k!r}] must be a string or a number, got {v!r}")
        out[k] = str(v)
    return out


def max_procs_per_host():
    """How many procs one spawn may start per host (XMESH_MAX_PROCS_PER_HOST, default 1024): a
    mistyped size must fail at once, not fork until the machine gives out."""
    value = os.environ.get("XMESH_MAX_PROCS_PER_HOST", "1024")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"XMESH_MAX_PROCS_PER_HOST must be an integer, got {value!r}") from None


class HostMesh(MeshTrait):
    """Hosts to spawn procs on. this_host() is one host with no dimension; xmesh.hosts([...])
    has a `hosts` dimension."""

    def __init__(self, runtime_dirs: list[str], shape: Any, env: Optional[dict[str, str]] = None) -> None:
        self._dirs = list(runtime_dirs)
        self._shape = shape
        self._env = dict(env or {})  # what every spawn_procs on these hosts adds (a job's env)

    def with_env(self, env: dict[str, str]) -> "HostMesh":
        """These hosts, whose procs get env (below spawn_procs' own env) in their environment."""
        return HostMesh(self._dirs, self._shape, {**self._env, **checked_env(env)})

    @property
    def runtime_dirs(self) -> list[str]:
        """The host agents' runtime directories, by host rank of the unsliced mesh."""
        return list(self._dirs)

    def _new_with_shape(self, shape):
        return HostMesh(self._dirs, shape, self._env)

    @property
    def initialized(self) -> Future[bool]:
        """Done (True) once every host agent of this mesh is connected; raises what stopped one
        (not reachable, a wrong key, refused). Local agents connect (or start) when first used."""
        tcp = [a for a in (agent_at(self._dirs[h]) for h in self._shape.ranks()) if isinstance(a, TcpAgentClient)]

        async def connect_all() -> bool:
            for a in tcp:
                await a.connect_async()
            return True

        return CoroutineFuture(connect_all, f"connecting {len(tcp)} host agent(s)")

    def spawn_procs(self, per_host: Optional[dict[str, int]] = None, name: Optional[str] = None,
                    bootstrap: Any = None, env: Optional[dict[str, str]] = None) -> ProcMesh:
        """Starts procs on every host: `per_host` gives their dimensions, e.g. {"gpus": 8}.
        Returns the ProcMesh at once; awaiting it (or .initialized) waits until every proc runs."""
        if bootstrap is not None:
            raise NotImplementedError("spawn_procs(bootstrap=...) is not supported by xmesh")
        if per_host is not None and not isinstance(per_host, dict):
            raise TypeError(f"per_host must be a dict of dimension sizes such as {{'gpus': 8}}, got {per_host!r}")
        per_host = dict(per_host or {"gpus": 1})
        if "hosts" in per_host and self._shape.ndim:
            raise ValueError("per_host must not name the 'hosts' dimension of a host mesh")
        if name is not None and (not isinstance(name, str) or not name or "/" in name):
            raise ValueError(f"name must be a non-empty string without '/', got {name!r}")
        local = dense_shape(per_host)
        user_env = {**self._env, **checked_env(env)}  # before anything starts
        limit = max_procs_per_host()
        if local.size > limit:
            raise ValueError(f"spawn_procs({per_host}) asks for {local.size:,} procs per host; at most {limit:,} "
                             "(XMESH_MAX_PROCS_PER_HOST)")
        host_ranks = list(self._shape.ranks())
        sizes = ({"hosts": len(host_ranks)} if self._shape.ndim else {}) | per_host
        shape = dense_shape(sizes)
        if name:
            # A named allocation that is still alive is attached, not spawned again.
            existing = attach_named(self, name, ProcMesh, expected_shape=shape)
            if existing is not None:
                return existing
        rt = get_runtime()
        rt.own_procs()  # an actor's proc spawning procs owns them from now on
        agents = [agent(self._dirs[h]) for h in host_ranks]
        if name:  # its own workspace starts with what this controller synced to these hosts
            seed_named_workspace(agents, name)
        alloc_id = _core.random_hex(4)
        alloc = Allocation(alloc_id, name or "", shape, agents)
        spawner = owning_actor()
        alloc.owner = spawner.actor_id if spawner is not None and not name else ""
        n_local = local.size
        for h, a in enumerate(agents):
            for i in range(n_local):
                rank = h * n_local + i
                # A TCP agent chooses its procs' ports: their addresses come with its reply.
                addr = "" if a.over_tcp else _core.layout_proc_address(a.runtime_dir, alloc_id, rank)
                alloc.procs[rank] = ProcRecord(addr, None, a.host, a)
        # Readiness is a call answered by each proc once it listens; a proc that dies first
        # fails it through supervision.
        ready_call = rt.node.expect([alloc.procs[r].addr or f"pending:{alloc_id}/{r}" for r in range(shape.size)])
        common_env = {k: v for k, v in os.environ.items() if isinstance(v, str)}
        common_env.update(user_env)
        common_env.update(proc_environment())
        common_env["XMESH_READY_CORR"] = str(ready_call.id)
        rt.register_alloc(alloc)
        for h, a in enumerate(agents):
            ranks = []
            for i in range(n_local):
                rank = h * n_local + i
                p = Point(rank, shape)
                coords = dict(p)
                ranks.append(_core.SpawnRank(rank=rank, coords=coords, addr=alloc.procs[rank].addr,
                                             env=_rank_env(rank, coords, shape, per_host)))
            env = dict(common_env, XMESH_CONTROLLER_ADDR=rt.node.tcp_addr) if a.over_tcp else common_env
            argv = [a.python or interpreter(), "-m", "xmesh._proc.worker"]
            body = _core.SpawnProcsBody(alloc=alloc_id, name=name or "", argv=argv, env=env, cwd=os.getcwd(),
                                        ranks=ranks, shape=json.loads(shape.to_json()),
                                        controller_pid=os.getpid())
            try:
                reply = a.spawn_procs(body)
            except Exception as e:
                alloc.request_stop(immediately=True)
                ready_call.fail_all(error(ErrorKind.Supervision, "spawn failed"))
                rt.node.forget_call(ready_call.id)
                if isinstance(e, HostdError) and error_kind(e.body) == ErrorKind.NameTaken and h == 0:
                    # Another controller spawned it meanwhile: attach to theirs.
                    existing = attach_named(self, name, ProcMesh, expected_shape=shape)
                    if existing is not None:
                        return existing
                raise
            for p in reply.procs:
                _started(rt, alloc, a, p, ready_call)
        described = [CallTarget(r, dict(Point(r, shape)), "proc") for r in range(shape.size)]
        lease = None if name else Lease(alloc)
        mesh = ProcMesh(alloc, shape, lease=lease)
        rebuild = lambda: ProcMesh(alloc, shape, lease=lease)  # noqa: E731
        mesh.ready_when(ready_call, rebuild, described, "proc startup")
        if not name:  # a named allocation outlives whoever spawned it
            note_owned(mesh)
        return mesh

    def sync_workspace(self, workspace: Union[str, os.PathLike, Workspace] = ".", *, dest: Optional[str] = None,
                       exclude: Iterable[str] = (), auto_reload: bool = False,
                       max_file_size: Optional[int] = DEFAULT_MAX_FILE_SIZE, watch: bool = False,
                       compress: str = "auto", conda: bool = False) -> Any:
        """Pushes a local directory (or a Workspace) to every host of this mesh, concurrently and
        once per host; with auto_reload=True every proc this program runs on those hosts reloads
        the changed modules. See ProcMesh.sync_workspace for the arguments; returns a SyncReport."""
        dirs = [self._dirs[h] for h in self._shape.ranks()]
        agents = [agent(d) for d in dirs]
        # This controller's workspace on these hosts, and that of every named allocation it owns
        # there (each named allocation has its own, which outlives this controller).
        spaces = [(None, agents)]
        for a in get_runtime().owned_allocs():
            named_agents = list({x.runtime_dir: x for x in a.agents if x.runtime_dir in dirs}.values())
            if a.name and named_agents:
                spaces.append((a.name, named_agents))

        def procs_of():
            rt = get_runtime()
            return [(r, a.procs[r].addr, a.procs[r].agent, a.name or None) for a in rt.owned_allocs()
                    for r in a.alive_ranks() if a.procs[r].agent.runtime_dir in dirs]

        return sync_workspace(spaces, procs_of, workspace, dest=dest, exclude=exclude, auto_reload=auto_reload,
                              max_file_size=max_file_size, watch=watch, compress=compress, conda=conda)

    def __repr__(self):
        return f"<HostMesh {self.sizes or 'this host'}>"


def attach(name: str, hosts: Optional[HostMesh] = None) -> ProcMesh:
    """The live named allocation `name` (spawned with spawn_procs(..., name=name) by this or an
    earlier controller, a kernel before its restart say), as a ProcMesh. This controller becomes
    its owner: another controller still using it gets TakenOverError. `hosts`: the HostMesh it
    was spawned on (default this_host())."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"attach() needs the allocation's name, got {name!r}")
    mesh = attach_named(hosts or this_host(), name, ProcMesh)
    if mesh is None:
        live = [a["name"] for a in allocations([hosts.runtime_dirs[h] for h in hosts.shape.ranks()] if hosts else None)]
        raise KeyError(f"no live allocation named {name!r}; live named allocations: {live or 'none'}")
    return mesh


def this_host() -> HostMesh:
    """The host this program runs on, as a HostMesh of one host."""
    return HostMesh([_core.runtime_dir()], _core.Shape([], 0, [], []))


def _started(rt: Any, alloc: Allocation, agent: AgentClient, proc: Any, ready_call: Any) -> None:
    """A proc its agent reported started: its pid, and its address where the agent chose it
    (supervision, the output barrier and the readiness call find it by that address)."""
    record = alloc.procs[proc.rank]
    record.pid = proc.pid
    if not record.addr:
        record.addr = proc.addr
        rt.node.retarget(ready_call, proc.rank, proc.addr)
        rt.logs.router.add_proc(alloc.id, proc.rank, proc.addr, record.host)
    rt.node.add_dependent(agent.addr, proc.addr)
    rt.node.add_supervision_subscriber(proc.addr)
    rt.node.reach_back_to(proc.addr)  # its first message is to this controller (nothing unless reached back)


def hosts(hosts: list[Union[str, os.PathLike]], key_file: Optional[Union[str, os.PathLike]] = None, *,
          reach: Optional[str] = None, gateway: Optional[str] = None) -> HostMesh:
    """A HostMesh over several host agents, with a `hosts` dimension. Each is a runtime directory
    of an agent on this machine (several can run here) or "host:port" of an agent on another
    machine (`xmesh-hostd --listen tcp://ADDR:PORT --key-file FILE` there), reached over TCP with
    the cluster's key file (key_file, default $XMESH_KEY_FILE). Returns at once: remote agents are
    connected in the background; `await hm.initialized` (or the first use) waits for them.

    reach: how the nodes reach this controller (default $XMESH_CONTROLLER_REACH, else "auto"):
    "inbound" (they connect to its TCP address), "outbound" (only through connections it opens to
    their agents' ports: a notebook behind a NAT, in a pod, or reaching the cluster through a port
    forward), "auto" (inbound, switching to outbound when an agent's answer cannot come back).

    gateway: "host:port" of one host agent this controller reaches when it reaches no other
    (default $XMESH_GATEWAY): a controller outside the cluster behind one forwarded port
    (`ssh -L 7000:node1:7000`, then gateway="localhost:7000"); every connection it opens to the
    hosts goes through that agent's port, and reach defaults to "outbound"."""
    if isinstance(hosts, (str, bytes)) or not hosts:
        raise TypeError("hosts() takes a non-empty list of runtime directories or host:port addresses")
    if reach is not None and reach not in REACH_MODES:
        raise ValueError(f"reach={reach!r}: use one of {', '.join(REACH_MODES)}")
    gateway = gateway if gateway is not None else os.environ.get("XMESH_GATEWAY") or None
    gateway_locator = None
    if gateway is not None:
        gateway_locator = tcp_locator(gateway) if isinstance(gateway, str) else None
        if gateway_locator is None:
            raise ValueError(f"gateway={gateway!r}: give the host:port of a host agent (e.g. 'localhost:7000')")
        if reach is None and not os.environ.get("XMESH_CONTROLLER_REACH"):
            reach = "outbound"  # a controller the cluster is reached from through one port is outside it
    key = os.fspath(key_file) if key_file is not None else os.environ.get("XMESH_KEY_FILE") or None
    locators = []
    for h in hosts:
        text = os.fspath(h)
        if not isinstance(text, str) or not text:
            raise TypeError(f"hosts() takes runtime directories or host:port addresses, got {h!r}")
        tcp = tcp_locator(text)
        locators.append(tcp or os.path.abspath(text))
    if len(set(locators)) != len(locators):
        raise ValueError(f"hosts() names a host twice: {[os.fspath(h) for h in hosts]}")
    remote = [loc for loc in locators if loc.startswith("tcp://")]
    if remote:
        if not key:
            raise ValueError(f"{remote[0][len('tcp://'):]} is a host over TCP: give the cluster's key file "
                             "(hosts([...], key_file=...) or XMESH_KEY_FILE)")
        _core.key_file_public_key(key)  # KeyFileError naming what is wrong with the file
    if gateway_locator is not None and (not remote or not key):
        raise ValueError("a gateway is for hosts over TCP (host:port) with the cluster's key file")
    if reach is not None:
        set_controller_reach(reach)
    if gateway_locator is not None and key:
        use_gateway(gateway_locator, key, remote)
    for loc in remote:
        agent_at(loc, key)  # starts connecting
    return HostMesh(locators, dense_shape({"hosts": len(locators)}))


def this_proc() -> ProcMesh:
    """The process running this code as a one-proc ProcMesh (actors can be spawned on it)."""
    rt = get_runtime()
    return ProcMesh(None, _core.Shape([], 0, [], []), local_addr=rt.node.addr)


def proc_mesh(*, gpus: Optional[int] = None, hosts: int = 1, env: Optional[dict[str, str]] = None,
              setup: Any = None) -> ProcMesh:
    """Monarch's proc_mesh(gpus=N, hosts=M): procs on this host with dimensions hosts x gpus."""
    if setup is not None:
        raise NotImplementedError("proc_mesh(setup=...) is not supported by xmesh")
    return this_host().spawn_procs({"hosts": hosts, "gpus": gpus if gpus is not None else 1}, env=env)


def shutdown_context(host_timeout: Optional[float] = None) -> Done:
    """Monarch's shutdown_context(): shuts this program's controller down (its unnamed
    allocations' procs stop, waiting at most host_timeout seconds, default 5; named allocations
    stay for a later controller). It cannot start again in this process: later xmesh calls
    raise RuntimeError. Returns a done Future (also when there was nothing to shut down)."""
    if host_timeout is not None and (isinstance(host_timeout, bool) or not isinstance(host_timeout, (int, float))
                                     or not math.isfinite(host_timeout) or host_timeout < 0):
        raise ValueError(f"host_timeout must be a finite number of seconds >= 0 or None, got {host_timeout!r}")
    shutdown_client(host_timeout)
    return Done(None)
