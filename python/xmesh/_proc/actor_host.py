"""The proc side of actors: one thread per actor runs its __init__ and then its messages one
at a time; async endpoints run on the proc's asyncio loop (one per proc) while the actor's
thread waits for them, so each actor still handles one message at a time."""
import asyncio
import concurrent.futures
import ctypes
import os
import threading
import time

from .. import _core
from .._debug import proc as _debug_proc
from .._base import pickling as _pickling
from .._output import capture as _proc_output
from .._base.context import ActorContext, current_message, reset_message, set_actor_context, set_current_cell, set_message
from .._base.errors import error_reply
from .._api.actor import EndpointProperty, endpoint_signatures
from .._api.ports import Port
from .._base.protocol import ErrorKind, error, error_kind
from .._runtime.process import Kind, messages, set_actor_host_factory
from .._base.threads import OWN_ACTOR_PREFIX, start_thread, start_user_thread

_HOST = _core.hostname()
_CALL = Kind.Call


class _Loop:
    """The proc's asyncio loop, on its own thread, started on first use."""

    def __init__(self):
        self._loop = None
        self._lock = threading.Lock()
        self.ident = None  # its thread's (an attach traces it)

    def get(self):
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                t = start_user_thread(threading.Thread(target=self._loop.run_forever, name="xmesh-asyncio",
                                                       daemon=True))
                self.ident = t.ident
        return self._loop


def _reply(node, msg, ok, body, frames, mark):
    """Answers a call; mark (the seq of the output marker written after the call's output, if
    any) lets the caller wait until that output has been shown."""
    if mark:
        body = dict(body or {}, m=mark)
    node.reply(msg, ok, body, frames)


