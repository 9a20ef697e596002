"""Actors, endpoints and actor meshes: the user-facing calling API (Monarch's adverbs)."""
import ast
import functools
import html
import inspect
import itertools
import logging
import random
from typing import Any, Callable, Generic, Optional, TypeVar

from .._output import logfiles as _logfiles
from .._base import pickling as _pickling
from .._runtime import wait as _wait
from .._base.context import current_cell
from .._base.display import html_table
from .._base.env import env_float
from .._base.errors import ActorError, SupervisionError
from .._base.protocol import ErrorKind, error_kind, read_error
from .future import (CallTarget, CoroutineFuture, Done, Future, LocalFuture, Readiness, all_ok_then, check_timeout,
                     show_output_of, track_sent)
from .._runtime.process import Kind, get_runtime, note_call
from .._base.shape import MeshTrait, Point
from .._base.value_mesh import ValueMesh


class Actor:
    """Base class of actors. Subclasses define endpoints with @endpoint (sync or async)."""

    def __supervise__(self, failure: Any) -> Any:
        """Override to handle failures of the actors this actor spawned (an actor mesh it
        owns): return True and the failure is handled; return anything false (or do not
        override) and it goes on up: this actor fails in turn and its own owner is told (for
        meshes the program spawned: the unhandled fault hook). `failure` is a MeshFailure. Runs
        between messages (an actor with async endpoints: on its loop, at once); may be async."""
        return None

    def __cleanup__(self, exc: Optional[Exception]) -> Any:
        """Override to release what the actor holds when it ends: stopped (exc is None) or
        failed (exc's text is the failure's report). Runs after its concurrent calls were
        cancelled; may be async."""
        return None

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class, at DEBUG (Monarch's Actor.logger)."""
        lgr = logging.getLogger(type(self).__name__)
        lgr.setLevel(logging.DEBUG)
        return lgr

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # mesh.<endpoint> must reach the endpoint: one named like an attribute of the mesh
        # itself (size, slice, stop...) would be shadowed, so it is refused here, by name.
        taken = {n for n in dir(ActorMesh) if not n.startswith("_")}
        for name, value in vars(cls).items():
            if isinstance(value, EndpointProperty) and name in taken:
                raise TypeError(f"{cls.__qualname__}.{name}: an endpoint cannot be named {name!r}, which is an "
                                f"attribute of every actor mesh (mesh.{name}); rename the endpoint")


class EndpointProperty:
    """What @endpoint puts on the class: the function, and how to call it."""

    def __init__(self, fn, propagate=None, explicit_response_port=False, concurrent=False):
        self.fn = fn
        self.name = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.propagate = propagate
        # The endpoint's first argument (after self) is a Port for its answer: it sends what it
        # answers (later, even), its return value is not the answer.
        self.explicit_response_port = explicit_response_port
        # An async endpoint run as a task of the actor's loop: the actor takes its next message
        # at once (Monarch's concurrent_endpoint); it answers through a port when it finishes.
        self.concurrent = concurrent
        functools.update_wrapper(self, fn)

    def __set_name__(self, owner, name):
        self.name = name

    @property
    def _explicit_response_port(self) -> bool:
        """Monarch's attribute: the endpoint answers through a port (a concurrent endpoint does,
        its task answering when it ends)."""
        return self.explicit_response_port or self.concurrent

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        # Inside the actor, self.method(...) is a plain local call.
        return self.fn.__get__(instance, owner)


def endpoint(fn: Optional[Callable] = None, *, propagate: Any = None,
             explicit_response_port: bool = False) -> Any:
    """Marks an actor method as callable through meshes: @endpoint or @endpoint(...)."""
    if fn is None:
        return lambda f: EndpointProperty(f, propagate, explicit_response_port)
    return EndpointProperty(fn, propagate, explicit_response_port)


def concurrent_endpoint(method: Optional[Callable] = None, *, propagate: Any = None,
                        explicit_response_port: bool = False, instrument: bool = True) -> Any:
    """Monarch's @concurrent_endpoint: an `async def` endpoint whose calls run as tasks on the
    actor's asyncio loop, so the actor takes its next message as soon as one starts (several
    of its calls run at once, each started in arrival order). Each answers its caller when it
    finishes; with explicit_response_port=True it gets a Port first and answers through it.
    `instrument` is accepted for Monarch's signature (xmesh has no tracing spans)."""
    if method is None:
        return lambda f: concurrent_endpoint(f, propagate=propagate, explicit_response_port=explicit_response_port,
                                             instrument=instrument)
    if isinstance(method, EndpointProperty):
        raise ValueError("concurrent_endpoint does not wrap @endpoint; pass endpoint options to @concurrent_endpoint")
    if not inspect.iscoroutinefunction(method):
        raise ValueError(f"concurrent_endpoint can only wrap async endpoints (async def), not {method!r}")
    return EndpointProperty(method, propagate, explicit_response_port, concurrent=True)


def endpoints_of(cls):
    names = []
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty) and name not in names:
                names.append(name)
    return names


