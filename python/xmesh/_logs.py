"""The controller's remote output: the C++ LogRouter (runtime/log_router.hpp) turns the host
agents' Log messages into display chunks tagged with their cell; this module delivers them.

A script prints them on its stdout/stderr from a thread of its own; the kernel installs a sink
that sends each chunk to the cell it belongs to (_kernel). Delivery happens under one lock, so
the flush barrier (`barrier`) can guarantee that every chunk produced before it has been
delivered when it returns: a chunk taken from the router is always delivered before the lock
is released."""
import sys
import threading
import time

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
