"""A proc's side of output attribution (DESIGN §6; the logic is OutputTracker in
runtime/output/output_marker.hpp).

The host agent reads the proc's fds 1 and 2. So that it knows which call (notebook cell) and
actor the bytes belong to, the proc writes an in-band marker whenever that changes, and at the
end of a call that wrote anything; the marker's seq travels back in the reply (body "m") and
makes the controller's flush barrier. Calls that wrote nothing cost nothing: no marker, no wait.
"Wrote anything": Python wrote through sys.stdout / sys.stderr (noted here), or the process's
write(2) byte count moved during the call (C-level writes, children it waited for), or bytes
are still in the pipes (children still running)."""
import logging
import sys
import threading

from .. import _core

_python_wrote = False  # Python wrote to stdout/stderr since the last marker
_redirected = {}       # thread ident -> where that thread's prints go (a debugger session's relay)


def redirect_thread(ident, target):
    """While a pdb session runs a command, what its thread prints answers that command."""
    if target is None:
        _redirected.pop(ident, None)
    else:
        _redirected[ident] = target


class _TrackedStream:
    """sys.stdout / sys.stderr of a proc: notes that something was written, delegates the rest."""

    def __init__(self, stream):
        object.__setattr__(self, "_stream", stream)

    def write(self, text):
        global _python_wrote
        if _redirected:
            target = _redirected.get(threading.get_ident())
            if target is not None:
                return target.write(text)
        _python_wrote = True
        return self._stream.write(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __setattr__(self, name, value):
        setattr(self._stream, name, value)


def install(log_level):
    """Called once by the proc's main, before any user code."""
    for stream in (sys.stdout, sys.stderr):
        # PYTHONUNBUFFERED makes print() one write(2) per piece ("chatter", " ", "0", "\n"); a
        # proc stalled between pieces then shows a line cut in two. Line buffering writes each
        # line whole, at once; partial lines still go out at flush() and at every marker.
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except (AttributeError, ValueError):
            pass
    sys.stdout = _TrackedStream(sys.stdout)
    sys.stderr = _TrackedStream(sys.stderr)
    root = logging.getLogger()
    if not root.handlers:
        # Actors' logging.info() reaches the notebook as Monarch's procs do (level: logging_option).
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    set_log_level(log_level)
    _core.output_tracking_enable()


def set_log_level(level):
    logging.getLogger().setLevel(int(level))


def _flush_python():
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass


def begin(cell, actor):
    """A call starts: the bytes that follow belong to it. Returns a token for end()."""
    if _python_wrote:
        _flush_python()  # what came before belongs to the previous context
    return _core.output_begin(cell or "", actor)


def end(token):
    """A call ends: the seq of the marker written after its output, or 0 if it wrote nothing."""
    global _python_wrote
    wrote = _python_wrote
    if wrote:
        _flush_python()
        _python_wrote = False
    return _core.output_end(token, wrote)


def flush_marker():
    """A marker now (the controller's barrier at the end of a cell): its seq."""
    global _python_wrote
    _flush_python()
    _python_wrote = False
    return _core.output_mark_now()
