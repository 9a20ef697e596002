"""Channels and ports: a port passed to actors streams values back; an endpoint with an explicit
response port answers later; send() answers to a ranked port with each message's rank."""
import asyncio

from monarch.actor import Actor, Channel, Port, context, endpoint, send, this_host


class Producer(Actor):
    def __init__(self) -> None:
        self.waiting: list = []

    @endpoint
    def produce(self, port: Port[str], n: int) -> None:
        rank = context().actor_instance.rank.rank
        for i in range(n):
            port.send(f"item {i} from {rank}")

    @endpoint(explicit_response_port=True)
    def deferred(self, port: Port[int], x: int) -> None:
        self.waiting.append((port, x))

    @endpoint
    def flush(self) -> int:
        for port, x in self.waiting:
            port.send(x * 2)
        n, self.waiting = len(self.waiting), []
        return n

    @endpoint
    def square(self, x: int) -> int:
        return x * x + context().actor_instance.rank.rank


async def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    producers = procs.spawn("producers", Producer)
    port, receiver = Channel.open()
    producers.produce.broadcast(port, 2)
    items = [await receiver.recv() for _ in range(6)]
    print("received:", sorted(items))
    later = producers.slice(gpus=1).deferred.call_one(21)
    print("flushed:", await producers.slice(gpus=1).flush.call_one())
    print("deferred answer:", await later)
    ranked_port, ranked = Channel.open_ranked()
    send(producers.slice(gpus=slice(1, 3)).square, (3,), {}, port=ranked_port)
    print("ranked:", sorted([await ranked.recv() for _ in range(2)]))
    await procs.stop()


asyncio.run(main())
