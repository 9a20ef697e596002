"""The controller's remote output: the C++ LogRouter (runtime/log_router.hpp) turns the host
agents' Log messages into display chunks tagged with their cell; this module delivers them.

A script prints them on its stdout/stderr from a thread of its own; in the kernel the sink is a
CellOutput, which keeps one queue per destination (the executing cell, each finished cell's
output slot, output waiting for a cell) and publishes through the kernel's CellSink. Delivery happens under one lock, so
the flush barrier (`barrier`) can guarantee that every chunk produced before it has been
delivered when it returns: a chunk taken from the router is always delivered before the lock
is released."""
import collections
import dataclasses
import sys
import threading
import time
from typing import Optional, Protocol

from . import _core
from ._env import env_float


BARRIER_TIMEOUT = env_float("XMESH_LOG_BARRIER_S", 5.0)


def write_std(stream, text):
    """Writes text on this process's stdout (stream 1) or stderr (2), flushed; a closed or
    broken stream does not raise."""
    out = sys.stderr if stream == 2 else sys.stdout
    try:
        out.write(text)
        out.flush()
    except Exception:
        pass


def write_to_std_streams(chunks):
    """The script sink: chunks go to this process's stdout / stderr, in order."""
    for _cell, stream, text in chunks:
        write_std(stream, text)


class LogOutput:
    def __init__(self, node, interactive, sink=None):
        self.router = _core.LogRouter(node)
        # Aggregation window for allocations without logging_option(): 3 s in the kernel (where
        # a person reads the lines), off in scripts (where they may go to a file or a pipe).
        default_window = env_float("XMESH_LOG_WINDOW_S", 3.0 if interactive else -1.0)
        self.router.set_default_window(int(default_window * 1000) if default_window >= 0 else -1)
        rate = int(env_float("XMESH_LOG_DISPLAY_RATE", 1000 if interactive else 0))
        self.router.set_display_rate(rate, int(env_float("XMESH_LOG_DISPLAY_BURST", 5 * rate)))
        # The kernel's router sends each chunk to the cell it belongs to (injected: _kernel.setup).
        self.sink = sink or write_to_std_streams
        self.lock = threading.RLock()
        self._stopped = False
        self._held = False  # the debugger prompt is open: remote output waits in the router,
        self._held_local = []  # the runtime's own lines here
        self.router.start()
        threading.Thread(target=self._pump, name="xmesh-log-output", daemon=True).start()

    def _pump(self):
        while not self._stopped:
            try:
                if self._held:
                    time.sleep(0.05)  # the output waits in the router until the prompt closes
                    continue
                if not self.router.wait_output(0.5):
                    continue
                self.deliver_queued()
            except Exception:  # the interpreter is finalizing, or a sink failed: keep going
                if self._stopped:
                    return

    def hold(self, on):
        """While the debugger prompt is open, remote output stays queued (it would garble the
        prompt) and is delivered, in order, when the prompt closes."""
        with self.lock:
            self._held = bool(on)
            released, self._held_local = ([], self._held_local) if on else (self._held_local, [])
            if released:
                self.sink(released)
        if not on:
            self.deliver_queued()

    def deliver_queued(self):
        with self.lock:
            if self._held:
                return
            chunks = self.router.take_output()
            if chunks:
                self.sink(chunks)

    def local(self, cell, stream, text):
        """Output of the controller's own runtime (supervision notices, faults), delivered like
        remote output so that it reaches the right cell."""
        chunk = (cell, 2 if stream == "stderr" else 1, text)
        with self.lock:
            if self._held:
                self._held_local.append(chunk)
            else:
                self.sink([chunk])

    def barrier(self, marks, timeout=None):
        """Waits until the output procs wrote before the markers in marks ([(addr, seq)]) has
        arrived, then delivers everything (aggregation windows end early). Gives up after
        timeout (a hung host agent must not hang the caller); returns whether all arrived."""
        ok = True
        if marks:
            ok = self.router.wait_marks(list(marks), BARRIER_TIMEOUT if timeout is None else timeout)
        self.router.flush_windows()
        self.deliver_queued()
        return ok

    def sync(self, timeout=None):
        """Delivers everything the host agents sent so far (at exit, after the procs ended)."""
        self.router.sync(BARRIER_TIMEOUT if timeout is None else timeout)
        self.router.flush_windows()
        self.deliver_queued()

    def stop(self):
        self._stopped = True
        self.router.stop()
        self.deliver_queued()


# -- the destinations of remote output in a notebook (DESIGN §6) ------------------------------
# Remote output is tagged with the cell whose call produced it (the causal context travels with
# every call). Output of the executing cell is written by the main thread, the only one that may
# publish on xeus's shell socket, so it is ordered before the cell's reply: while the cell waits
# on a future, between two bytecodes (a pending call), and at the end. Output of a cell that
# already finished goes into that cell's output slot, a display made at its end when calls were
# still running, updated from the runtime's thread while no cell runs. Output that belongs to no
# cell it can reach is shown by the cell that runs (or the next one).

class CellSink(Protocol):
    """What a notebook front end does with output; the kernel registers one (_kernel.py)."""

    def write(self, stream: int, text: str) -> None:
        """Main thread: text on the executing cell's stdout (1) or stderr (2)."""

    def open_slot(self, slot_id: str) -> bool:
        """Main thread, at the end of a cell: an empty display that later output goes into."""

    def update_slot(self, slot_id: str, text: str) -> None:
        """Main thread, while a cell runs: the slot's whole text (ordered before that reply)."""

    def publish_slot(self, slot_id: str, text: str, parent: dict) -> None:
        """Any thread, while no cell runs: the slot's whole text, as an update to that cell."""