class ActorThread(threading.Thread):
    def __init__(self, host, actor_id, inbox):
        super().__init__(name=f"xmesh-actor-{actor_id}", daemon=True)
        self.host = host
        self.node = host.rt.node
        self.actor_id = actor_id
        self.inbox = inbox
        self.instance = None
        self.init_error = None
        self.ctx = None
        self.current = None  # (corr, index) of the message being handled
        self.pause_next = False  # an attach came while idle: stop in the next call
        self.pause_lock = threading.Lock()  # an attach and the start or end of a call, in turn
        self.current_async = False  # the call is an async endpoint's
        self.loop_task = None       # its asyncio task, once running on the loop
        self.current_task = None
        self.current_coro = None  # the async endpoint being awaited (its frames for `where`)
        self.cancelled = set()
        self.endpoints = {}  # method name -> EndpointProperty, looked up once
        self.concurrent = {}  # (corr, index) -> the running task of a concurrent endpoint's call
        self.record = None   # see _spawn
        self.actor_name = "?"

    @property
    def rank(self):
        return self.ctx.rank

    def run(self):
        _core.name_os_thread("xmesh-actor")
        for msg in messages(self.inbox):
            kind = msg.kind
            try:
                if kind == _CALL:
                    self._call(msg)
                elif kind == Kind.SpawnActor:
                    self._spawn(msg)
                elif kind == Kind.StopActor:
                    break
            except _RemoteCancel:
                # A cancellation that landed just after its call finished: nothing to stop.
                pass
            if self.ctx is not None and self.ctx.stop_requested:
                break  # what is queued behind is answered "stopped" (remove_actor)
        for task in list(self.concurrent.values()):
            task.cancel()  # a stopped actor's concurrent calls end too (their callers are told)
        self.node.remove_actor(self.actor_id)
        self.host.forget(self.actor_id)
        _core.label_thread(threading.get_ident(), "")

    def _spawn(self, msg):
        self.actor_name = "?"
        out = _proc_output.begin(msg.ctx, self.actor_name)
        set_current_cell(msg.ctx or "")
        try:
            body = msg.spawn_actor()
            self.actor_name = body.name
            shape = _core.Shape.from_json(body.shape)
            proc_rank = int(os.environ.get("XMESH_RANK", "0"))
            ranks = body.proc_ranks or [proc_rank]
            rank = ranks.index(proc_rank) if proc_rank in ranks else 0
            self.ctx = ActorContext(self.actor_id, f"{body.class_name or '?'} {body.name!r}", rank, shape,
                                    proc_rank, self.actor_name)
            set_actor_context(self.ctx)
            _core.label_thread(threading.get_ident(), _debug_proc.thread_label(self.ctx))
            cls, args, kwargs, handles = _pickling.loads(msg.frames)
            self.ctx.class_name = f"{cls.__module__}.{cls.__qualname__}"
            self.ctx.handles = handles
            # What a controller that attaches later needs to call this actor without its class.
            sigs = endpoint_signatures(cls)
            self.record = _core.ActorRecord(actor_id=self.actor_id, name=body.name, class_name=cls.__name__,
                                            endpoints=list(sigs), shape=body.shape, proc_ranks=ranks,
                                            spawned=time.time(), signatures=[s for s, _ in sigs.values()],
                                            summaries=[d for _, d in sigs.values()])
            self.instance = cls(*args, **kwargs)
            ok, reply_body, frames = True, {"pid": os.getpid(), "host": _HOST}, None
        except BaseException as e:
            self.init_error = e
            ok, (reply_body, frames) = False, error_reply(e, self.ctx, "__init__")
        _reply(self.node, msg, ok, reply_body, frames, _proc_output.end(out))

    def _call(self, msg):
        method = msg.method
        broadcast = msg.corr == 0  # a broadcast carries no correlation id
        key = (msg.corr, msg.index)
        if key in self.cancelled:
            self.cancelled.discard(key)
            if not broadcast:
                self.node.reply(msg, False, error(ErrorKind.Cancelled, "cancelled by the caller"))
            return
        try:
            body = msg.call_body() if msg.has_body else None
        except ValueError as e:  # a malformed body (a peer of another version, or hostile)
            self.node.reply(msg, False, error(ErrorKind.Actor, f"the call to {method}() could not be read: {e}"))
            return
        cell = msg.ctx or ""
        out = _proc_output.begin(cell, self.actor_name)
        set_current_cell(cell)
        ep = self._endpoint(method, body)  # once per call: the port, the run and the answer use it
        port = self._answer_port(msg, body, ep)
        token = set_message(msg, body)
        try:
            ok, rbody, frames, exiting = self._run_call(msg, method, cell, port, body, ep)
        finally:
            reset_message(token)
        _debug_proc.call_finished()
        mark = _proc_output.end(out)
        if port is not None:
            self._answer_through(port, ok, rbody, frames, method, cell, ep)
        elif not broadcast:
            _reply(self.node, msg, ok, rbody, frames, mark)
        elif not ok and error_kind(rbody) == ErrorKind.Actor:
            self._fault_to(msg.sender_addr, rbody, method, cell, "broadcast to")
        if exiting is not None:
            raise exiting

    def _answer_port(self, msg, body, ep):
        """The Port this message is answered through, or None (the usual reply): the port a
        send(..., port=) named, or for an explicit-port endpoint one answering this call."""
        if body is not None and body.reply_addr is not None:
            rank = body.rank if body.rank is not None else msg.index
            return Port(body.reply_addr, body.reply_corr, rank)
        if ep is not None and (ep.explicit_response_port or ep.concurrent):
            return Port(msg.sender_addr, msg.corr, msg.index, once=True, call_msg=msg if msg.gathered else None)
        return None

    def _endpoint(self, method, body=None):
        """The EndpointProperty of method (looked up once), or None when there is none; for a
        plain method called through as_endpoint(), one made for it."""
        if body is not None and body.as_endpoint:
            return self._plain_method(method, bool(body.explicit_port))
        ep = self.endpoints.get(method)
        if ep is None and self.instance is not None:
            ep = getattr(type(self.instance), method, None)
            if not isinstance(ep, EndpointProperty):
                return None
            self.endpoints[method] = ep
        return ep

    def _plain_method(self, method, explicit_port):
        key = (method, explicit_port)
        ep = self.endpoints.get(key)
        if ep is None and self.instance is not None:
            fn = getattr(type(self.instance), method, None)
            if isinstance(fn, EndpointProperty):
                fn = fn.fn
            if method.startswith("__") or not callable(fn):
                return None
            ep = self.endpoints[key] = EndpointProperty(fn, explicit_response_port=explicit_port)
        return ep

    def _answer_through(self, port, ok, body, frames, method, cell, ep):
        """An answer through a port: the value or error of a plain endpoint; for an
        explicit-port endpoint only an error, and only if it had not answered (it answers
        itself). An answer nobody can take goes to the fault path like a broadcast's."""
        explicit = ep is not None and ep.explicit_response_port
        if ok and ep is not None and (explicit or ep.concurrent):
            return  # it answers itself (a concurrent endpoint's task, when it ends)
        self._answer_or_fault(port, ok, body, frames, method, cell, explicit and port.used)

    def _answer_or_fault(self, port, ok, body, frames, method, cell, answered):
        """Sends an answer through port; an error nobody can take (a broadcast's, one after the
        endpoint answered already, one the port cannot carry) goes to the fault path."""
        addr, corr = port.reply_target
        if ok or (corr and not answered):
            try:
                port.answer(ok, body, frames)
                return
            except Exception as e:
                how = f"the answer through a port ({e}) of"
        else:
            how = "broadcast to" if not corr else "after answering through its port,"
        if not ok and error_kind(body) == ErrorKind.Actor:
            self._fault_to(addr, body, method, cell, how)

    def _fault_to(self, addr, body, method, cell, how):
        """An endpoint's error that nobody waits for: the controller's fault hook gets it."""
        raised = _core.ErrorBody.from_dict(body)
        text = (f"{self.ctx.name if self.ctx else 'actor'} rank {self.ctx.rank if self.ctx else '?'} "
                f"on {_HOST}: {how} {method}() raised, nobody waits for it:\n{raised.traceback}")
        fault = dict(raised.to_dict(), text=text, cell=cell, info={"mesh": self.actor_name})
        try:
            self.node.send(addr, int(Kind.Fault), _core.ErrorBody.from_dict(fault).to_dict())
        except Exception:
            pass

    def _run_call(self, msg, method, cell, port, body, ep):
        """Runs one endpoint call: (ok, body, frames) of its reply, and the SystemExit it raised
        (re-raised once the reply is sent)."""
        try:
            if self.init_error is not None:
                raise RuntimeError(f"the actor's __init__ failed, so it cannot run {method}(): "
                                   f"{type(self.init_error).__name__}: {self.init_error}") from self.init_error
            if ep is None:
                what = "method" if body is not None and body.as_endpoint else "endpoint"
                raise AttributeError(f"{type(self.instance).__name__} has no {what} {method!r}")
            args, kwargs = _pickling.loads(msg.frames)
            if ep.explicit_response_port:
                args = (port,) + tuple(args)
            if ep.concurrent:
                self._start_concurrent(ep, method, args, kwargs, port, cell, (msg.corr, msg.index))
                return True, None, None, None
            self._call_starts((msg.corr, msg.index), ep.is_async)
            if ep.is_async:
                result = self._run_async(ep.fn(self.instance, *args, **kwargs), cell)
            else:
                result = ep.fn(self.instance, *args, **kwargs)
            self._call_ends()
            if msg.corr == 0 and port is None:
                return True, None, None, None
            return True, None, _pickled_result(result, method), None
        except BaseException as e:
            self._call_ends()
            if isinstance(e, (asyncio.CancelledError, _RemoteCancel)):
                return False, error(ErrorKind.Cancelled, "cancelled by the caller"), None, None
            _debug_proc.post_mortem(e)
            body, frames = error_reply(e, self.ctx, method)
            return False, body, frames, e if isinstance(e, SystemExit) else None

    # -- attach (issue 18): who stops where is decided under pause_lock, against a call that
    # starts or ends at the same moment.
    def _call_starts(self, key, is_async):
        with self.pause_lock:
            self.current, self.current_async = key, is_async
            if self.pause_next and not is_async:  # an attach while it was idle: stop in this call
                self.pause_next = False
                _debug_proc.pause_thread(self.ident)

    def _call_ends(self):
        with self.pause_lock:
            self.current, self.current_async = None, False
            # A pause that did not reach the user's code (the call ended in native code): it
            # stops the next call instead, and nothing traces the thread in between.
            if _debug_proc.unpause_thread(self.ident):
                self.pause_next = True

    def _task_starts(self):
        """On the loop's thread, as the async endpoint's task starts."""
        with self.pause_lock:
            self.loop_task = asyncio.current_task()
            if self.pause_next:
                self.pause_next = False
                _debug_proc.pause_task(self.loop_task, threading.get_ident())

    def _task_ends(self):
        with self.pause_lock:
            if _debug_proc.unpause_task(self.loop_task):
                self.pause_next = True
            self.loop_task = None

    def request_pause(self, idle_too):
        """An attach: stops this actor where it runs, or at the start of its next call. What the
        controller is told: "pausing" (its thread traced), "pausing-async" (its task, when it
        next runs), "idle" (its next call), "idle-now" (idle, and idle_too was False)."""
        with self.pause_lock:
            if self.current is None:
                self.pause_next = idle_too
                return "idle" if idle_too else "idle-now"
            if not self.current_async:
                _debug_proc.pause_thread(self.ident)
                return "pausing"
            if self.loop_task is None:  # its task has not started on the loop yet
                self.pause_next = True
            else:
                _debug_proc.pause_task(self.loop_task, self.host.loop.ident)
            return "pausing-async"

    def withdraw_pause(self):
        with self.pause_lock:
            self.pause_next = False
            _debug_proc.unpause_thread(self.ident)
            if self.loop_task is not None:
                _debug_proc.unpause_task(self.loop_task)

    def _run_async(self, coro, cell):
        loop = self.host.loop.get()
        ctx = self.ctx
        handling = current_message()

        async def runner():
            set_actor_context(ctx)
            set_current_cell(cell)
            if handling is not None:
                set_message(*handling)
            self._task_starts()
            try:
                return await coro
            except BaseException as e:
                if not isinstance(e, asyncio.CancelledError):
                    _debug_proc.post_mortem(e)  # on the loop's thread, where the frames are
                raise
            finally:
                self._task_ends()
                _debug_proc.call_finished()

        fut = asyncio.run_coroutine_threadsafe(runner(), loop)
        self.current_task, self.current_coro = fut, coro
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            if fut.cancelled():  # cancel() cancelled it: the caller's cancellation, not the endpoint's error
                raise _RemoteCancel() from None
            raise
        finally:
            self.current_task = self.current_coro = None

    def _start_concurrent(self, ep, method, args, kwargs, port, cell, key):
        """A concurrent endpoint's call: a task on the proc's loop, started now (tasks start in
        the order their messages came); the actor thread goes on to its next message."""
        loop = self.host.loop.get()
        ctx, handling, instance = self.ctx, current_message(), self.instance

        async def runner():
            set_actor_context(ctx)
            set_current_cell(cell)
            if handling is not None:
                set_message(*handling)
            try:
                value = await ep.fn(instance, *args, **kwargs)
                if not ep.explicit_response_port:
                    port.answer(True, None, _pickled_result(value, method))
            except BaseException as e:
                if isinstance(e, asyncio.CancelledError):
                    body, frames = error(ErrorKind.Cancelled, "cancelled by the caller"), None
                else:
                    body, frames = error_reply(e, ctx, method)
                self._answer_or_fault(port, False, body, frames, method, cell, port.used)
            finally:
                self.concurrent.pop(key, None)

        self.concurrent[key] = asyncio.run_coroutine_threadsafe(runner(), loop)

    def cancel(self, corr, index):
        key = (corr, index)
        task = self.concurrent.get(key)
        if task is not None:
            task.cancel()  # cancels the task on the loop
            return
        if self.current == key:
            if self.current_task is not None:
                self.current_task.cancel()
            else:
                # A sync endpoint: raise an asynchronous exception in the actor's thread.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.ident), ctypes.py_object(_RemoteCancel))
        else:
            self.cancelled.add(key)


