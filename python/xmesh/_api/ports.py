"""Ports and channels (Monarch's Channel, Port, PortReceiver and send()): a port is an address
anyone holding it can send values to, in order, and a receiver reads them where the channel was
opened. Underneath, a receiver is an open-ended Call of its process's node (runtime/node/call.hpp,
Node::open_port) and a send is a Reply message carrying the port's id: the same path, wait and
error handling as a call's answers. A Port pickles, so it can go to actors in arguments; the
actor host also makes one for each message of an endpoint declared with
`@endpoint(explicit_response_port=True)`, answering that message's call."""
import collections
import threading
import time
from typing import Any, Generic, Optional, Tuple, TypeVar

from .._base import pickling as _pickling
from .._runtime import wait as _wait
from .._base.errors import error_reply
from .future import LocalFuture, check_timeout, error_from
from .._runtime.process import Kind, get_runtime

R = TypeVar("R")
_REPLY = int(Kind.Reply)


class Port(Generic[R]):
    """Where values go: `port.send(value)` (in order, without waiting), `port.exception(exc)`
    (the receiver's recv() raises it as an ActorError). Picklable: pass it to actors."""

    __slots__ = ("_addr", "_corr", "_rank", "_once", "_used", "_call_msg")

    def __init__(self, addr: str, corr: int, rank: Optional[int] = None, once: bool = False,
                 call_msg: Any = None) -> None:
        self._addr = addr    # the receiving process's node
        self._corr = corr    # the receiver's id there (0: a broadcast's answer, which nobody reads)
        self._rank = rank    # what a ranked receiver pairs each value with
        self._once = once    # it answers one call: a second send is an error
        self._used = False
        # The call this port answers when it came through a cast tree (in the process that took
        # it): the answer goes up the tree, as the node replies to it. Not pickled.
        self._call_msg = call_msg

    def send(self, obj: R) -> None:
        """Sends obj to the receiver (fire and forget, in order with this process's other sends
        to it). TypeError if obj cannot be pickled; RuntimeError if the receiver's process is
        known dead or the port answers one call and was used."""
        try:
            frames = _pickling.dumps(obj)
        except Exception as e:
            raise TypeError(f"port.send(): the value cannot be sent: {type(e).__name__}: {e}") from e
        self.answer(True, None, frames)

    def exception(self, obj: BaseException) -> None:
        """Sends an error: the receiver's recv() raises it (an ActorError whose .exception is obj
        when it pickles)."""
        if not isinstance(obj, BaseException):
            raise TypeError(f"port.exception() takes an exception, got {obj!r}")
        from .._base.context import actor_context

        body, frames = error_reply(obj, actor_context(), "")
        self.answer(False, body, frames)

    def answer(self, ok: bool, body: Optional[dict], frames: Any) -> None:
        """Sends one answer as it comes from an endpoint: ok with the pickled value's frames, or
        an error body (the actor host answers plain endpoints called through a port so)."""
        if self._once and self._used:
            raise RuntimeError("this port answers one call and already did: send once (open a Channel for a stream)")
        self._used = True
        if not self._corr:
            return  # a broadcast's: nobody waits for an answer
        index = -1 if self._rank is None else self._rank
        try:
            if self._call_msg is not None:
                get_runtime().node.reply(self._call_msg, ok, body, frames)
                return
            get_runtime().node.send(self._addr, _REPLY, body, frames, corr=self._corr, index=index, ok=ok)
        except Exception as e:
            raise RuntimeError(f"port.send() could not reach the receiver at {self._addr}: {e}") from e

    @property
    def reply_target(self) -> "Tuple[str, int]":
        """(receiving node's address, receiver id): where a call answering to this port says to
        send its answers."""
        return self._addr, self._corr

    @property
    def used(self) -> bool:
        """Whether this handle sent anything (an explicit-port endpoint that returns without
        sending leaves its caller waiting: the port may still be answered later)."""
        return self._used

    def __reduce__(self):
        return (Port, (self._addr, self._corr, self._rank, self._once))

    def __repr__(self) -> str:
        rank = "" if self._rank is None else f" rank {self._rank}"
        return f"<xmesh.Port {self._corr} at {self._addr}{rank}>"


