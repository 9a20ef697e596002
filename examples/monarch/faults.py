"""A failure nobody waits for (a broadcast whose endpoint raised) reaches the fault hook the
program installed, and the program goes on."""
import time

import monarch.actor
from monarch.actor import Actor, MeshFailure, endpoint, this_host

seen: list = []


def remember(failure: MeshFailure) -> None:
    seen.append(failure)


monarch.actor.unhandled_fault_hook = remember


class Fragile(Actor):
    @endpoint
    def explode(self) -> None:
        raise RuntimeError("nobody waits for this")


procs = this_host().spawn_procs(per_host={"gpus": 2})
fragile = procs.spawn("fragile", Fragile)
fragile.slice(gpus=1).explode.broadcast()
deadline = time.monotonic() + 60
while not seen and time.monotonic() < deadline:
    time.sleep(0.05)
print("hook got a MeshFailure:", bool(seen) and isinstance(seen[0], MeshFailure))
print("its report names the error:", "nobody waits for this" in seen[0].report())
print("the program goes on")