def endpoints_in_file(path: str) -> "list[tuple[str, int, int]]":
    """[(Class.endpoint, first line, last line)] of the endpoints of live Actor classes whose
    code is in path (a notebook cell's file)."""
    found = []
    seen = set()
    stack = list(Actor.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        for name, value in vars(cls).items():
            code = getattr(getattr(value, "fn", None), "__code__", None)
            if isinstance(value, EndpointProperty) and code is not None and code.co_filename == path:
                lines = [ln for _, _, ln in code.co_lines() if ln is not None] or [code.co_firstlineno]
                found.append((f"{cls.__name__}.{name}", code.co_firstlineno, max(lines)))
    return found


def overrides_hook(cls: type, name: str) -> bool:
    """Whether the class defines its own __supervise__ / __cleanup__ (Actor's are documentation)."""
    return getattr(cls, name, None) not in (None, getattr(Actor, name))


def endpoints_are_async(cls: type) -> bool:
    """Whether all of the class's endpoints are async (and it has some): such an actor runs its
    __init__, __supervise__ and __cleanup__ on the loop its endpoints run on."""
    kinds = {getattr(cls, name).is_async for name in endpoints_of(cls)}
    return kinds == {True}


def check_endpoint_kinds(cls: type) -> None:
    """Monarch's rule, for classes of monarch.actor.Actor: all endpoints sync or all async
    (xmesh's own Actor may mix them: its thread waits while an async endpoint runs)."""
    names = endpoints_of(cls)
    sync = [n for n in names if not getattr(cls, n).is_async]
    async_ = [n for n in names if getattr(cls, n).is_async]
    if sync and async_:
        raise ValueError(f"{cls.__qualname__} mixes both async and sync endpoints (sync: {sync}, async: {async_}): "
                         "Monarch refuses that (a sync endpoint that waits would stall the actor's event loop); "
                         "make them all async or all sync, or subclass xmesh.Actor, which allows mixing")


def endpoint_signatures(cls: type) -> "dict[str, tuple[str, str]]":
    """{endpoint: (its signature without self, the first line of its docstring)}."""
    out = {}
    for name in endpoints_of(cls):
        ep = getattr(cls, name)
        out[name] = (_signature_text(ep), _summary(ep.fn))
    return out


def _signature_text(ep: "EndpointProperty") -> str:
    """The parameters a caller passes: without self, and without the Port an explicit-port
    endpoint is given."""
    try:
        sig = inspect.signature(ep.fn)
    except (TypeError, ValueError):
        return "(...)"
    params = list(sig.parameters.values())[2 if ep.explicit_response_port else 1:]
    return str(sig.replace(parameters=params))


class _Source(str):
    """A default value or an annotation known only as source text: shown as written."""

    def __repr__(self) -> str:
        return str(self)


def _signature_from_text(text: str) -> inspect.Signature:
    """The Signature written as text ("(x: float, n: int = 2) -> str"): an endpoint of a mesh
    found without its class knows only that. Names it cannot evaluate stay text; text that does
    not parse gives (...)."""
    try:
        fn = ast.parse(f"def f{text}: pass").body[0]
    except SyntaxError:
        fn = ast.parse("def f(*args, **kwargs): pass").body[0]
    assert isinstance(fn, ast.FunctionDef)
    a, P = fn.args, inspect.Parameter

    def param(arg: ast.arg, kind: Any, default: Optional[ast.expr] = None) -> inspect.Parameter:
        return P(arg.arg, kind, default=P.empty if default is None else _Source(ast.unparse(default)),
                 annotation=_Source(ast.unparse(arg.annotation)) if arg.annotation else P.empty)

    positional = a.posonlyargs + a.args
    defaults: list = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [param(arg, P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD, d)
              for i, (arg, d) in enumerate(zip(positional, defaults))]
    params += [param(a.vararg, P.VAR_POSITIONAL)] if a.vararg else []
    params += [param(arg, P.KEYWORD_ONLY, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults)]
    params += [param(a.kwarg, P.VAR_KEYWORD)] if a.kwarg else []
    returns = _Source(ast.unparse(fn.returns)) if fn.returns else inspect.Signature.empty
    return inspect.Signature(params, return_annotation=returns)


def _summary(fn: Any) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


def display_wait_s() -> float:
    """XMESH_DISPLAY_WAIT_S, read when used (a forked proc's environment is set after imports)."""
    return env_float("XMESH_DISPLAY_WAIT_S", 10.0)


class ActorMeshRef:
    """What an ActorMesh points at: one actor per proc of an allocation (picklable)."""

    def __init__(self, actor_id, name, class_name, endpoints, addrs, base_shape, proc_ranks, signatures=None):
        self.actor_id = actor_id        # unique id of this spawn on each proc
        self.name = name                # the name the user gave
        self.class_name = class_name
        self.endpoints = list(endpoints)
        self.addrs = list(addrs)        # by global proc rank
        self.base_shape = base_shape    # shape of the spawn (over global proc ranks)
        self.proc_ranks = proc_ranks    # global proc rank of each element, row-major over base_shape
        self.signatures = signatures or {}  # endpoint -> (signature, summary), when the class is not here


A = TypeVar("A")


class ActorMesh(Readiness, MeshTrait, Generic[A]):
    """A mesh of actors, one per proc of the ProcMesh it was spawned on. Endpoints are
    attributes: `mesh.method.call(...)`. Awaiting the mesh waits until every __init__ ran."""

    def __init__(self, ref: "ActorMeshRef", shape: Any, initialized: Optional[Future] = None,
                 proc_mesh: Any = None, cls: Optional[type] = None) -> None:
        self._ref = ref
        self._shape = shape
        self._ready = initialized
        self._proc_mesh = proc_mesh
        self._cls = cls
        self._choose_counter = itertools.count(random.randrange(1 << 16))

    def _new_with_shape(self, shape):
        return ActorMesh(self._ref, shape, self._ready, self._proc_mesh, self._cls)

    def __dir__(self):
        """Endpoints complete like methods (`actors.<Tab>`), also without the class."""
        ref = self.__dict__.get("_ref")
        return sorted(set(super().__dir__()) | set(ref.endpoints if ref is not None else ()))

    def _endpoint_info(self, name: str) -> "tuple[str, str] | None":
        """(signature without self, docstring summary) of an endpoint, when known."""
        cls = self.__dict__.get("_cls")
        if cls is not None and isinstance(getattr(cls, name, None), EndpointProperty):
            ep = getattr(cls, name)
            return _signature_text(ep), _summary(ep.fn)
        return self._ref.signatures.get(name)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        ref = self.__dict__.get("_ref")
        if ref is None:
            raise AttributeError(name)
        if name in ref.endpoints:
            return Endpoint(self, name)
        cls = self.__dict__.get("_cls")
        if cls is not None and callable(getattr(cls, name, None)):
            return NotAnEndpoint(self, name)
        if cls is not None and hasattr(cls, name):
            raise AttributeError(f"{ref.class_name}.{name} is not an endpoint: decorate it with @endpoint to call it "
                                 "through the mesh")
        raise AttributeError(f"{ref.class_name} has no endpoint {name!r}; its endpoints are {tuple(ref.endpoints)}")

    def _check_usable(self, method: str) -> None:
        pm = self._proc_mesh
        if pm is not None and pm.allocation is not None and pm.allocation.stopped:
            endpoint = f"{self._ref.name}.{method}()"
            raise SupervisionError(f"Endpoint call {endpoint} failed, actor mesh is stopped due to proc mesh shutdown "
                                   f"(the ProcMesh of {self._ref.name!r} was stopped)", endpoint=endpoint,
                                   actor=f"{self._ref.class_name} {self._ref.name!r}")

    def _targets(self):
        """(addr, actor_id) per element of this (possibly sliced) mesh, with descriptions.
        Computed once per mesh handle: handles are immutable."""
        cached = self.__dict__.get("_targets_cache")
        if cached is None:
            cached = self._targets_cache = self._compute_targets()
        return cached

    def _point_body(self) -> Optional[dict]:
        """The Call body that tells each target its point in this mesh (Monarch's message
        rank), or None when that is the actor's own (the whole mesh as spawned: the fast path)."""
        if "_point_cache" not in self.__dict__:
            shape, base = self._shape, self._ref.base_shape
            same = (list(shape.labels) == list(base.labels) and list(shape.sizes) == list(base.sizes)
                    and list(shape.ranks()) == list(base.ranks()))
            self._point_cache = None if same else {"labels": list(shape.labels), "sizes": list(shape.sizes)}
        return self._point_cache

    def _compute_targets(self):
        ref = self._ref
        base_pos = {g: i for i, g in enumerate(ref.base_shape.ranks())}
        targets, described = [], []
        for g in self._shape.ranks():
            # Errors name the actor by its rank and coordinates in the whole actor mesh.
            base = base_pos[g]
            proc_rank = ref.proc_ranks[base]
            targets.append((ref.addrs[proc_rank], ref.actor_id))
            p = Point(base, ref.base_shape)
            described.append(CallTarget(base, dict(p), f"{ref.class_name} {ref.name!r}", ref.actor_id, ref.name))
        return targets, described

    def logging_option(self, stream_to_client: bool = True, aggregate_window_sec: Optional[float] = 3,
                       level: int = logging.INFO) -> Done:
        """How the output of the procs under this actor mesh is shown (see ProcMesh.logging_option)."""
        return self._owning_proc_mesh("logging_option").logging_option(stream_to_client, aggregate_window_sec, level)

    def logs(self, rank: Optional[int] = None, stream: Optional[str] = None, grep: Optional[str] = None,
             tail: Optional[int] = None) -> list:
        """The output lines these actors printed, as LogRecords (see ProcMesh.logs); ranks are
        numbered as in the actor mesh that was spawned (as errors name them)."""
        pm = self._owning_proc_mesh("logs")
        ref = self._ref
        base_pos = {g: i for i, g in enumerate(ref.base_shape.ranks())}
        mine = {ref.proc_ranks[base_pos[g]]: base_pos[g] for g in self._shape.ranks()}
        if rank is not None:
            wanted = {p for p, a in mine.items() if a == rank}
            if not wanted:
                raise IndexError(f"rank {rank} is not in this actor mesh (ranks {sorted(mine.values())})")
            mine = {p: a for p, a in mine.items() if p in wanted}
        records = pm.read_logs(sorted(mine), stream, grep, None, actor=ref.name)
        return _logfiles.last([r._replace(rank=mine[r.rank]) for r in records], tail)

    def _lease(self):
        """The lease of the unnamed allocation under these actors (None when named or local):
        a call in flight holds it, so its procs outlive the call's temporaries."""
        pm = self._proc_mesh
        return pm.lease if pm is not None else None

    def _owning_proc_mesh(self, what):
        pm = self._proc_mesh
        if pm is None or pm.allocation is None:
            raise RuntimeError(f"{what}() needs an actor mesh spawned on procs (not this_proc() or one passed to "
                               "an actor)")
        return pm

    def stop(self) -> Future:
        """Stops these actors (their procs stay): each ends after its current message (its
        concurrent calls cancelled, its __cleanup__ run, the meshes it spawned stopped) and
        later calls raise SupervisionError. The Future resolves once every one has ended
        (`.get(timeout)` or `await`, as Monarch's)."""
        rt = get_runtime()
        targets, described = self._targets()
        call = rt.node.call(targets, int(Kind.StopActor), "", {}, None, True)
        return Future(call, all_ok_then(None), described, f"{self._ref.name}.stop()", self._lease())

    def _summary(self):
        return f"ActorMesh {self._ref.name!r} ({self._ref.class_name}) {self.sizes}"

    def __repr__(self):
        return f"<{self._summary()}>"

    def _repr_html_(self):
        """Per actor: coordinates, the proc hosting it and its state."""
        ref = self._ref
        proc_states = {}
        pm = self._proc_mesh
        if pm is not None and pm.allocation is not None:
            proc_states = {g: (host, pid, state) for g, _, host, pid, state in pm.rank_states(whole=True)}
        init_state = "ready"
        if self._ready is not None:
            # Shown right after spawn (a cell's last line), the mesh is shown once its actors are
            # up (or after display_wait_s()): a saved notebook keeps the state it showed.
            try:
                self._ready.get(timeout=display_wait_s())
            except TimeoutError:
                init_state = f"starting (shown after {display_wait_s():g} s; display it again to refresh)"
            except Exception:
                init_state = "__init__ failed"
        base_pos = {g: i for i, g in enumerate(ref.base_shape.ranks())}
        rows = []
        for g in self._shape.ranks():
            base = base_pos[g]
            proc_rank = ref.proc_ranks[base]
            host, pid, state = proc_states.get(proc_rank, ("", None, "running"))
            p = Point(base, ref.base_shape)
            rows.append([base] + [p[d] for d in ref.base_shape.labels] +
                        [host, pid, init_state if state == "running" else f"proc {state}"])
        note = "endpoints: " + ", ".join(ref.endpoints)
        return html_table(html.escape(self._summary()), ["rank"] + list(ref.base_shape.labels) +
                          ["host", "pid", "state"], rows, note)

    def __reduce__(self):
        return (_rebuild_actor_mesh, (self._ref, self._shape))


def actor_ranks_at(mesh: "ActorMesh", addr: str) -> "tuple[str, str, list[int]]":
    """(name, class name, ranks) of an actor mesh's actors that run on the proc at addr (a
    function, not a method: an ActorMesh's attributes are its endpoints)."""
    ref = mesh._ref
    ranks = [rank for rank, proc_rank in enumerate(ref.proc_ranks) if ref.addrs[proc_rank] == addr]
    return ref.name, ref.class_name, ranks


def _rebuild_actor_mesh(ref, shape):
    return ActorMesh(ref, shape)


def _convert_values(shape):
    def convert(results, fut):
        values = [None] * shape.size
        errors = []
        for index in range(shape.size):
            if index not in results:  # still running when another rank's proc died
                continue
            ok, body, frames = results[index]
            if ok:
                try:
                    values[index] = _pickling.loads(frames)
                except Exception as e:
                    errors.append(ActorError(f"the result of rank {index} could not be unpickled: {e}", rank=index))
            else:
                errors.append(fut.error_for(index, body, frames))
        if errors:
            first = errors[0]
            notes = []
            if len(errors) > 1:
                notes.append(f"{len(errors)} of {shape.size} ranks failed; this is the first")
                first.failures = len(errors)
            deaths = [str(e) for e in errors[1:] if isinstance(e, SupervisionError)] + fut.dead_unanswered()
            if deaths:  # the runtime does not repeat what an error says
                more = f" and {len(deaths) - 4} more" if len(deaths) > 4 else ""
                notes.append("also " + "; ".join(deaths[:4]) + more)
            if notes:
                first.args = (f"{first.args[0]}\n(" + "; ".join(notes) + ")",)
            raise first
        return ValueMesh(shape, values)

    return convert


def _convert_one(results, fut):
    (index, (ok, body, frames)), = results.items()
    if not ok:
        raise fut.error_for(index, body, frames)
    return _pickling.loads(frames)


def _pack_args(method, args, kwargs):
    try:
        return _pickling.dumps((args, kwargs))
    except Exception as e:
        raise TypeError(f"the arguments of {method}() cannot be sent: {type(e).__name__}: {e}") from e


_CALL = int(Kind.Call)
_CASTS = ("broadcast", "send")  # the adverbs whose caller gets no value back
_NO_ARGS = _pickling.dumps(((), {}))


class NotAnEndpoint:
    """`mesh.method` for a method of the actor's class that is not an endpoint (Monarch's):
    using it says so; `as_endpoint(mesh.method)` calls it as one."""

    def __init__(self, mesh: ActorMesh, name: str) -> None:
        self.mesh = mesh
        self.name = name

    def _refusal(self) -> str:
        return (f"{self.mesh._ref.class_name}.{self.name} is not an endpoint: decorate it with @endpoint, or call it "
                f"as one with as_endpoint(mesh.{self.name}).call(...)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(self._refusal())

    def __getattr__(self, name: str) -> Any:
        if name in ("call", "call_one", "choose", "stream", "broadcast"):
            raise AttributeError(self._refusal())
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<NotAnEndpoint {self.mesh._ref.class_name}.{self.name}>"


def as_endpoint(not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False) -> "Endpoint":
    """Calls a plain method of a spawned actor as an endpoint (Monarch's):
    `as_endpoint(mesh.method).call(...)`; explicit_response_port=True passes it a Port first."""
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError(f"as_endpoint() expects a method of a spawned actor (mesh.method), got {not_an_endpoint!r}")
    extra = {"as_endpoint": True, "explicit_port": True} if explicit_response_port else {"as_endpoint": True}
    return Endpoint(not_an_endpoint.mesh, not_an_endpoint.name, extra)


class Endpoint:
    """One endpoint of an actor mesh, with Monarch's adverbs."""

    def __init__(self, mesh: ActorMesh, name: str, extra_body: Optional[dict] = None) -> None:
        self._mesh = mesh
        self._name = name
        self._extra_body = extra_body  # what every call of it says besides its point (as_endpoint)

    def _send(self, targets, described, args, kwargs, adverb, expect_reply=True, body=None):
        self._mesh._check_usable(self._name)
        if self._extra_body:
            body = dict(body or {}, **self._extra_body)
        frames = _NO_ARGS if not args and not kwargs else _pack_args(self._name, args, kwargs)
        # The causal context (the cell) travels with the call: the procs' output is shown there.
        cell = current_cell()
        if cell:  # a notebook's: a death nobody waits for is said in the cell that last used the mesh
            pm = self._mesh._proc_mesh
            if pm is not None and pm.allocation is not None:
                pm.allocation.last_cell = cell
        call = get_runtime().node.call(targets, _CALL, self._name, body, frames, expect_reply, cell)
        note_call(targets, call if expect_reply else None, self._name if adverb not in _CASTS else f"{self._name} ({adverb})")
        return call, described

    def call(self, *args: Any, **kwargs: Any) -> Future:
        """Calls every actor; a Future of the ValueMesh of results."""
        targets, described = self._mesh._targets()
        call, described = self._send(targets, described, args, kwargs, "call", body=self._mesh._point_body())
        return Future(call, _convert_values(self._mesh._shape), described, f"{self._name}.call()",
                      self._mesh._lease(), self._name)

    def call_one(self, *args: Any, **kwargs: Any) -> Future:
        """Calls the single actor of this mesh; a Future of its result."""
        if self._mesh._shape.size != 1:
            raise ValueError(f"call_one() needs a mesh of exactly one actor; this one has {self._mesh._shape.size} "
                             f"{self._mesh.sizes}: slice it first, or use call() or choose()")
        targets, described = self._mesh._targets()
        call, described = self._send(targets, described, args, kwargs, "call_one", body=self._mesh._point_body())
        return Future(call, _convert_one, described, f"{self._name}.call_one()", self._mesh._lease(), self._name)

    def choose(self, *args: Any, **kwargs: Any) -> Future:
        """Calls one actor of the mesh (rotating through them); a Future of its result."""
        targets, described, body = self._choose_one("choose()")
        call, described = self._send(targets, described, args, kwargs, "choose", body=body)
        return Future(call, _convert_one, described, f"{self._name}.choose()", self._mesh._lease(), self._name)

    def stream(self, *args: Any, **kwargs: Any) -> "_Stream":
        """Calls every actor; iterated, a Future per reply, each resolving to the next reply to
        arrive (Monarch's); `async for` over it gives the values in arrival order."""
        targets, described = self._mesh._targets()
        call, described = self._send(targets, described, args, kwargs, "stream", body=self._mesh._point_body())
        return _Stream(call, described, self._name, self._mesh._lease())

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Sends to every actor without waiting; an exception goes to the fault hook (printed by
        the controller), and the actor lives on. A message that could not be sent (the proc
        stopped reading past the send timeout, say) raises here: nothing vanishes silently."""
        targets, described = self._mesh._targets()
        self._cast(targets, described, args, kwargs, self._mesh._point_body(), "broadcast")

    def _choose_one(self, what: str) -> "tuple[list, list, dict]":
        """([target], [its description], the Call body) of the next actor in rotation: the
        message's point is the chosen actor's in the mesh it was chosen from."""
        targets, described = self._mesh._targets()
        if not targets:
            raise ValueError(f"{what} on an empty mesh")
        i = next(self._mesh._choose_counter) % len(targets)
        return [targets[i]], [described[i]], dict(self._mesh._point_body() or {}, rank=i)

    def _cast(self, targets: list, described: list, args: tuple, kwargs: dict, body: Optional[dict],
              adverb: str) -> None:
        """Sends without a reply to the caller (broadcast, send()); a target the message could
        not reach raises here. Unless the answers go to a port, each actor says when it ended
        (no value): the panel shows its rank busy meanwhile, and a later call's wait says that it
        queues behind it."""
        expect_end = not (body and body.get("reply_addr"))
        if expect_end:
            body = dict(body or {}, ended_only=True)
        call, described = self._send(targets, described, args, kwargs, adverb, expect_reply=expect_end, body=body)
        if expect_end:
            track_sent(call, described, f"{self._name}.{adverb}()")
        unsent = [(index, read_error(body).text) for index, _ok, body, _ in call.take()
                  if error_kind(body) == ErrorKind.Send]
        if unsent:
            index, text = unsent[0]
            target = described[index]
            more = f" (and {len(unsent) - 1} more)" if len(unsent) > 1 else ""
            raise RuntimeError(f"{self._name}.{adverb}() did not reach {target.actor} rank {target.rank}{more}: {text}")

    def _send_to_port(self, args: tuple, kwargs: dict, port: Any, selection: str) -> None:  # see send()
        """Monarch's send(): every actor ("all") or one ("choose"), answering to port (or,
        without one, like broadcast)."""
        if selection == "all":
            targets, described = self._mesh._targets()
            body = self._mesh._point_body()
        elif selection == "choose":
            targets, described, body = self._choose_one("send(selection='choose')")
        else:
            raise ValueError(f"send(): selection is 'all' or 'choose', got {selection!r}")
        if port is not None:
            addr, corr = port.reply_target
            body = dict(body or {}, reply_addr=addr, reply_corr=corr)
        self._cast(targets, described, args, kwargs, body, "send")

    @property
    def __signature__(self) -> inspect.Signature:
        """The endpoint's own parameters (what its adverbs take): what inspect.signature() and
        IPython's inspection (Shift+Tab) show."""
        info = self._mesh._endpoint_info(self._name)
        return _signature_from_text(info[0] if info else "(*args, **kwargs)")

    @property
    def __call__(self) -> Callable[..., Any]:
        """Calling the endpoint itself is refused, naming the adverbs; its signature is the
        endpoint's, so inspection shows no `(*args, **kwargs)` call form beside it."""
        name = self._name

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise TypeError(f"call the endpoint through an adverb: {name}.call(...), .call_one(...), "
                            ".choose(...), .stream(...) or .broadcast(...)")

        refuse.__signature__ = self.__signature__  # type: ignore[attr-defined]
        return refuse

    def __repr__(self):
        info = self._mesh._endpoint_info(self._name)
        return f"<Endpoint {self._mesh._ref.class_name}.{self._name}{info[0] if info else ''} on {self._mesh.sizes}>"

    def getdoc(self) -> str:
        """What IPython's inspection (Shift+Tab, `mesh.method?`) shows: the signature, the
        docstring's summary and how to call it."""
        info = self._mesh._endpoint_info(self._name)
        head = f"{self._mesh._ref.class_name}.{self._name}{info[0] if info else '(...)'}"
        summary = f"\n\n{info[1]}" if info and info[1] else ""
        return (f"{head}{summary}\n\nAn endpoint of {self._mesh.sizes}: .call(...) (every actor, a ValueMesh), "
                ".call_one(...) (a mesh of one), .choose(...) (any one), .stream(...) (results as they come), "
                ".broadcast(...) (no reply).")


class _Stream:
    """What stream() returns: iterated, a Future per reply (Monarch's: each resolves to the next
    reply to arrive, taken when first waited on); `async for` gives the values themselves, in
    arrival order."""

    def __init__(self, call, described, name, keepalive=None):
        self._fut: Future = Future(call, lambda r, f: None, described, f"{name}.stream()", keepalive, name)
        self._call = call
        self._pending = []
        self._taken = 0

    def _outcome_of(self, index, ok, body, frames):
        """(True, value) or (False, the error) of one reply; the stream ends with its last."""
        self._taken += 1
        if self._taken == len(self._call):
            self._finished()
        show_output_of(get_runtime(), self._call, [(index, body)])  # what it printed first is shown first
        if ok:
            return True, _pickling.loads(frames)
        return False, self._fut.error_for(index, body, frames)

    def next_outcome(self, timeout: Optional[float]) -> "tuple[bool, Any]":
        """The next reply to arrive (waiting at most timeout seconds: TimeoutError)."""
        description = self._fut.description
        while not self._pending:
            try:
                if not _wait.wait_call(self._call, timeout, description, any_result=True):
                    raise TimeoutError(f"{description}: no further reply within {timeout} s; "
                                       f"{self._fut.describe_pending()}")
            except KeyboardInterrupt:
                raise self._fut.interrupted_error() from None
            self._pending.extend(self._call.take())
        return self._outcome_of(*self._pending.pop(0))

    async def next_outcome_async(self) -> "tuple[bool, Any]":
        while not self._pending:
            self._pending.extend(self._call.take())
            if not self._pending:
                try:
                    await _wait.wait_call_async(self._call, self._fut.description, any_result=True)
                except KeyboardInterrupt:
                    raise self._fut.interrupted_error() from None
        return self._outcome_of(*self._pending.pop(0))

    def __len__(self) -> int:
        return len(self._call)

    def __iter__(self):
        for _ in range(len(self._call)):
            yield StreamReply(self)

    def _finished(self):
        get_runtime().node.forget_call(self._call.id)
        self._fut.release()  # the allocation may stop once its last handle goes

    def __aiter__(self):
        return self._agen()

    async def _agen(self):
        while self._taken < len(self._call):
            ok, value = await self.next_outcome_async()
            if not ok:
                raise value
            yield value


class StreamReply(LocalFuture):
    """One reply of a stream(), as Monarch's stream yields them: `.get(timeout)` or `await`
    gives the next reply to arrive (its value, or raises its error), taken once."""

    def __init__(self, stream: _Stream) -> None:
        self._stream = stream
        self._description = stream._fut.description

    def get(self, timeout: Optional[float] = None) -> Any:
        check_timeout(timeout)
        if self._outcome is None:
            self._outcome = self._stream.next_outcome(timeout)
        return self._result()

    result = get

    def __await__(self):
        if self._outcome is None:
            self._outcome = yield from self._stream.next_outcome_async().__await__()
        return self._result()

    def cancel(self) -> bool:
        return False

    def describe_pending(self) -> str:
        return "received" if self._outcome is not None else "waiting for the next reply"

    def __repr__(self) -> str:
        return f"<xmesh.Future {self._description} reply: {self.describe_pending()}>"


def send(endpoint: "Endpoint", args: tuple = (), kwargs: Optional[dict] = None, port: Any = None,
         selection: str = "all") -> None:
    """Monarch's send(): calls endpoint (`mesh.method`) on every actor of its mesh
    (selection="all") or on one ("choose") without waiting. Each answer goes to port (a Port
    from Channel.open(); a ranked receiver gets (message rank, value)); without a port it is a
    broadcast, whose errors go to the fault hook."""
    if not isinstance(endpoint, Endpoint):
        raise TypeError(f"send() needs an endpoint of an actor mesh (mesh.method), got {endpoint!r}")
    if not isinstance(args, tuple):
        raise TypeError(f"send()'s args is a tuple of positional arguments, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"send()'s kwargs is a dict of keyword arguments, got {type(kwargs).__name__}")
    if port is not None and not hasattr(port, "reply_target"):
        raise TypeError(f"send()'s port is a Port (from Channel.open()), got {port!r}")
    endpoint._send_to_port(args, kwargs or {}, port, selection)


class Accumulator:
    """Folds the replies of one broadcast of an endpoint into one value, in the order they
    arrive (Monarch's Accumulator): `Accumulator(mesh.count, 0, lambda acc, r: acc + r)`, then
    `.accumulate(*args).get()` or `await`. The call goes out at accumulate(); the fold runs
    when the returned Future is first observed."""

    def __init__(self, endpoint: "Endpoint", identity: Any, combine: Callable[[Any, Any], Any]) -> None:
        if not isinstance(endpoint, Endpoint) and not callable(getattr(endpoint, "stream", None)):
            raise TypeError(f"Accumulator needs an endpoint of an actor mesh (mesh.method), or an object whose "
                            f".stream(*args, **kwargs) gives the replies, got {endpoint!r}")
        if not callable(combine):
            raise TypeError(f"Accumulator's combine must be callable (accumulated, reply) -> accumulated, "
                            f"got {combine!r}")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future:
        replies = self._endpoint.stream(*args, **kwargs)
        identity, combine = self._identity, self._combine

        async def fold() -> Any:
            value = identity
            if hasattr(replies, "__aiter__"):  # an endpoint's stream: the values as they arrive
                async for reply in replies:
                    value = combine(value, reply)
            else:  # another object's stream (as Monarch's Accumulator takes): Futures, in order
                for reply in replies:
                    value = combine(value, await reply)
            return value

        return CoroutineFuture(fold, f"{getattr(self._endpoint, '_name', 'stream')}.accumulate()")