@dataclasses.dataclass(eq=False)
class _Slot:
    """A finished cell's output slot and the late output shown in it."""
    slot_id: str
    parent: dict                 # the cell's request header (the update's parent)
    late: list = dataclasses.field(default_factory=list)
    late_chars: int = 0
    dropped_chars: int = 0
    last_publish: float = 0.0
    dirty: bool = False
    queued: bool = False         # an update waits in the executing cell's queue

    def add(self, text: str, max_chars: int) -> None:
        self.late.append(text)
        self.late_chars += len(text)
        while self.late_chars > max_chars and len(self.late) > 1:
            dropped = self.late.pop(0)
            self.late_chars -= len(dropped)
            self.dropped_chars += len(dropped)
        self.dirty = True

    def text(self) -> str:
        text = "".join(self.late)
        if self.dropped_chars:
            text = (f"[xmesh] {self.dropped_chars} earlier characters are not shown here: mesh.logs() or "
                    f"`xmesh logs NAME` have every line\n") + text
        return text


class CellOutput:
    """One queue per destination of remote output in a notebook: the executing cell's (drained
    by the main thread), each finished cell's slot, and output waiting for a cell. It is the
    LogOutput's sink (`route`); the kernel tells it when cells begin and end and publishes
    through the CellSink it registered."""

    SLOT_MAX_CHARS = 200_000
    SLOT_UPDATE_S = 0.1
    RECENT_MAX = 200

    def __init__(self, sink: CellSink) -> None:
        self.sink = sink
        self.lock = threading.RLock()
        self.current: Optional[str] = None   # the executing cell's token
        self.here: list = []                 # (stream, text) or (_UPDATE, slot): the executing cell's queue
        self.waiting: list = []              # (stream, text) with no cell to show them in
        self.slots: "collections.OrderedDict[str, _Slot]" = collections.OrderedDict()

    def begin_cell(self, token: str) -> None:
        with self.lock:
            self.current = token
            if self.waiting:
                self.here.append((2, "[xmesh] output that arrived while no cell was running:\n"))
                self.here.extend(self.waiting)
                self.waiting.clear()
        self.drain()

    def end_cell(self, token: str, keep_slot: bool, parent: dict) -> None:
        """The cell ended; with keep_slot (it left calls running) its later output goes into a
        slot opened now (main thread)."""
        if keep_slot:
            slot_id = f"xmesh-output-{token}"
            if self.sink.open_slot(slot_id):
                with self.lock:
                    self.slots[token] = _Slot(slot_id, parent)
                    while len(self.slots) > self.RECENT_MAX:
                        self.slots.popitem(last=False)
        with self.lock:
            if self.current == token:
                self.current = None
        self.drain()

    def route(self, chunks: list) -> None:
        """LogOutput's sink: each chunk (cell, stream, text) goes to the queue of its cell."""
        publish = []
        with self.lock:
            cur = self.current
            for cell, stream, text in chunks:
                if cur is not None and (cell == cur or not cell):
                    self.here.append((stream, text))
                    continue
                slot = self.slots.get(cell)
                if slot is not None:
                    slot.add(text, self.SLOT_MAX_CHARS)
                    if cur is not None:  # the running cell's main thread publishes it, ordered
                        self._queue_update(slot)
                    elif slot not in publish:
                        publish.append(slot)
                elif cur is not None:  # a cell with no slot, or another kernel's: the running cell shows it
                    self.here.append((stream, text))
                else:
                    self.waiting.append((stream, text))
            queued = bool(self.here)
        if queued:
            if threading.current_thread() is threading.main_thread():
                self.drain()
            else:
                _core.call_on_main_thread()
        for slot in publish:
            self._publish_late(slot)

    def _queue_update(self, slot: _Slot) -> None:
        if not slot.queued:
            slot.queued = True
            self.here.append((_UPDATE, slot))

    def drain(self) -> None:
        """Writes the executing cell's queue, on the main thread (elsewhere: no-op). Items are
        taken one at a time, so a drain that starts inside another (a pending call between two
        bytecodes) just carries on with the next item: nothing waits for a spent wake-up."""
        if threading.current_thread() is not threading.main_thread():
            return
        while True:
            with self.lock:
                if not self.here:
                    return
                stream, item = self.here.pop(0)
                if stream is _UPDATE:
                    item.queued = item.dirty = False
                    slot_id, text = item.slot_id, item.text()
            if stream is _UPDATE:
                self.sink.update_slot(slot_id, text)
            else:
                self.sink.write(stream, item)

    def _publish_late(self, slot: _Slot, force: bool = False) -> None:
        """While no cell runs: the slot's update from this (runtime) thread, at most every
        SLOT_UPDATE_S (a timer sends the last)."""
        now = time.monotonic()
        with self.lock:
            if not slot.dirty:
                return
            if not force and now - slot.last_publish < self.SLOT_UPDATE_S:
                t = threading.Timer(self.SLOT_UPDATE_S, self._publish_late, (slot, True))
                t.daemon = True
                t.start()
                return
            if self.current is not None:  # a cell started meanwhile: its main thread sends it
                self._queue_update(slot)
                _core.call_on_main_thread()
                return
            slot.dirty = False
            slot.last_publish = now
            text = slot.text()
        self.sink.publish_slot(slot.slot_id, text, slot.parent)


_UPDATE = object()  # an item of the executing cell's queue: (_UPDATE, slot) updates that slot
