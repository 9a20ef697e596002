"""Control messages: one table of handlers per process, served by one loop.

Every process (controller or proc) has a `ControlTable`. Each concern registers the kinds it
handles (`table.on(Kind.X, handler)`): the actor host (cancellations, the output barrier,
`ProcInfo`, reloads, settings, debugger commands) wherever actors run, which is every proc and
a controller that spawned actors with `this_proc()`; the controller its supervision and
debugger events; a proc its adoption. Several handlers of one kind run in registration order.
A kind nobody registered is answered with an error when its sender waits for an answer, so a
request never hangs on a process that does not serve it."""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List

from .. import _core
from .._base.protocol import ErrorKind, error

Kind = _core.Kind
Message = Any  # xmesh._core.Message (the pybind11 module has no stubs)
Handler = Callable[[Message], None]


class ControlTable:
    """The control-message handlers of one process, by kind."""

    def __init__(self, node: Any, role: str, diag: Callable[[str], None]):
        self._node = node
        self._role = role
        self._diag = diag
        self._handlers: Dict[int, List[Handler]] = {}
        self._lock = threading.Lock()

    def on(self, kind: int, handler: Handler) -> None:
        """Adds a handler for messages of this kind (after those already registered)."""
        with self._lock:
            self._handlers.setdefault(int(kind), []).append(handler)

    def handles(self, kind: int) -> bool:
        with self._lock:
            return int(kind) in self._handlers

    def dispatch(self, msg: Message) -> None:
        """Runs the handlers of msg's kind; a handler's exception is reported, never fatal."""
        with self._lock:
            handlers = list(self._handlers.get(int(msg.kind), ()))
        if not handlers:
            if msg.corr:
                self._node.reply(msg, False, error(ErrorKind.Unsupported, f"this {self._role} does not handle "
                                                                          f"'{msg.kind.name}' messages"))
            return
        for handler in handlers:
            try:
                handler(msg)
            except Exception as e:  # never let the loop die
                self._diag(f"error handling a {msg.kind.name} message: {type(e).__name__}: {e}")

    def serve(self, inbox: Any, poll_s: float | None = None) -> None:
        """Handles the inbox's messages until it is closed. poll_s: wake up at least that often
        (a proc's main thread, where Python runs signal handlers); None: wait without limit."""
        while True:
            msg = inbox.pop(timeout=poll_s)
            if msg is not None:
                self.dispatch(msg)
            elif inbox.closed:
                return
