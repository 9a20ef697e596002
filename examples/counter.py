"""Monarch's getting-started Counter: state in actors, call_one, call, broadcast."""
from monarch.actor import Actor, endpoint, this_host


class Counter(Actor):
    def __init__(self, initial_value: int):
        self.value = initial_value

    @endpoint
    def incr(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value


procs = this_host().spawn_procs({"gpus": 4})
counters = procs.spawn("counters", Counter, 0)
counters.slice(gpus=0).incr.call_one().get()
counters.incr.broadcast()
counters.incr.call().get()
print("values:", list(counters.get_value.call().get().values()))
