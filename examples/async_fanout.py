"""Async endpoints and asyncio.gather over several meshes and futures."""
import asyncio

from monarch.actor import Actor, context, endpoint, proc_mesh


class Sleeper(Actor):
    @endpoint
    async def nap(self, seconds):
        await asyncio.sleep(seconds)
        return context().actor_instance.rank.rank  # which actor (current_rank() is the message's point)


async def main():
    mesh = proc_mesh(gpus=4)
    sleepers = await mesh.spawn("sleepers", Sleeper)
    results = await asyncio.gather(*(sleepers.slice(gpus=i).nap.call_one(0.1) for i in range(4)))
    print("gathered:", results)
    whole = await sleepers.nap.call(0.05)
    print("call:", list(whole.values()))


asyncio.run(main())
