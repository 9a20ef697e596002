"""Actors used by the benchmarks (importable by the procs)."""
import os
import time

from xmesh import Actor, endpoint


class Noop(Actor):
    @endpoint
    def noop(self):
        return None

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def busy(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass


# ---- output (log_bench.py) ---------------------------------------------------------------------
def flood_lines(n, mode):
    """Writes n numbered lines to stdout as fast as it can; returns the seconds it took.
    mode "print": one print() per line, as user code does; "block": 1000 lines per write, so
    that the forwarding path rather than Python's print is what is measured."""
    import sys

    t0 = time.perf_counter()
    if mode == "print":
        for i in range(n):
            print(f"step {i} loss {1.0 / (i + 1):.6f}")
    else:
        for start in range(0, n, 1000):
            sys.stdout.write("".join(f"step {i} loss {1.0 / (i + 1):.6f}\n"
                                     for i in range(start, min(n, start + 1000))))
    sys.stdout.flush()
    return time.perf_counter() - t0


def stamped_lines(k, gap):
    """Prints k lines, each carrying the wall-clock time it was printed at, gap seconds apart."""
    for i in range(k):
        print(f"@{time.time():.6f} {i}")
        time.sleep(gap)


class LogFlood(Actor):
    @endpoint
    def flood(self, n, mode):
        return flood_lines(n, mode)

    @endpoint
    def stamped(self, k, gap):
        stamped_lines(k, gap)


# ---- the debugger (debug_bench.py) ------------------------------------------------------------------
class DebugTarget(Actor):
    @endpoint
    def noop(self):
        return None

    @endpoint
    def spin_until(self, path):
        """Spins in Python until the file `path` exists (what an attach stops)."""
        looks = 0
        while not os.path.exists(path):
            looks += 1
        return looks

    @endpoint
    def stop_here(self):
        x = 1
        breakpoint()  # xmesh's remote pdb: one message each way per command
        return x

    @endpoint
    def stop_with_rpc_per_write(self, sessions):
        """The same stop through the design Monarch uses: a plain pdb whose every write is a
        blocking call to a session actor in the controller and whose every read is a call that
        returns the next command. sessions: one SimDebugSession mesh per rank."""
        import pdb
        import sys

        from xmesh import current_rank

        session = sessions[current_rank().rank]
        session.start.call_one().get()
        debugger = pdb.Pdb(stdin=_RpcStdin(session), stdout=_RpcStdout(session), nosigint=True, readrc=False)
        x = 1
        debugger.set_trace(sys._getframe())
        return x


class _RpcStdout:
    def __init__(self, session):
        self.session = session

    def write(self, text):
        self.session.write.call_one(text).get()
        return len(text)

    def flush(self):
        pass


class _RpcStdin:
    def __init__(self, session):
        self.session = session

    def readline(self):
        return self.session.read.call_one().get() + "\n"


SIM_SESSIONS = {}  # key -> SimDebugSession living in the benchmark's own process


class SimDebugSession(Actor):
    """The controller end of one rank's simulated session (spawned on the benchmark's own proc,
    one actor per rank so that one rank's pending read does not hold up another's writes)."""

    def __init__(self, key):
        import queue
        import threading

        self.cond = threading.Condition()
        self.commands = queue.Queue()
        self.out = []
        self.started = self.reading = False
        SIM_SESSIONS[key] = self

    @endpoint
    def start(self):
        with self.cond:
            self.started = True
            self.cond.notify_all()

    @endpoint
    def write(self, text):
        with self.cond:
            self.out.append(text)

    @endpoint
    def read(self):
        with self.cond:
            self.reading = True
            self.cond.notify_all()
        cmd = self.commands.get()
        return cmd

    # the benchmark's side (its main thread)
    def send(self, cmd):
        with self.cond:
            self.reading = False
            self.out.clear()
        self.commands.put(cmd)

    def wait_reading(self, timeout=30.0):
        with self.cond:
            if not self.cond.wait_for(lambda: self.reading, timeout):
                raise TimeoutError("a simulated pdb session did not ask for its next command")
            return "".join(self.out)
