"""The controller's remote output: the C++ LogRouter (runtime/output/log_router.hpp) turns the host
agents' Log messages into display chunks tagged with their cell; this module delivers them.

A script prints them on its stdout/stderr from a thread of its own; in the kernel the sink is a
CellOutput, which keeps one queue per destination (the executing cell, each finished cell's
output slot, output waiting for a cell) and publishes through the kernel's CellSink. Delivery happens under one lock, so
the flush barrier (`barrier`) can guarantee that every chunk produced before it has been
delivered when it returns: a chunk taken from the router is always delivered before the lock
is released."""
import collections
import dataclasses
import html
import sys
import threading
import time
from typing import List, Optional, Protocol, Sequence, Union

from .. import _core
from .._base.env import env_float
from .progress import ProgressBoard, StdStreams, write_flushed
from .._base.threads import start_thread


def barrier_timeout() -> float:
    """XMESH_LOG_BARRIER_S, read when used (a forked proc's environment is set after imports)."""
    return env_float("XMESH_LOG_BARRIER_S", 5.0)


def write_std(stream, text):
    """Writes text on this process's stdout (stream 1) or stderr (2), flushed; a closed or
    broken stream does not raise."""
    write_flushed(sys.stderr if stream == 2 else sys.stdout, text)


class SummaryLine(str):
    """A line standing for lines alike of several ranks ("[0] loss=0.12  [similar on ranks 1-7]"),
    carrying those lines (each prefixed as its rank's own, by rank): text wherever text goes (a
    script prints the summary), a fold that opens to the members in a notebook."""

    members: Sequence[str]
    left_out: int

    def __new__(cls, text: str, members: Sequence[str], left_out: int = 0) -> "SummaryLine":
        line = super().__new__(cls, text)
        line.members = tuple(members)
        line.left_out = left_out
        return line


_MONO = ("font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,13px);"
         "line-height:var(--jp-code-line-height,1.3);white-space:pre-wrap;margin:0;padding:0")
_STDERR = "background:var(--jp-rendermime-error-background,#fdd);"


def summaries_html(items: Sequence[str], stream: int = 1) -> str:
    """Output text as HTML, each SummaryLine a fold (<details>) that opens to its ranks' lines,
    other text as it is, monospace like a cell's stream output (stderr on its background)."""
    parts: List[str] = []
    plain: List[str] = []

    def end_plain() -> None:
        text = "".join(plain)
        plain.clear()
        if text:
            parts.append(f'<div style="{_MONO}">{html.escape(text[:-1] if text.endswith(chr(10)) else text)}</div>')

    for item in items:
        if not isinstance(item, SummaryLine):
            plain.append(item)
            continue
        end_plain()
        members = "\n".join(item.members)
        if item.left_out:
            members += f"\n(and {item.left_out} more ranks: mesh.logs() or `xmesh logs NAME` have every line)"
        parts.append(f'<details style="{_MONO}"><summary style="cursor:pointer">'
                     f'{html.escape(item.rstrip(chr(10)))}</summary>'
                     f'<div style="{_MONO};padding-left:1.5em">{html.escape(members)}</div></details>')
    end_plain()
    style = (_STDERR if stream == 2 else "") + _MONO
    return f'<div class="xmesh-output" style="{style}">{"".join(parts)}</div>'


