"""The proc side of actors: one thread per actor runs its __init__ and then its messages one
at a time; async endpoints run on the actor's own asyncio loop (a thread of its own, started on
first use) while the actor's thread waits for them, so each actor still handles one message at
a time, and one actor blocking its loop stalls no other. An actor whose
endpoints are all async runs __init__, __supervise__ and __cleanup__ on that loop too (as in
Monarch: thread-local state set in __init__ is there in its endpoints). Its life and death
(lifecycle.py): an error nobody can receive, a BaseException or an unhandled failure of the
actors it owns ends it; its owner is told, and later messages are answered with its report."""
import asyncio
import collections
import concurrent.futures
import ctypes
import inspect
import os
import threading
import time

from .. import _core
from .._debug import proc as _debug_proc
from .._base import pickling as _pickling
from .._output import capture as _proc_output
from .._base.env import env_float
from .._base.context import (ActorContext, current_message, reset_message, set_actor_context, set_current_cell,
                             set_message)
from .._base.errors import error_reply, failure_report
from .._api.actor import ActorMesh, EndpointProperty, endpoint_signatures, endpoints_are_async
from . import lifecycle
from .owners import Owners
from .._api.ports import Port
from .._base.protocol import ErrorKind, error
from .._runtime.process import Kind, failure_of_fault, messages, set_actor_host_factory
from .._runtime.wait import request
from .._base.threads import OWN_ACTOR_PREFIX, start_thread, start_user_thread

_HOST = _core.hostname()
_CALL = Kind.Call
_OWNED_STOP_S = 10.0  # how long an ending actor waits for the meshes it spawned to stop
_OWNER_ACK_S = 3.0  # how long a failed actor waits for its owner to take its failure (then says it here)


