import asyncio
from monarch.actor import Actor, current_rank, endpoint, proc_mesh
class ToyActor(Actor):
    def __init__(self):
        self.rank = current_rank().rank
    @endpoint
    async def hello_world(self, msg):
        print(f"Identity: {self.rank}, {msg=}")
async def main():
    mesh = proc_mesh(gpus=4)
    toy = await mesh.spawn("toy_actor", ToyActor)
    await toy.hello_world.call("hey there, from script!!")
asyncio.run(main())