def _item_of(text: str, board: Optional[tuple], summary: Optional[tuple]) -> Union[str, ProgressBoard]:
    """A chunk of the router's (LogRouter.take_output) as what the sinks take."""
    if board is not None:
        return ProgressBoard.from_core(board)
    if summary is not None:
        members, left_out = summary
        return SummaryLine(text, members, left_out)
    return text


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
        self.sink = sink or StdStreams()
        self.lock = threading.RLock()
        self._stopped = False
        self._held = False  # the debugger prompt is open: remote output waits in the router,
        self._held_local = []  # the runtime's own lines here
        self.router.start()
        start_thread(threading.Thread(target=self._pump, name="xmesh-log-output", daemon=True))

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
            chunks = [(cell, stream, _item_of(text, board, summary))
                      for cell, stream, text, board, summary in self.router.take_output()]
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
            ok = self.router.wait_marks(list(marks), barrier_timeout() if timeout is None else timeout)
        self.router.flush_windows()
        self.deliver_queued()
        return ok

    def sync(self, timeout=None):
        """Delivers everything the host agents sent so far (at exit, after the procs ended)."""
        self.router.sync(barrier_timeout() if timeout is None else timeout)
        self.router.flush_windows()
        self.deliver_queued()

    def stop(self):
        self._stopped = True
        self.router.stop()
        self.deliver_queued()
        close = getattr(self.sink, "close", None)  # the script's sink prints bars that never ended
        if close is not None:
            close()


# -- the destinations of remote output in a notebook (DESIGN §6) ------------------------------
# Remote output is tagged with the cell whose call produced it (the causal context travels with
# every call). Output of the executing cell is written by the main thread, the only one that may
# publish on xeus's shell socket, so it is ordered before the cell's reply: while the cell waits
# on a future, between two bytecodes (a pending call), and at the end. Output of a cell that
# already finished goes into that cell's output slot, a display made at its end when calls were
# still running, updated from the runtime's thread while no cell runs. Output that belongs to no
# cell it can reach is shown by the cell that runs (or the next one). A board of progress bars
# (_output/progress.py) is a display of its own, made where its first state would have been written and
# updated in place from then on, whichever cell runs.

class CellSink(Protocol):
    """What a notebook front end does with output; the kernel registers one (_kernel/interpreter.py)."""

    def write(self, stream: int, text: str) -> None:
        """Main thread: text on the executing cell's stdout (1) or stderr (2)."""

    def write_summaries(self, stream: int, lines: List[str]) -> None:
        """Main thread: the executing cell's text from a summary of lines alike (a SummaryLine)
        on, as one display where the text would have gone, each summary unfolding to its ranks'
        lines (summaries_html)."""

    def open_slot(self, slot_id: str, text: str = "", html: str = "") -> bool:
        """Main thread: a display showing text (empty: a cell's slot that later output goes into);
        html, when not empty, the same with its summaries unfolding."""

    def update_slot(self, slot_id: str, text: str, html: str = "") -> None:
        """Main thread, while a cell runs: the slot's whole text (ordered before that reply)."""

    def publish_slot(self, slot_id: str, text: str, parent: dict, html: str = "") -> None:
        """Any thread, while no cell runs: the slot's whole text, as an update to that cell."""


def _chars(entry: Union[str, ProgressBoard]) -> int:
    """What an entry of a slot weighs against SLOT_MAX_CHARS (a summary with its members)."""
    if isinstance(entry, SummaryLine):
        return len(entry) + sum(len(m) + 1 for m in entry.members)
    return len(entry) if isinstance(entry, str) else 0


