"""Monarch's getting-started shape: a Counter actor on a mesh of 4, typed futures, broadcast,
call_one on a slice, call over the mesh and its ValueMesh."""
from monarch.actor import Actor, Future, ValueMesh, endpoint, this_host


class Counter(Actor):
    def __init__(self, initial_value: int) -> None:
        self.value = initial_value

    @endpoint
    def increment(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value


procs = this_host().spawn_procs(per_host={"gpus": 4})
counters = procs.spawn("counters", Counter, 10)
counters.increment.broadcast()
counters.slice(gpus=slice(0, 2)).increment.call().get()
fut: Future[int] = counters.slice(gpus=0).get_value.call_one()
print("rank 0 holds", fut.get())
values: ValueMesh[int] = counters.get_value.call().get()
print("values:", values.values())
print("items:", [(dict(point), value) for point, value in values.items()])
print("sizes:", dict(counters.extent), "len:", len(values))
procs.stop().get()
