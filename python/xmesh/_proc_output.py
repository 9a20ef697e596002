"""A proc's side of output attribution (DESIGN §6, runtime/output_marker.hpp).

The host agent reads the proc's fds 1 and 2. So that it knows which call (notebook cell) and
actor the bytes belong to, the proc writes an in-band marker whenever that changes, and at the
end of a call that wrote anything; the marker's seq travels back in the reply (body "m") and
makes the controller's flush barrier. Calls that wrote nothing cost nothing: no marker, no wait.
"Wrote anything": Python wrote through sys.stdout / sys.stderr, or the process's write(2)
byte count moved during the call (C-level writes, children it waited for), or bytes are still
in the pipes (children still running)."""
import logging
import sys
import threading

from . import _core

enabled = False
_lock = threading.Lock()
_active = []              # (token, cell, actor) of the calls running now, oldest first
_written = ("", "")       # the context the host agent was last told
_dirty = False            # Python wrote to stdout/stderr since the last marker
_next_token = 0
_written_at_begin = {}    # token -> the process's write(2) byte count when the call began


class _TrackedStream:
    """sys.stdout / sys.stderr of a proc: notes that something was written, delegates the rest."""

    def __init__(self, stream):
        object.__setattr__(self, "_stream", stream)

    def write(self, text):
        global _dirty
        _dirty = True
        return self._stream.write(text)

    def writelines(self, lines):
        global _dirty
        _dirty = True
        return self._stream.writelines(lines)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __setattr__(self, name, value):
        setattr(self._stream, name, value)


def install(log_level):
    """Called once by the proc's main, before any user code."""
    global enabled
    sys.stdout = _TrackedStream(sys.stdout)
    sys.stderr = _TrackedStream(sys.stderr)
    root = logging.getLogger()
    if not root.handlers:
        # Actors' logging.info() reaches the notebook as Monarch's procs do (level: logging_option).
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    set_log_level(log_level)
    enabled = True


def set_log_level(level):
    logging.getLogger().setLevel(int(level))


def _flush_python():
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass


def _effective():
    return (_active[-1][1], _active[-1][2]) if _active else _written


def _mark_locked(ctx):
    global _written, _dirty
    _flush_python()
    _dirty = False
    _written = ctx
    return _core.write_output_marker(ctx[0], ctx[1])


def begin(cell, actor):
    """A call starts: the bytes that follow belong to it. Returns a token for end()."""
    global _next_token
    if not enabled:
        return None
    with _lock:
        _next_token += 1
        token = _next_token
        _active.append((token, cell or "", actor))
        ctx = _effective()
        if ctx != _written:
            _mark_locked(ctx)
        _written_at_begin[token] = _core.written_bytes()
    return token


def end(token):
    """A call ends: returns the seq of a marker written after its output, or 0 when it wrote
    nothing (no barrier needed). Output after this, from threads it left behind, still goes
    to its cell until another call starts."""
    if token is None:
        return 0
    with _lock:
        for i, entry in enumerate(_active):
            if entry[0] == token:
                del _active[i]
                break
        _flush_python()
        wrote = _core.written_bytes() != _written_at_begin.pop(token, -1)
        if _dirty or wrote or _core.output_pending() or _effective() != _written:
            return _mark_locked(_effective())
    return 0


def flush_marker():
    """A marker now (the controller's barrier at the end of a cell): its seq."""
    if not enabled:
        return 0
    with _lock:
        return _mark_locked(_effective())
