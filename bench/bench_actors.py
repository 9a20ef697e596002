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