def _pickled_result(value, method):
    try:
        return _pickling.dumps(value)
    except Exception as e:
        raise TypeError(f"the result of {method}() cannot be sent back: {type(e).__name__}: {e}") from e


class _RemoteCancel(BaseException):
    """Raised inside a sync endpoint whose caller cancelled the call."""


class ActorHost:
    """Starts an ActorThread for each actor spawned on this process."""

    def __init__(self, rt):
        self.rt = rt
        self.loop = _Loop()
        self.actors = {}
        self._lock = threading.Lock()

    def start(self):
        _debug_proc.set_actor_threads(self.threads_of)
        self._serve_control(self.rt.control)
        start_thread(threading.Thread(target=self._events, name="xmesh-actor-host", daemon=True))

    def _serve_control(self, table):
        """The control messages of a process that hosts actors (a proc, or a controller with
        this_proc() actors): every such process answers them the same way."""
        node = self.rt.node
        table.on(Kind.Cancel, self._cancel)
        # The controller's flush barrier (end of a cell): everything written so far, then a
        # marker (seq 0 where no host agent reads this process's output: nothing to wait for).
        table.on(Kind.FlushOutput,
                 lambda msg: node.reply(msg, True, _core.FlushOutputReply(m=_proc_output.flush_marker()).to_dict()))
        table.on(Kind.ProcInfo, self._proc_info)
        table.on(Kind.Reload, self._reload)
        table.on(Kind.Configure, self._configure)
        table.on(Kind.DebugCommand, lambda msg: _debug_proc.deliver(msg.debug_command()))

    def _proc_info(self, msg):
        # async_stacks: the debugger's `where` asks what async endpoints await.
        stacks = self.async_stacks() if msg.proc_info().async_stacks else None
        info = _core.ProcInfoReply(pid=os.getpid(), actors=self.describe(), async_stacks=stacks)
        self.rt.node.reply(msg, True, info.to_dict())

    def _reload(self, msg):
        """A sync changed these files: reload their modules here, between two messages of no
        particular actor (the GIL makes each reload whole)."""
        from .._workspace import reload as _reload

        result = _reload.reload_files(msg.reload().files)
        self.forget_endpoint_cache()
        self.rt.node.reply(msg, True, result.to_dict())

    def _cancel(self, msg):
        body = msg.cancel()
        self.cancel(msg.actor, body.corr, body.index)

    def _configure(self, msg):
        body = msg.configure()
        if body.log_level is not None:
            _proc_output.set_log_level(body.log_level)
        if body.post_mortem is not None:
            _debug_proc.set_post_mortem(body.post_mortem)
        if msg.corr:
            self.rt.node.reply(msg, True, {})

    def _events(self):
        node = self.rt.node
        for msg in messages(node.actor_events):
            inbox = node.actor_inbox(msg.actor)
            if inbox is None:
                continue
            t = ActorThread(self, msg.actor, inbox)
            with self._lock:
                self.actors[msg.actor] = t
            # xmesh's own actors (the controller's registry) run no user code (_base/threads.py).
            (start_thread if msg.actor.startswith(OWN_ACTOR_PREFIX) else start_user_thread)(t)

    def forget_endpoint_cache(self):
        """After a reload updated classes in place: endpoints are looked up again."""
        with self._lock:
            threads = list(self.actors.values())
        for t in threads:
            t.endpoints = {}

    def describe(self):
        """Records of the live actors on this proc (see ActorThread._spawn)."""
        with self._lock:
            threads = list(self.actors.values())
        return [t.record for t in threads if t.record is not None]

    def async_stacks(self):
        """{"mesh\trank": frames} of the actors awaiting an async endpoint: the chain of
        suspended coroutines, outermost first (a thread dump shows only the loop's select)."""
        with self._lock:
            threads = list(self.actors.values())
        out = {}
        for t in threads:
            coro = t.current_coro
            if coro is not None and t.ctx is not None:
                out[_debug_proc.thread_label(t.ctx)] = coroutine_frames(coro)
        return out

    def forget(self, actor_id):
        with self._lock:
            self.actors.pop(actor_id, None)

    def threads_of(self, mesh_name, ranks):
        """What an attach pauses: the actor threads of that mesh's ranks on this proc."""
        with self._lock:
            threads = list(self.actors.values())
        return [t for t in threads if t.ctx is not None and t.ctx.mesh_name == mesh_name and t.ctx.rank in ranks]

    def cancel(self, actor_id, corr, index):
        with self._lock:
            t = self.actors.get(actor_id)
        if t is not None:
            t.cancel(corr, index)


def coroutine_frames(coro):
    """(file, line, function) of coro and of each coroutine it awaits, outermost first."""
    frames = []
    while coro is not None and len(frames) < 200:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return frames


set_actor_host_factory(ActorHost)  # a controller hosts actors too, for this_proc()
