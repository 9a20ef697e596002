"""xmesh quickstart: procs on this host, actors on them, calls, slicing, an actor error.

Run: /usr/bin/python3 examples/quickstart.py
"""
from xmesh import ActorError, Actor, current_rank, endpoint, this_host


class Trainer(Actor):
    def __init__(self, lr):
        self.lr = lr
        self.steps = 0
        self.rank = current_rank().rank

    @endpoint
    def step(self, batch):
        self.steps += 1
        print(f"rank {self.rank} step {self.steps} on batch {batch}")
        return {"rank": self.rank, "loss": round(1.0 / (self.steps + self.rank + 1), 4)}

    @endpoint
    def steps_done(self):
        return self.steps

    @endpoint
    def whoami(self):
        return self.rank

    @endpoint
    def explode(self):
        raise RuntimeError(f"rank {self.rank} ran out of patience")


def main():
    procs = this_host().spawn_procs({"hosts": 2, "gpus": 4})
    print(f"spawned {procs}")
    trainers = procs.spawn("trainers", Trainer, lr=0.1)
    trainers.initialized.get()
    print("every __init__ ran")

    losses = trainers.step.call(batch=0).get()
    print("losses after one step:")
    print(losses)

    first_host = trainers.slice(hosts=0)
    first_host.step.call(batch=1).get()
    print("steps per rank:", list(trainers.steps_done.call().get().values()))

    even_gpus = trainers.slice(gpus=slice(0, 4, 2))
    print("even gpus:", even_gpus.sizes, "are ranks", list(even_gpus.whoami.call().get().values()))
    flat = trainers.flatten("rank")
    print("one actor:", flat.slice(rank=5).steps_done.call_one().get())

    try:
        trainers.slice(hosts=1, gpus=3).explode.call_one().get()
    except ActorError as e:
        print(f"caught an actor error from rank {e.rank} {e.coords}: {e.exception}")
    print("the actor still serves:", trainers.slice(hosts=1, gpus=3).steps_done.call_one().get())
    procs.stop()
    print("done")


if __name__ == "__main__":
    main()