class _Loop:
    """An actor's asyncio loop, on a thread of its own, started on first use (an actor that
    blocks its loop, in __init__ or an async endpoint, stalls no other actor of the proc)."""

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

    def stop(self):
        """Ends the loop's thread (after what is scheduled now) once the actor has ended."""
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)


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
        self.loop = _Loop()  # its async endpoints, concurrent calls, and hooks of an all-async actor
        self.is_async = False  # its endpoints are all async: __init__ and its hooks run on the loop
        self.owner_addr = ""   # who gets its failures: the spawning process, and there the actor
        self.owner_actor = ""  # that spawned it ("" for the program itself: the fault hook)
        self.failure = None    # the report, once it failed (it takes no further message)
        self.tombstone = None  # what its later messages are answered with, once it failed or stopped
        self.death_lock = threading.Lock()
        self.pending_supervision = collections.deque()  # failures of its children, for a sync actor
        self.in_flight = None  # the spawn or plain call it runs now (a stop that cannot wait answers it)
        self.stop_msg = None   # the StopActor it took, answered once it ended (or by a stop that cannot wait)
        self.ending = False    # in _end: cleaning up, stopping what it spawned

    @property
    def rank(self):
        return self.ctx.rank

    def run(self):
        _core.name_os_thread("xmesh-actor")
        how = "the proc stopped"
        stop = None  # the StopActor message, answered once the actor has ended
        for msg in messages(self.inbox):
            kind = msg.kind
            try:
                if kind == _CALL:
                    self._call(msg)
                elif kind == Kind.SpawnActor:
                    self._spawn(msg)
                elif kind == Kind.StopActor:
                    how, stop = "its actor mesh was stopped (ActorMesh.stop())", msg
                    self.stop_msg = msg
                    break
            except _RemoteCancel:
                # A cancellation that landed just after its call finished: nothing to stop.
                pass
            if self.ctx is not None and self.ctx.abort_reason is not None and self.failure is None:
                self._die(failure_report(lifecycle.describe_actor(self.ctx), lifecycle.aborted(self.ctx.abort_reason)))
            if self.failure is not None:
                break
            if self.ctx is not None and self.ctx.stop_requested:
                how = "it stopped itself (context().actor_instance.stop())"
                break  # what is queued behind is answered "stopped" (remove_actor)
        self._end(how)
        if stop is not None and stop.corr:
            self.node.reply(stop, True, {})

    def _end(self, how):
        """The actor ends (stopped, failed, or its proc stops): its concurrent calls are
        cancelled and have ended, __cleanup__ runs, and later messages get its tombstone."""
        self.ending = True
        self._cancel_concurrent(wait_s=5.0)
        self._cleanup()
        self._stop_owned()
        tombstone = self.tombstone or lifecycle.stopped(self.ctx, how, self.actor_name)
        self.node.remove_actor(self.actor_id, tombstone)
        self.host.owners.note_ended(self, tombstone)
        self.loop.stop()
        self.host.forget(self.actor_id)
        # Nothing of its class stays referenced: at the proc's exit the module that defined it
        # must be finalized (its globals' __del__ run), which a live function of it prevents.
        self.instance = None
        self.endpoints = {}
        _core.label_thread(threading.get_ident(), "")

    def _stop_owned(self):
        """The meshes this actor spawned end with it (actor meshes, then proc meshes)."""
        if self.ctx is None:
            return
        owned = [m for m in (r() for r in self.ctx.owned) if m is not None]
        self.ctx.owned = []
        deadline = time.monotonic() + _OWNED_STOP_S
        for mesh in sorted(owned, key=lambda m: not isinstance(m, ActorMesh)):
            try:
                mesh.stop().get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception as e:  # one that cannot stop (its proc gone) does not keep the others
                self.host.rt.diag(f"{lifecycle.describe_actor(self.ctx)} ended; stopping {mesh!r}: "
                                  f"{type(e).__name__}: {e}")

    def _cancel_concurrent(self, wait_s):
        """Cancels the running concurrent calls (their callers are told) and waits, at most
        wait_s, until their tasks have ended (a task's finally runs before __cleanup__)."""
        tasks = list(self.concurrent.values())
        for task in tasks:
            task.cancel()
        if tasks:
            concurrent.futures.wait(tasks, timeout=wait_s)

    def _cleanup(self):
        """The class's __cleanup__(exc) (Monarch's), on the loop for an async actor; exc is the
        failure (an Exception with its report) or None. What it raises is said, not raised."""
        cleanup = lifecycle.user_hook(self.instance, "__cleanup__") if self.instance is not None else None
        if cleanup is None:
            return
        exc = Exception(self.failure) if self.failure is not None else None
        try:
            result = cleanup(exc)
            if inspect.isawaitable(result):
                self._run_async(result, "")
        except BaseException as e:  # noqa: B902 - any error of user code here is only reported
            self.host.rt.diag(f"{lifecycle.describe_actor(self.ctx)}: __cleanup__ raised {type(e).__name__}: {e}")

    def _spawn(self, msg):
        self.actor_name = "?"
        self.in_flight = msg
        out = _proc_output.begin(msg.ctx, self.actor_name)
        set_current_cell(msg.ctx or "")
        try:
            body = msg.spawn_actor()
            self.actor_name = body.name
            self.owner_addr, self.owner_actor = msg.sender_addr, body.owner
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
            self.is_async = endpoints_are_async(cls)
            if self.is_async:  # __init__ on the loop its endpoints run on

                async def construct():
                    return cls(*args, **kwargs)

                self.instance = self._run_async(construct(), msg.ctx or "")
            else:
                self.instance = cls(*args, **kwargs)
            ok, reply_body, frames = True, {"pid": os.getpid(), "host": _HOST}, None
        except BaseException as e:
            # The actor fails: the spawn's caller, its owner and its later callers are told why
            # (unless it was ended meanwhile: its proc stopping cancels a running async __init__).
            if self.tombstone is None:
                self._die(failure_report(lifecycle.describe_actor(self.ctx), lifecycle.init_failed(e)),
                          msg.ctx or "")
            ok, reply_body, frames = False, self.tombstone, None
        self.in_flight = None
        _reply(self.node, msg, ok, reply_body, frames, _proc_output.end(out))

    def _call(self, msg):
        method = msg.method
        broadcast = msg.corr == 0  # a broadcast carries no correlation id
        if broadcast and method == lifecycle.SUPERVISE:  # a wake-up (supervision_event): one may take several
            self._supervise_pending(msg.ctx or "")
            return
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
        # A broadcast whose caller learns when it ended (the panel's busy ranks, the calls queued
        # behind it): run as a broadcast, then answered with an empty ok.
        ended_only = bool(body is not None and body.ended_only)
        broadcast = broadcast or ended_only
        cell = msg.ctx or ""
        out = _proc_output.begin(cell, self.actor_name)
        set_current_cell(cell)
        ep = self._endpoint(method, body)  # once per call: the port, the run and the answer use it
        port = self._answer_port(msg, body, ep, ended_only)
        token = set_message(msg, body)
        self.in_flight = msg if port is None and not broadcast else None
        try:
            ok, rbody, frames, raised = self._run_call(msg, method, cell, port, body, ep, broadcast)
        finally:
            reset_message(token)
            self.in_flight = None
        _debug_proc.call_finished()
        mark = _proc_output.end(out)
        if raised is not None:
            self._maybe_die(raised, method, self._unanswerable(broadcast, port, ep), cell)
        if not ok and self.tombstone is not None:
            rbody, frames = self.tombstone, None  # the call ended the actor (or met its end): say so
        if port is not None:
            self._answer_through(port, ok, rbody, frames, method, cell, ep)
        elif not broadcast:
            _reply(self.node, msg, ok, rbody, frames, mark)
        if ended_only:  # a concurrent endpoint's: when it started (the actor takes its next message)
            _reply(self.node, msg, True, None, None, mark)
        if isinstance(raised, SystemExit):
            raise raised

    @staticmethod
    def _unanswerable(broadcast, port, ep):
        """Why nobody can receive an error this call raises ("" when its caller can)."""
        if ep is not None and ep.explicit_response_port:
            return "it was to answer through its port"
        if broadcast and port is None:
            return "a broadcast, with no reply port"
        return ""

    def _maybe_die(self, exc, method, unanswerable, cell):
        reason = lifecycle.fatal_reason(exc, f"{self.actor_name}.{method}", unanswerable)
        if reason is not None:
            self._die(failure_report(lifecycle.describe_actor(self.ctx), reason), cell)

    # -- failure and supervision (lifecycle.py has the rules and the words) -----------------
    def _die(self, report, cell=""):
        """The actor failed (from its thread, or from the loop): it takes no further message
        (each is answered with report, as the call that ended it is), its running calls are
        cancelled, and its owner is told. Its thread then ends it (_end)."""
        with self.death_lock:
            if self.failure is not None:
                return
            self.failure = report
            self.tombstone = lifecycle.tombstone(self.ctx, report, self.actor_name)
        for task in list(self.concurrent.values()):
            task.cancel()
        if self.current_task is not None and threading.get_ident() != self.ident:
            self.current_task.cancel()  # an async endpoint running while __supervise__ failed it
        self._tell_owner(report, cell)
        self.node.remove_actor(self.actor_id, self.tombstone)  # wakes its thread if it waits for messages

    def _tell_owner(self, report, cell):
        """The owner gets the failure: the actor that spawned this one (its __supervise__), or
        the program that did (its unhandled fault hook), as a Fault message."""
        if not self.owner_addr:
            return
        ctx = self.ctx
        info = {"mesh": self.actor_name, "report": True, "owner": self.owner_actor}
        body = _core.ErrorBody(kind=str(ErrorKind.Supervision), text=report, cell=cell, host=_HOST,
                               actor=ctx.name if ctx else None, rank=ctx.rank if ctx else None, info=info)
        # Asked, not only sent: the owner has taken the failure in hand (its __supervise__
        # queued) before this actor's caller hears of it, so what the caller does next comes after.
        answers = request(self.node, [self.owner_addr], Kind.Fault, body.to_dict(), timeout=_OWNER_ACK_S,
                          description=f"telling the owner of {self.actor_name!r} of its failure")
        if 0 not in answers:  # its owner is gone (or did not answer): the failure is said here
            self.host.rt.diag(f"{report}\n(its owner at {self.owner_addr} could not be told)")

    def end_now(self, how):
        """From another thread: this actor takes no further message (they are answered "stopped:
        how"); its running async call is cancelled; its thread then ends it (_end)."""
        with self.death_lock:
            if self.tombstone is None:
                self.tombstone = lifecycle.stopped(self.ctx, how, self.actor_name)
        self.node.remove_actor(self.actor_id, self.tombstone)
        task = self.current_task
        if task is not None:
            task.cancel()

    def stop_overdue(self, grace_s):
        """A stop waited grace_s for the message this actor runs: it ends from outside (its later
        messages, the stop included, are answered at once; the caller of the running call hears
        it was stopped); its thread finishes the message and then ends it (__cleanup__)."""
        running, stop = self.in_flight, self.stop_msg
        if self.ending:
            busy = "ending (its __cleanup__, stopping the meshes it spawned)"
        elif running is not None:
            busy = "__init__" if running.kind == Kind.SpawnActor else f"{running.method}()"
        else:
            busy = "a message"
        self.end_now(f"its actor mesh was stopped (ActorMesh.stop()) while it was busy in {busy} for more than "
                     f"{grace_s:g} s; it ends when that returns")
        # Answered now; the thread's own answers later are dropped (a call takes one per target).
        if running is not None and running.corr:
            self.node.reply(running, False, self.tombstone)
        if stop is not None and stop.corr:
            self.node.reply(stop, True, {})

    def supervision_event(self, failure):
        """A failure of an actor this one owns (from the control thread). An async actor runs
        __supervise__ on its loop at once (beside a running endpoint, as Monarch interleaves); a
        sync one after its current message, on its thread (a wake-up message keeps the order)."""
        if self.failure is not None:
            return
        if self.is_async:
            asyncio.run_coroutine_threadsafe(self._supervise_async(failure), self.loop.get())
            return
        self.pending_supervision.append(failure)
        self.node.call([(self.node.addr, self.actor_id)], _CALL, lifecycle.SUPERVISE, None, None, False, "")

    def _supervise_pending(self, cell):
        while self.pending_supervision and self.failure is None:
            failure = self.pending_supervision.popleft()
            try:
                handled = self._call_supervise(failure)
                if inspect.isawaitable(handled):
                    handled = self._run_async(handled, cell)
            except Exception as e:
                self._die(lifecycle.supervise_raised(self.ctx, e, failure.report()), cell)
                return
            if not handled:
                self._die(lifecycle.unhandled_child_failure(self.ctx, failure.report()), cell)

    async def _supervise_async(self, failure):
        set_actor_context(self.ctx)
        try:
            handled = self._call_supervise(failure)
            if inspect.isawaitable(handled):
                handled = await handled
        except Exception as e:
            self._die(lifecycle.supervise_raised(self.ctx, e, failure.report()), failure.cell)
            return
        if not handled:
            self._die(lifecycle.unhandled_child_failure(self.ctx, failure.report()), failure.cell)

    def _call_supervise(self, failure):
        """The class's __supervise__(failure): True handles it; without one it is not handled
        (the failure goes on up: this actor fails, and its own owner is told)."""
        supervise = lifecycle.user_hook(self.instance, "__supervise__") if self.instance is not None else None
        return supervise(failure) if supervise is not None else False

    def _answer_port(self, msg, body, ep, ended_only=False):
        """The Port this message is answered through, or None (the usual reply): the port a
        send(..., port=) named, or for an explicit-port endpoint one answering this call (one
        that answers nobody for a broadcast: its caller hears only that it ended)."""
        if body is not None and body.reply_addr is not None:
            rank = body.rank if body.rank is not None else msg.index
            return Port(body.reply_addr, body.reply_corr, rank)
        if ep is not None and (ep.explicit_response_port or ep.concurrent):
            return Port(msg.sender_addr, 0 if ended_only else msg.corr, msg.index, once=True,
                        call_msg=msg if msg.gathered and not ended_only else None)
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
        explicit-port endpoint only an error (it answers itself), and only if it had not
        answered (the error ended the actor: its caller learns that)."""
        explicit = ep is not None and ep.explicit_response_port
        if ok and ep is not None and (explicit or ep.concurrent):
            return  # it answers itself (a concurrent endpoint's task, when it ends)
        self._answer(port, ok, body, frames, method, cell, explicit and port.used)

    def _answer(self, port, ok, body, frames, method, cell, answered):
        """Sends an answer through port, unless it answered already or nobody waits (a
        send() without a reply); an answer the port cannot carry ends the actor, as an error
        nobody can receive does."""
        _addr, corr = port.reply_target
        if not (ok or (corr and not answered)):
            return
        try:
            port.answer(ok, body, frames)
        except Exception as e:
            self._maybe_die(e, method, "its answer could not be sent through the port", cell)

    def _run_call(self, msg, method, cell, port, body, ep, broadcast):
        """Runs one endpoint call: (ok, body, frames) of its reply, and what it raised (None
        when it returned or was cancelled): a SystemExit is re-raised once the reply is sent."""
        try:
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
            if port is None and broadcast:
                return True, None, None, None  # a broadcast's value goes nowhere
            return True, None, _pickled_result(result, method), None
        except BaseException as e:
            self._call_ends()
            if isinstance(e, (asyncio.CancelledError, _RemoteCancel)):
                return False, error(ErrorKind.Cancelled, "cancelled by the caller"), None, None
            _debug_proc.post_mortem(e)
            body, frames = error_reply(e, self.ctx, method)
            return False, body, frames, e

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
                _debug_proc.pause_task(self.loop_task, self.loop.ident)
            return "pausing-async"

    def withdraw_pause(self):
        with self.pause_lock:
            self.pause_next = False
            _debug_proc.unpause_thread(self.ident)
            if self.loop_task is not None:
                _debug_proc.unpause_task(self.loop_task)

    def _run_async(self, coro, cell):
        loop = self.loop.get()
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
        """A concurrent endpoint's call: a task on the actor's loop, started now (tasks start in
        the order their messages came); the actor thread goes on to its next message."""
        loop = self.loop.get()
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
                    self._maybe_die(e, method, "it was to answer through its port" if ep.explicit_response_port
                                    else "", cell)
                if self.tombstone is not None:
                    body, frames = self.tombstone, None
                self._answer(port, False, body, frames, method, cell, port.used)
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
        self.actors = {}
        self._lock = threading.Lock()
        self.owners = Owners(self.live_threads, rt.node)

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
        if self.rt.role != "controller":  # a controller's runtime routes Faults itself (deliver_supervision first)
            table.on(Kind.Fault, self._fault)
        table.on(Kind.PeerDead, self._peer_dead)
        table.on(Kind.ProcExited, self._proc_exited)

    def _peer_dead(self, msg):
        """A proc died (relayed by the controller; a lost host's procs come one by one)."""
        body = msg.peer_dead()
        info = (body.error or {}).get("info") or {}
        if not body.host_lost and not info.get("stopping"):
            self.owners.proc_died(body.addr, (body.error or {}).get("text") or f"the proc at {body.addr} died")

    def _proc_exited(self, msg):
        """A proc this process started exited (its agent says)."""
        body = msg.proc_exited()
        if not body.stopping:
            self.owners.proc_died(body.addr, body.text or f"the proc at {body.addr} exited")

    def _fault(self, msg):
        body = msg.fault()
        delivered = self.deliver_supervision(body)
        if msg.corr:
            self.rt.node.reply(msg, True, {})
        if not delivered:
            owner = (body.info or {}).get("owner") or "?"
            self.rt.diag(f"{body.text}\n(its owner, actor {owner}, is no longer on this proc)")

    def deliver_supervision(self, body):
        """A failure of actors whose owner is an actor of this process: to its __supervise__.
        False when no live actor here owns it (the controller's fault hook then gets it)."""
        owner = (body.info or {}).get("owner")
        if not owner:
            return False
        with self._lock:
            t = self.actors.get(owner)
        if t is None or t.instance is None:
            return False
        t.supervision_event(failure_of_fault(body))
        return True

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
            if msg.kind == Kind.StopActor:
                self._bound_stop(msg.actor)
                continue
            inbox = node.actor_inbox(msg.actor)
            if inbox is None:
                continue
            t = ActorThread(self, msg.actor, inbox)
            with self._lock:
                self.actors[msg.actor] = t
            # xmesh's own actors (the controller's registry) run no user code (_base/threads.py).
            (start_thread if msg.actor.startswith(OWN_ACTOR_PREFIX) else start_user_thread)(t)

    def _bound_stop(self, actor_id):
        """A stop of this actor arrived: it waits for the message the actor runs at most the stop
        grace (XMESH_STOP_GRACE_MS, as a proc's stop), then the actor is ended from outside."""
        grace_s = env_float("XMESH_STOP_GRACE_MS", 3000.0) / 1000.0

        def overdue():
            with self._lock:
                t = self.actors.get(actor_id)
            if t is not None and t.tombstone is None:
                t.stop_overdue(grace_s)

        timer = threading.Timer(grace_s, overdue)
        timer.daemon = True
        timer.start()

    def live_threads(self):
        with self._lock:
            return list(self.actors.values())

    def forget_endpoint_cache(self):
        """After a reload updated classes in place: endpoints are looked up again."""
        threads = self.live_threads()
        for t in threads:
            t.endpoints = {}

    def describe(self):
        """Records of the live actors on this proc (see ActorThread._spawn)."""
        threads = self.live_threads()
        return [t.record for t in threads if t.record is not None]

    def async_stacks(self):
        """{"mesh\trank": frames} of the actors awaiting an async endpoint: the chain of
        suspended coroutines, outermost first (a thread dump shows only the loop's select)."""
        threads = self.live_threads()
        out = {}
        for t in threads:
            coro = t.current_coro
            if coro is not None and t.ctx is not None:
                out[_debug_proc.thread_label(t.ctx)] = coroutine_frames(coro)
        return out

    def forget(self, actor_id):
        with self._lock:
            self.actors.pop(actor_id, None)

    def end_all(self, how, timeout):
        """Ends every actor here (the proc stops): no further message, the running async call
        cancelled, then each ends as when stopped (_end). Waits at most timeout seconds for
        their threads (one stuck in native code is left: the process exits around it)."""
        threads = self.live_threads()
        for t in threads:
            t.end_now(how)
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def threads_of(self, mesh_name, ranks):
        """What an attach pauses: the actor threads of that mesh's ranks on this proc."""
        threads = self.live_threads()
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
