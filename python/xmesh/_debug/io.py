"""Where the debugger prompt talks (DESIGN §7): a script's terminal (TerminalIO,
TerminalFrontend), or what the kernel injects with set_frontend (the cell's output and the
Jupyter input box), and the signal that interrupts this process's own prompt when an `xmesh
debug` client takes over."""
import signal
import sys
import threading

from .._base.shape import format_coords


def coords_text(coords):
    return format_coords(coords) or "-"


_TABLE_HEADERS = ("Actor Name", "Rank", "Coords", "Hostname", "Function", "Line No.", "Reason")


def _table_rows(sessions):
    return [(s.actor, str(s.rank), coords_text(s.coords), s.host, s.function, str(s.line), s.reason)
            for s in sorted(sessions, key=lambda s: (s.actor, s.rank))]


def html_stop_table(sessions):
    """The table of stopped actors as the notebook shows every xmesh table."""
    from .._base.display import html_table

    return html_table(f"{len(sessions)} actor{'s' if len(sessions) != 1 else ''} stopped in pdb",
                      _TABLE_HEADERS, _table_rows(sessions), left=(0, 3, 4, 6))


def format_table(sessions):
    rows = [_TABLE_HEADERS] + _table_rows(sessions)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line]
    for n, r in enumerate(rows):
        out.append("|" + "|".join(f" {c:<{w}} " for c, w in zip(r, widths)) + "|")
        if n == 0:
            out.append(line.replace("-", "="))
    out.append(line)
    return "\n".join(out) + "\n"


class TakenOver(Exception):
    """An `xmesh debug` client took the prompt over."""


TAKEOVER_SIGNAL = signal.SIGRTMIN + 5   # interrupts this process's own prompt (see take_over)
_takeover_handler_installed = False
_local_reading = False                  # this process's own prompt waits for a line


def _on_takeover_signal(signum, frame):
    if _local_reading:
        raise TakenOver()


def install_takeover_handler():
    """Once, from the main thread; the handler stays (a signal that comes late finds it there
    and does nothing)."""
    global _takeover_handler_installed
    if not _takeover_handler_installed and threading.current_thread() is threading.main_thread():
        signal.signal(TAKEOVER_SIGNAL, _on_takeover_signal)
        _takeover_handler_installed = True


class TerminalIO:
    """A script run from a terminal: its own stdin and stdout."""

    def write(self, text):
        sys.stdout.write(text)
        sys.stdout.flush()

    def show_table(self, sessions):
        """The table of stopped actors (text here; the notebook's I/O shows it as HTML)."""
        self.write(format_table(sessions))

    def read(self, prompt):
        global _local_reading
        _local_reading = True
        try:
            return self._wait_for_line(prompt)
        finally:
            _local_reading = False

    def _wait_for_line(self, prompt):
        return input(prompt)


class TerminalFrontend:
    """Where the prompt lives: a script's terminal. The kernel injects its own (set_frontend):
    the cell's output and the Jupyter stdin channel."""

    where = "this program"
    leftover_input_note = ""  # what to tell about an input box the prompt leaves behind

    def io(self):
        return TerminalIO()

    def input_possible(self):
        try:
            return sys.stdin is not None and sys.stdin.isatty()
        except Exception:
            return False

    def show_pending_output(self):
        """Before the prompt opens: what the front end has queued is shown (a script's output
        is written as it comes: nothing waits)."""


_frontend = TerminalFrontend()


def set_frontend(frontend):
    """The kernel's front end for the prompt (see TerminalFrontend)."""
    global _frontend
    _frontend = frontend


def frontend():
    return _frontend


def takeover_handler_installed():
    return _takeover_handler_installed