class _Mailbox:
    """A port's receiving end in this process: the node's open-ended Call and what was taken from
    it but not yet given out. Closed (the node forgets the port) by close() or when dropped."""

    def __init__(self, once: bool) -> None:
        rt = get_runtime()
        self.node = rt.node
        self.call = rt.node.open_port(once)
        self.addr = rt.node.addr
        self.pending: "collections.deque" = collections.deque()
        self.lock = threading.Lock()
        self.closed = False

    def take(self, description: str) -> "Optional[Tuple[int, bool, Any, Any]]":
        """The next (index, ok, body, frames) to arrive, or None when nothing is there yet."""
        with self.lock:
            if self.closed:
                raise RuntimeError(f"{description}: this receiver was closed")
            # Done is read before taking: a once port's value that lands between an empty take
            # and a look at done would otherwise read as taken already.
            done = self.call.done
            if not self.pending:
                self.pending.extend(self.call.take())
            if self.pending:
                return self.pending.popleft()
        if done:
            raise RuntimeError(f"{description}: this receiver was opened with once=True and its one value was "
                               "taken already")
        return None

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        try:
            self.node.forget_call(self.call.id)
        except Exception:
            pass

    def __del__(self) -> None:
        self.close()


class PortReceiver(Generic[R]):
    """Reads what is sent to its Port, in arrival order: `await receiver.recv()` or
    `receiver.recv().get(timeout)`. Each recv() takes the next value when it is first waited on.
    The receiver closes with close() or when dropped (later sends to its port are ignored)."""

    def __init__(self, once: bool = False, mailbox: Optional[_Mailbox] = None) -> None:
        self._mailbox = mailbox if mailbox is not None else _Mailbox(once)

    def port(self, rank: Optional[int] = None) -> Port:
        return Port(self._mailbox.addr, self._mailbox.call.id, rank, False)

    def recv(self) -> "LocalFuture[R]":
        """A Future of the next value (raises what port.exception() sent)."""
        return _Received(self._mailbox, self._outcome_of, "port.recv()")

    def ranked(self) -> "RankedPortReceiver":
        """The same receiver, giving (rank, value): the rank of the message whose answer it is
        (send(..., port=) answers carry it; plain port.send() gives -1)."""
        return RankedPortReceiver(mailbox=self._mailbox)

    def _outcome_of(self, item: "Tuple[int, bool, Any, Any]") -> "Tuple[bool, Any]":
        index, ok, body, frames = item
        return (True, _pickling.loads(frames)) if ok else (False, error_from(body, frames, None))

    def close(self) -> None:
        """Stops receiving: values sent after this are dropped, a recv() says it is closed."""
        self._mailbox.close()

    def __repr__(self) -> str:
        return f"<xmesh.{type(self).__name__} {self._mailbox.call.id}>"


class RankedPortReceiver(PortReceiver):
    """A PortReceiver whose values come as (rank, value)."""

    def _outcome_of(self, item: "Tuple[int, bool, Any, Any]") -> "Tuple[bool, Any]":
        ok, value = super()._outcome_of(item)
        return (True, (item[0], value)) if ok else (False, value)


class _Received(LocalFuture):
    """The Future of one recv(): waits (the one wait) until a value is there, takes it once."""

    def __init__(self, mailbox: _Mailbox, outcome_of: Any, description: str) -> None:
        # No call of its own: Future's call-specific state is not set, and not used.
        self._mailbox = mailbox
        self._outcome_of = outcome_of
        self._description = description

    def _try_take(self) -> bool:
        if self._outcome is None:
            item = self._mailbox.take(self._description)
            if item is not None:
                self._outcome = self._outcome_of(item)
        return self._outcome is not None

    def get(self, timeout: Optional[float] = None) -> Any:
        check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._try_take():  # another recv() may take what woke this one
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not _wait.wait_call(self._mailbox.call, left, self._description, any_result=True):
                raise TimeoutError(f"{self._description}: nothing came within {timeout} s")
        return self._result()

    result = get

    def __await__(self):
        while not self._try_take():
            yield from _wait.wait_call_async(self._mailbox.call, self._description, any_result=True).__await__()
        return self._result()

    def done(self) -> bool:
        return self._try_take()

    def cancel(self) -> bool:
        return False  # nothing runs on its behalf

    def describe_pending(self) -> str:
        return "received" if self._outcome is not None else "nothing sent to the port yet"

    def __repr__(self) -> str:
        return f"<xmesh.Future {self._description}: {'received' if self._outcome is not None else 'waiting'}>"


class Channel(Generic[R]):
    """Monarch's Channel: `port, receiver = Channel.open()` (or `Channel[int].open()`), in the
    controller or in an actor; the receiver stays where it was opened, the port goes anywhere."""

    @staticmethod
    def open(once: bool = False) -> "Tuple[Port[R], PortReceiver[R]]":
        """A new (Port, PortReceiver); once=True: the receiver takes one value."""
        receiver: PortReceiver = PortReceiver(once)
        return receiver.port(), receiver

    @staticmethod
    def open_ranked(once: bool = False) -> "Tuple[Port[R], RankedPortReceiver]":
        """(Port, RankedPortReceiver): values come with the rank of the message they answer."""
        receiver = RankedPortReceiver(once)
        return receiver.port(), receiver

