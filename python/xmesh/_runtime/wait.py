"""The one wait: every blocking or awaiting path on a call (`Future.get`, `await`, `stream` and
`async for`, the waits of the debugger, of sync reloads and of requests) goes through here.

A wait sleeps without the GIL on the call itself (`Call.wait_for`) and wakes for one of three
things: the call (done, or a result for a stream), `_core.wake_main()` (someone has work for the
main thread: output to show in the running notebook cell, an actor stopped in pdb), or a signal
(Ctrl-C raises KeyboardInterrupt in the waiter). Only the main thread is woken by
`wake_main()`; it then runs the wake hooks that upper layers registered, the way xeus injects
its publisher: the kernel its output drain, the debugger its prompt. This module imports
neither of them.

`await` does the same on the running asyncio loop: readers on the call's eventfd and, on the
main thread, on the waker's eventfd. Nothing polls."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import _core
from .._base.env import env_float

WakeHook = Callable[[str], None]
InterruptHook = Callable[[Any], None]
Call = Any   # xmesh._core.Call (the pybind11 module has no stubs)
Node = Any   # xmesh._core.Node
# A request's body: a dict of its fields, or a bound body of its kind (xmesh._core.*Body).
RequestBody = Any
Answers = Dict[int, Tuple[bool, dict, list]]

_output_hooks: List[Callable[[], None]] = []
_wake_hooks: List[WakeHook] = []
_interrupt_hooks: List[InterruptHook] = []
_cancel_hint: List[Callable[[], str]] = []
SlowWaitHook = Callable[[Call, str], None]
_slow_wait_hooks: List[SlowWaitHook] = []
# After this long, and as often after, a wait asks why its call is not done (stopped procs).
def slow_wait_s() -> float:
    """XMESH_WAIT_NOTICE_S, read when used (a forked proc's environment is set after imports); a
    malformed value is the default (_env), never an exception in every wait."""
    return env_float("XMESH_WAIT_NOTICE_S", 2)
Ready, Woken = _core.WaitOutcome.Ready, _core.WaitOutcome.Woken


def add_wake_hook(hook: WakeHook) -> None:
    """hook(description) runs on the main thread whenever its wait is woken (and once before
    each wait starts): show pending output, open the debugger for new stops. It may raise to end
    the wait (DebuggerQuit, KeyboardInterrupt)."""
    _wake_hooks.append(hook)


def add_output_hook(hook: Callable[[], None]) -> None:
    """hook() shows the output queued for the main thread (the kernel's drain): it runs at every
    wake, and after a flush barrier so that a call's output is shown before its result."""
    _output_hooks.append(hook)


def add_slow_wait_hook(hook: SlowWaitHook) -> None:
    """hook(call, description) runs on the main thread every slow_wait_s() while a wait goes on:
    it may tell the user why (a target that is stopped, or blocked in the kernel)."""
    _slow_wait_hooks.append(hook)


def _run_slow_wait_hooks(call: Call, description: str) -> None:
    for hook in _slow_wait_hooks:
        hook(call, description)


def show_output() -> None:
    if on_main_thread():
        for hook in _output_hooks:
            hook()


def add_interrupt_hook(hook: InterruptHook) -> None:
    """hook(future) runs when Ctrl-C broke the wait on that future (the kernel remembers it so
    that a second interrupt cancels it)."""
    _interrupt_hooks.append(hook)


def set_cancel_hint(hint: Callable[[], str]) -> None:
    """The text telling the user how to cancel calls left running by an interrupt."""
    _cancel_hint[:] = [hint]


def cancel_hint() -> str:
    return _cancel_hint[0]() if _cancel_hint else "calling .cancel() on the call's Future cancels them"


# Ctrl-C during an asyncio loop's select() cannot be raised where the cell's coroutine waits:
# the kernel's loop runner cancels the coroutine's task with this message instead, and the
# await in wait_call_async turns it back into the KeyboardInterrupt that get() would raise.
_INTERRUPT = "xmesh: interrupted by the user"


def interrupt_task(task: "asyncio.Task[Any]") -> None:
    """Delivers an interrupt into a task suspended in an await (see is_interrupt)."""
    task.cancel(_INTERRUPT)


def is_interrupt(exc: BaseException) -> bool:
    """Whether exc is the CancelledError of interrupt_task (an interrupt, not a cancel)."""
    return isinstance(exc, asyncio.CancelledError) and exc.args[:1] == (_INTERRUPT,)


def as_interrupt(exc: BaseException) -> KeyboardInterrupt:
    """The KeyboardInterrupt an interrupt_task cancel stands for; the task's cancel request is
    withdrawn, since the coroutine goes on (it handles the interrupt)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()
    return KeyboardInterrupt()


def interrupted(future: Any) -> None:
    for hook in _interrupt_hooks:
        hook(future)


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _run_output_hooks(description: str) -> None:
    _core.take_wake()
    for show in _output_hooks:
        show()


def run_wake_hooks(description: str) -> None:
    _run_output_hooks(description)
    for hook in _wake_hooks:
        hook(description)


def wait_call(call: Call, timeout: Optional[float], description: str, any_result: bool = False,
              debugger: bool = True) -> bool:
    """Waits until the call is done or fatal (any_result: until a result is there to take), for
    at most timeout seconds (None: no limit). True if it is; False on timeout. debugger=False:
    a wait of the runtime's own (a request) shows output when woken but never opens the
    debugger prompt, which may be what is waiting."""
    main = on_main_thread()
    deadline = None if timeout is None else time.monotonic() + timeout
    hooks = run_wake_hooks if debugger else _run_output_hooks
    if call_is_ready(call, any_result):
        if main:
            show_output()
        return True
    if main:
        hooks(description)  # what came before this wait: output, actors already stopped
    # Only a user's wait (the runtime's own requests have timeouts and say what did not answer).
    notice_at = time.monotonic() + slow_wait_s() if main and debugger and _slow_wait_hooks else None
    while True:
        now = time.monotonic()
        left = None if deadline is None else max(0.0, deadline - now)
        if notice_at is not None:
            left = max(0.0, notice_at - now) if left is None else min(left, max(0.0, notice_at - now))
        outcome = call.wait_for(left, any_result, main)
        if outcome == Ready:
            if main:
                show_output()
            return True
        if outcome == Woken and main:
            hooks(description)
            continue
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if notice_at is not None and time.monotonic() >= notice_at:
            notice_at = time.monotonic() + slow_wait_s()
            _run_slow_wait_hooks(call, description)


def call_is_ready(call: Call, any_result: bool) -> bool:
    return call.wait_for(0, any_result, False) == Ready


def _drain_eventfd(fd: int) -> None:
    try:
        os.read(fd, 8)
    except (BlockingIOError, InterruptedError):
        pass


async def wait_call_async(call: Call, description: str, any_result: bool = False) -> None:
    """The same on the running asyncio loop: wakes on the call's eventfd and, on the main
    thread, on the waker's (the wake hooks then run on the loop)."""
    if call_is_ready(call, any_result):
        return
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    call_fd = call.fileno()
    wake_fd = _core.wake_fd() if on_main_thread() else None

    def on_call() -> None:
        _drain_eventfd(call_fd)  # level-triggered: read it, or a call of N targets spins
        if call_is_ready(call, any_result) and not waiter.done():
            waiter.set_result(None)

    def on_wake() -> None:
        if waiter.done():
            return
        try:
            run_wake_hooks(description)
        except BaseException as e:
            waiter.set_exception(e)

    slow: Optional[asyncio.TimerHandle] = None

    def on_slow() -> None:
        nonlocal slow
        if not waiter.done():
            _run_slow_wait_hooks(call, description)
            slow = loop.call_later(slow_wait_s(), on_slow)

    if wake_fd is not None and _slow_wait_hooks:
        slow = loop.call_later(slow_wait_s(), on_slow)
    loop.add_reader(call_fd, on_call)
    if wake_fd is not None:
        loop.add_reader(wake_fd, on_wake)
        on_wake()  # stops and output that came before this wait
    try:
        on_call()
        await waiter
    except asyncio.CancelledError as e:
        if is_interrupt(e):
            raise as_interrupt(e) from None
        raise
    finally:
        if slow is not None:
            slow.cancel()
        loop.remove_reader(call_fd)
        if wake_fd is not None:
            loop.remove_reader(wake_fd)
        show_output()


class Request:
    """One request to each address (a Call expecting replies), sent at once; `answers()` waits
    for them through the one wait (without the debugger's prompt). Several Requests sent
    before their answers are awaited run concurrently."""

    def __init__(self, node: Node, addrs: Sequence[str], kind: _core.Kind, body: RequestBody = None, actor: str = ""):
        self._node = node
        self._call = node.call([(a, actor) for a in addrs], int(kind), "", body or {}, None, True)

    def answers(self, timeout: Optional[float], description: str) -> Answers:
        """{index: (ok, body, frames)} of the targets that answered within timeout seconds."""
        try:
            wait_call(self._call, timeout, description, debugger=False)
            return self._take_all()
        finally:
            self._node.forget_call(self._call.id)

    async def answers_async(self, timeout: Optional[float], description: str) -> Answers:
        """answers(), awaited: the running loop goes on meanwhile."""
        try:
            try:
                await asyncio.wait_for(wait_call_async(self._call, description), timeout)
            except asyncio.TimeoutError:
                pass
            return self._take_all()
        finally:
            self._node.forget_call(self._call.id)

    def forget(self) -> None:
        """Answers that come from now on are dropped."""
        self._node.forget_call(self._call.id)

    def _take_all(self) -> Answers:
        return {index: (ok, reply, frames) for index, ok, reply, frames in self._call.take()}


def request(node: Node, addrs: Sequence[str], kind: _core.Kind, body: RequestBody = None, *, timeout: Optional[float],
            description: str, actor: str = "") -> Answers:
    """Request(...).answers(...): the answers by target index; those not in time are absent."""
    return Request(node, addrs, kind, body, actor).answers(timeout, description)
