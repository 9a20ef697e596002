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
