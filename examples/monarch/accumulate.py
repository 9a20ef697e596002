"""Accumulator folds one broadcast's replies; returns_future turns a coroutine into a Future;
as_endpoint calls a plain method through the mesh."""
from monarch.actor import Accumulator, Actor, as_endpoint, context, endpoint, returns_future, this_host


class Shard(Actor):
    def __init__(self) -> None:
        self.rank = context().actor_instance.rank.rank

    @endpoint
    def partial_sum(self, scale: int) -> int:
        return (self.rank + 1) * scale

    def describe(self) -> str:  # not an endpoint
        return f"shard {self.rank}"


@returns_future
async def total(shards, scale: int) -> int:
    values = await shards.partial_sum.call(scale)
    return sum(values.values())


procs = this_host().spawn_procs(per_host={"gpus": 4})
shards = procs.spawn("shards", Shard)
summed = Accumulator(shards.partial_sum, 0, lambda acc, value: acc + value)
print("accumulated:", summed.accumulate(10).get())
print("returns_future:", total(shards, 2).get())
print("as_endpoint:", as_endpoint(shards.describe).call().get().values())
procs.stop().get()
