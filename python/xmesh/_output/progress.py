"""Progress bars of remote ranks (runtime/output/progress_boards.hpp makes them): a line a rank redraws
with '\\r' is a row of a board, the k-th bar of every rank of an allocation in one cell sharing
board k. This module renders a board as text (one row per rank, or a summary when there are
many) and is the script's sink for remote output (StdStreams): text goes to stdout/stderr,
each rank's bar is printed once, as a line, when it ends, and on a terminal a status line shows
the bars still running."""
import dataclasses
import re
import shutil
import sys
from typing import Dict, List, Optional, Set, TextIO, Tuple

from .. import _core

MAX_ROWS = 16  # boards with more rows are summarised


@dataclasses.dataclass
class BarRow:
    rank: int
    text: str
    done: bool


@dataclasses.dataclass
class ProgressBoard:
    board_id: str
    label: str
    rows: List[BarRow]

    @classmethod
    def from_core(cls, raw: tuple) -> "ProgressBoard":
        board_id, label, rows = raw
        return cls(board_id, label, [BarRow(int(r), t, bool(d)) for r, t, d in rows])

    @property
    def done(self) -> bool:
        return all(r.done for r in self.rows)

    def render(self) -> str:
        """Every rank's bar on a line of its own ("[2]  45%|####  | 45/100"); beyond MAX_ROWS
        a summary, the slowest and the fastest running bar."""
        if len(self.rows) <= MAX_ROWS:
            return "\n".join(self.row_line(r) for r in self.rows)
        return "\n".join(self._summary())

    def row_line(self, row: BarRow) -> str:
        return _core.rank_prefix(self.label, [row.rank]) + row.text

    def _summary(self) -> List[str]:
        running = [r for r in self.rows if not r.done]
        head = _core.rank_prefix(self.label, [r.rank for r in self.rows]) + f"{len(self.rows)} bars: "
        if not running:
            return [head + "all done", self.row_line(self.rows[0])]
        head += f"{len(self.rows) - len(running)} done, {len(running)} running"
        known = [(p, r) for r in running if (p := percent_of(r.text)) is not None]
        if not known:
            return [head, self.row_line(running[0])]
        low, high = min(known, key=lambda pr: pr[0]), max(known, key=lambda pr: pr[0])
        lines = [head + f" ({low[0]}%-{high[0]}%)", self.row_line(low[1]) + "  (slowest)"]
        if high[1] is not low[1]:
            lines.append(self.row_line(high[1]) + "  (fastest)")
        return lines

    def status(self) -> str:
        """One short line: "[ranks 0-3] 12% 40% 38% done" (the terminal's status line)."""
        parts = []
        for r in self.rows:
            p = percent_of(r.text)
            parts.append("done" if r.done else f"{p}%" if p is not None else r.text.strip()[:20])
        prefix = _core.rank_prefix(self.label, [r.rank for r in self.rows])
        return prefix + (self.rows[0].text if len(self.rows) == 1 else " ".join(parts))


_PERCENT = re.compile(r"(\d{1,3})(?:\.\d+)?%")


def percent_of(text: str) -> Optional[int]:
    """The first percentage a bar shows (tqdm's " 45%|"), if any."""
    m = _PERCENT.search(text)
    return int(m.group(1)) if m else None


def write_flushed(stream: TextIO, text: str) -> None:
    """Writes and flushes; a closed or broken stream does not raise."""
    try:
        stream.write(text)
        stream.flush()
    except Exception:  # a closed or broken stream does not raise
        pass


class StdStreams:
    """The script's sink (LogOutput's): chunks (cell, stream, text or ProgressBoard) in order.
    A bar is printed as a line when it ends (a log file gets each rank's final bar, never the
    redraws); while bars run on a terminal, one status line on stderr shows them, erased
    before other output."""

    def __init__(self, out: Optional[TextIO] = None, err: Optional[TextIO] = None,
                 live: Optional[bool] = None) -> None:
        self.out = out
        self.err = err
        self.live_enabled = live
        self.printed: Dict[str, Set[int]] = {}      # board id -> ranks whose final bar was printed
        self.running: Dict[str, Tuple[int, ProgressBoard]] = {}  # boards with bars running, by id
        self.status_shown = False

    def _stream(self, n: int) -> TextIO:
        if n == 2:
            return self.err or sys.stderr
        return self.out or sys.stdout

    def _live(self) -> bool:
        if self.live_enabled is not None:
            return self.live_enabled
        try:
            return self._stream(2).isatty()
        except Exception:
            return False

    def __call__(self, chunks: list) -> None:
        for _cell, stream, item in chunks:
            if isinstance(item, ProgressBoard):
                self._board(stream, item)
            else:
                self._erase_status()
                write_flushed(self._stream(stream), item)
        self._draw_status()

    def _board(self, stream: int, board: ProgressBoard) -> None:
        printed = self.printed.setdefault(board.board_id, set())
        ended = [r for r in board.rows if r.done and r.rank not in printed]
        if ended:
            self._erase_status()
            write_flushed(self._stream(stream), "".join(board.row_line(r) + "\n" for r in ended))
            printed.update(r.rank for r in ended)
        if board.done:
            self.running.pop(board.board_id, None)
        else:
            self.running[board.board_id] = (stream, board)

    def _draw_status(self) -> None:
        if not self.running or not self._live():
            return
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        line = " | ".join(b.status() for _, b in self.running.values())[:width]
        write_flushed(self._stream(2), "\r\x1b[K" + line)
        self.status_shown = True

    def _erase_status(self) -> None:
        if self.status_shown:
            write_flushed(self._stream(2), "\r\x1b[K")
            self.status_shown = False

    def close(self) -> None:
        """The end of output: bars that never ended are printed as they were last drawn."""
        self._erase_status()
        for stream, board in self.running.values():
            printed = self.printed.get(board.board_id, set())
            rest = [r for r in board.rows if r.rank not in printed]
            if rest:
                write_flushed(self._stream(stream), "".join(board.row_line(r) + "\n" for r in rest))
        self.running.clear()
