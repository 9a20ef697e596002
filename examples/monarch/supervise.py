"""Monarch's __supervise__: the actor that spawned a mesh hears of its failures. Returning True
handles them (the program's fault hook hears nothing); an owner that does not handle them fails
in turn, and its own owner (here the program) hears of it."""
import time

import monarch.actor
from monarch.actor import Actor, ProcMesh, endpoint, this_host

failures: list = []
monarch.actor.unhandled_fault_hook = failures.append


class Child(Actor):
    @endpoint
    def fail(self) -> None:
        raise ValueError("the child failed")


class Owner(Actor):
    def __init__(self, procs: ProcMesh, handle: bool) -> None:
        self.children = procs.spawn("children", Child)
        self.handle = handle
        self.seen: list = []

    @endpoint
    def break_children(self) -> None:
        self.children.fail.broadcast()

    @endpoint
    def seen_failures(self) -> int:
        return len(self.seen)

    def __supervise__(self, failure) -> bool:
        self.seen.append(failure.report())
        return self.handle


owners = this_host().spawn_procs(per_host={"gpus": 1})
workers = this_host().spawn_procs(per_host={"gpus": 2})
careful = owners.spawn("careful", Owner, workers, True)
careful.break_children.call_one().get()
deadline = time.monotonic() + 60
while careful.seen_failures.call_one().get() < 2 and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(1)
print("a handling owner saw both ranks fail:", careful.seen_failures.call_one().get())
print("the program heard nothing:", failures == [])

# (Monarch spawns no more actors on a proc mesh that had a failure: new procs for the next owner.)
owners2, workers2 = this_host().spawn_procs(per_host={"gpus": 1}), this_host().spawn_procs(per_host={"gpus": 2})
careless = owners2.spawn("careless", Owner, workers2, False)
careless.break_children.call_one().get()


def heard_of_careless() -> bool:
    return any(f.mesh_name.split("-")[0] == "careless" for f in failures)  # Monarch's names carry a suffix


while not heard_of_careless() and time.monotonic() < deadline:
    time.sleep(0.1)
print("the program heard of the owner:", heard_of_careless())
try:
    careless.seen_failures.call_one().get()
except RuntimeError as e:
    print("the owner failed in turn:", type(e).__name__)