@dataclasses.dataclass(eq=False)
class _Slot:
    """A display updated in place: a finished cell's output slot (the late output shown in it),
    or a board of progress bars (board set)."""
    slot_id: str
    parent: Optional[dict]       # the request header of the cell showing it (the update's parent)
    late: list = dataclasses.field(default_factory=list)  # text, or a ProgressBoard shown inline
    late_chars: int = 0
    dropped_chars: int = 0
    last_publish: float = 0.0
    dirty: bool = False
    queued: bool = False         # an update waits in the executing cell's queue
    shown: bool = True           # False: a board's display the main thread has yet to make
    owner: str = ""              # the cell whose output shows a board's display
    board: Optional[ProgressBoard] = None

    def add(self, text: Union[str, ProgressBoard], max_chars: int) -> None:
        self.late.append(text)
        self.late_chars += _chars(text)
        while self.late_chars > max_chars and len(self.late) > 1:
            size = _chars(self.late.pop(0))
            self.late_chars -= size
            self.dropped_chars += size
        self.dirty = True

    def set_board(self, board: ProgressBoard, max_chars: int) -> None:
        """A board's new state: the display's own board, or one shown inline in the slot."""
        self.dirty = True
        if self.board is not None:
            self.board = board
            return
        for i, entry in enumerate(self.late):
            if isinstance(entry, ProgressBoard) and entry.board_id == board.board_id:
                self.late[i] = board
                return
        self.add(board, max_chars)

    def text(self) -> str:
        if self.board is not None:
            return self.board.render()
        return "".join(self._entries())

    def html(self) -> str:
        """The text as HTML where it holds summaries to unfold (else "": text/plain says it all)."""
        if self.board is not None or not any(isinstance(e, SummaryLine) for e in self.late):
            return ""
        return summaries_html(self._entries())

    def _entries(self) -> List[str]:
        entries = [e if isinstance(e, str) else e.render() + "\n" for e in self.late]
        if self.dropped_chars:
            entries.insert(0, f"[xmesh] {self.dropped_chars} earlier characters are not shown here: mesh.logs() "
                              f"or `xmesh logs NAME` have every line\n")
        return entries


