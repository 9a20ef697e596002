"""Two actor meshes; the ping mesh holds a handle to the pong mesh and calls it directly,
proc to proc (Monarch's ping-pong example)."""
import asyncio

from monarch.actor import Actor, current_rank, endpoint, proc_mesh


class PingPongActor(Actor):
    def __init__(self):
        self.name = "ping" if current_rank().rank == 0 else "pong"
        self.rank = current_rank().rank
        self.count = 0

    @endpoint
    async def send(self, other, rounds):
        for _ in range(rounds):
            reply = await other.recv.call(f"hello from {self.rank}")
            self.count += 1
        return [v for v in reply.values()]

    @endpoint
    async def recv(self, msg):
        self.count += 1
        return f"{msg} -> answered by {self.rank}"

    @endpoint
    async def count_messages(self):
        return self.count


async def main():
    mesh_a = proc_mesh(gpus=2)
    mesh_b = proc_mesh(gpus=2)
    ping = await mesh_a.spawn("ping", PingPongActor)
    pong = await mesh_b.spawn("pong", PingPongActor)
    result = await ping.send.call(pong, 10)
    for point, value in result.items():
        print(f"ping {point.rank}: {value}")
    counts = await pong.count_messages.call()
    print("pong received:", list(counts.values()))


asyncio.run(main())
