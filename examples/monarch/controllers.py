"""get_or_spawn_controller: one actor per name for the whole program, found again by name from
the client and from every actor."""
from monarch.actor import Actor, endpoint, get_or_spawn_controller, this_host


class Registry(Actor):
    def __init__(self) -> None:
        self.names: list = []

    @endpoint
    def register(self, name: str) -> int:
        self.names.append(name)
        return len(self.names)

    @endpoint
    def registered(self) -> list:
        return sorted(self.names)


class Worker(Actor):
    @endpoint
    def join(self, name: str) -> int:
        registry = get_or_spawn_controller("registry", Registry).get()
        return registry.register.call_one(name).get()


registry = get_or_spawn_controller("registry", Registry).get()
registry.register.call_one("client").get()
procs = this_host().spawn_procs(per_host={"gpus": 3})
workers = procs.spawn("workers", Worker)
print("counts seen by workers:", sorted(workers.join.call("worker").get().values()))
again = get_or_spawn_controller("registry", Registry).get()
print("registered:", again.registered.call_one().get())
procs.stop().get()