class CellOutput:
    """One queue per destination of remote output in a notebook: the executing cell's (drained
    by the main thread), each finished cell's slot, each board of progress bars, and output
    waiting for a cell. It is the LogOutput's sink (`route`); the kernel tells it when cells
    begin and end and publishes through the CellSink it registered."""

    SLOT_MAX_CHARS = 200_000
    SLOT_UPDATE_S = 0.1
    RECENT_MAX = 200
    BOARDS_MAX = 1000

    def __init__(self, sink: CellSink) -> None:
        self.sink = sink
        self.lock = threading.RLock()
        self.current: Optional[str] = None   # the executing cell's token
        self.here: list = []                 # (stream, text) or (_UPDATE, slot): the executing cell's queue
        self.waiting: list = []              # (stream, text or board) with no cell to show them in
        self.slots: "collections.OrderedDict[str, _Slot]" = collections.OrderedDict()
        self.names: "collections.OrderedDict[str, str]" = collections.OrderedDict()  # token -> "In [3]"
        # board id -> the display showing it (its own, or the cell slot it is inline in)
        self.boards: "collections.OrderedDict[str, _Slot]" = collections.OrderedDict()

    def begin_cell(self, token: str, name: str = "") -> None:
        """A cell begins; name: how its user knows it ("In [3]"), for what comes for it later
        with no slot of its own to go to."""
        with self.lock:
            self.current = token
            if name:
                self.names[token] = name
                while len(self.names) > self.RECENT_MAX:
                    self.names.popitem(last=False)
            if self.waiting:
                self.here.append((2, "[xmesh] output that arrived while no cell was running:\n"))
                for stream, item in self.waiting:
                    if isinstance(item, ProgressBoard):
                        self._show_board_here(item)
                    else:
                        self.here.append((stream, item))
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
            for display in self.boards.values():  # boards this cell shows are updated as its output
                if display.owner == token:
                    display.parent = parent
            if self.current == token:
                self.current = None
        self.drain()

    def route(self, chunks: list) -> None:
        """LogOutput's sink: each chunk (cell, stream, text or ProgressBoard) goes to the queue
        of its cell."""
        publish: List[_Slot] = []
        with self.lock:
            cur = self.current
            for cell, stream, item in chunks:
                if isinstance(item, ProgressBoard):
                    self._route_board(cell, stream, item, publish)
                    continue
                if cur is not None and (cell == cur or not cell):
                    self.here.append((stream, item))
                    continue
                slot = self.slots.get(cell)
                if slot is not None:
                    slot.add(item, self.SLOT_MAX_CHARS)
                    self._refresh(slot, publish)
                elif cur is not None:  # a cell with no slot, or another kernel's: the running cell shows it
                    self.here.append((stream, self._about(cell, item)))
                else:
                    self.waiting.append((stream, self._about(cell, item)))
            queued = bool(self.here)
        if queued:
            if threading.current_thread() is threading.main_thread():
                self.drain()
            else:
                _core.call_on_main_thread()
        for display in publish:
            self._publish_late(display)

    def _about(self, cell: str, text: str) -> str:
        """A notice of the runtime's for an earlier cell shown elsewhere names that cell (a proc of
        the mesh it last used died: "[xmesh] about In [3]: proc rank 1 ... was killed")."""
        name = self.names.get(cell) if cell else None
        if name and text.startswith("[xmesh] "):
            return f"[xmesh] about {name}: {text[len('[xmesh] '):]}"
        return text

    def _route_board(self, cell: str, stream: int, board: ProgressBoard, publish: list) -> None:
        """A board's state: updates the display showing it, or shows it where its cell's text
        would go (lock held)."""
        display = self.boards.get(board.board_id)
        if display is not None:
            display.set_board(board, self.SLOT_MAX_CHARS)
            self._refresh(display, publish)
            return
        cur = self.current
        if cur is not None and (cell == cur or not cell or cell not in self.slots):
            self._show_board_here(board)
            return
        slot = self.slots.get(cell)
        if slot is not None:
            slot.set_board(board, self.SLOT_MAX_CHARS)
            self._remember_board(board.board_id, slot)
            self._refresh(slot, publish)
            return
        for i, (_, item) in enumerate(self.waiting):
            if isinstance(item, ProgressBoard) and item.board_id == board.board_id:
                self.waiting[i] = (stream, board)
                return
        self.waiting.append((stream, board))

    def _show_board_here(self, board: ProgressBoard) -> None:
        """A display of its own in the executing cell, made by its main thread (lock held)."""
        display = _Slot(board.board_id, None, shown=False, owner=self.current or "", board=board, dirty=True)
        self._remember_board(board.board_id, display)
        self._queue_update(display)

    def _remember_board(self, board_id: str, display: _Slot) -> None:
        self.boards[board_id] = display
        while len(self.boards) > self.BOARDS_MAX:
            self.boards.popitem(last=False)

    def _refresh(self, slot: _Slot, publish: list) -> None:
        """A display whose text changed: the running cell's main thread updates it (ordered with
        that cell's output), or, while no cell runs, this thread does (lock held)."""
        if self.current is not None or not slot.shown:
            self._queue_update(slot)
        elif slot.parent is not None and slot not in publish:
            publish.append(slot)

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
                # From a summary on, the stream's text in a row is one display with folds.
                summaries: List[str] = [item] if isinstance(item, SummaryLine) else []
                while summaries and self.here and self.here[0][0] == stream and summaries[-1].endswith("\n"):
                    summaries.append(self.here.pop(0)[1])
                if stream is _UPDATE:
                    item.queued = item.dirty = False
                    slot_id, text, html_, new = item.slot_id, item.text(), item.html(), not item.shown
                    item.shown = True
            if summaries:
                self.sink.write_summaries(stream, summaries)
            elif stream is not _UPDATE:
                self.sink.write(stream, item)
            elif new:
                self.sink.open_slot(slot_id, text, html_)
            else:
                self.sink.update_slot(slot_id, text, html_)

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
            # A cell started meanwhile, or a board whose cell has not ended: a main thread sends it.
            if self.current is not None or slot.parent is None:
                self._queue_update(slot)
                _core.call_on_main_thread()
                return
            slot.dirty = False
            slot.last_publish = now
            text, html_ = slot.text(), slot.html()
        self.sink.publish_slot(slot.slot_id, text, slot.parent, html_)


_UPDATE = object()  # an item of the executing cell's queue: (_UPDATE, slot) shows or updates that slot
