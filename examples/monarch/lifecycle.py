"""An actor's life in Monarch: __init__ of an async actor runs where its endpoints run (its
thread-local state is there), str(current_rank()), a failing __init__ reaching the fault hook
without any call, abort(reason), an explicit-port endpoint that raises instead of answering,
and on stop: concurrent calls cancelled before __cleanup__ runs."""
import asyncio
import os
import tempfile
import threading
import time

import monarch.actor
from monarch.actor import Actor, Port, concurrent_endpoint, context, current_rank, endpoint, this_host

failures: list = []
monarch.actor.unhandled_fault_hook = failures.append


class Local(Actor):
    def __init__(self) -> None:
        self.tls = threading.local()
        self.tls.value = "set in __init__"

    @endpoint
    async def read(self) -> str:
        return self.tls.value

    @endpoint
    async def rank(self) -> str:
        return str(current_rank())


class NoStart(Actor):
    def __init__(self) -> None:
        raise ValueError("cannot start")

    @endpoint
    def ok(self) -> None:
        pass


class Quitter(Actor):
    @endpoint
    def quit(self, reason: str) -> None:
        context().actor_instance.abort(reason)

    @endpoint(explicit_response_port=True)
    def by_port(self, port: Port[str]) -> None:
        raise ValueError("raised instead of answering")


class Holder(Actor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.gate = asyncio.Event()

    @concurrent_endpoint(explicit_response_port=True)
    async def hold(self, port: Port[str]) -> None:
        port.send("holding")
        try:
            await self.gate.wait()
        finally:
            with open(self.path, "a") as f:
                f.write("call ended\n")

    async def __cleanup__(self, exc) -> None:
        with open(self.path, "a") as f:
            f.write("cleanup\n")


procs = this_host().spawn_procs(per_host={"hosts": 1, "gpus": 2})
local = procs.spawn("local", Local)
print("__init__ ran on the endpoints' thread:", local.slice(gpus=0).read.call_one().get())
print("ranks:", sorted(local.rank.call().get().values()))

# (Monarch spawns no more actors on a proc mesh that had a failure: each part has procs of its own.)
nostart_procs = this_host().spawn_procs(per_host={"gpus": 2})
nostart_procs.spawn("nostart", NoStart)
deadline = time.monotonic() + 60


def heard(name: str) -> list:
    return [f for f in failures if f.mesh_name.split("-")[0] == name]  # Monarch's names carry a suffix


while len(heard("nostart")) < 2 and time.monotonic() < deadline:
    time.sleep(0.1)
print("a failing __init__ reached the hook per rank:", len(heard("nostart")),
      "cannot start" in heard("nostart")[0].report())

quitter = this_host().spawn_procs(per_host={"gpus": 1}).spawn("quitter", Quitter)
quitter.quit.call_one("enough for today").get()
while not heard("quitter") and time.monotonic() < deadline:
    time.sleep(0.1)
print("abort reached the hook with its reason:", "enough for today" in heard("quitter")[0].report())
ports = this_host().spawn_procs(per_host={"gpus": 1}).spawn("ports", Quitter)
try:
    ports.by_port.call_one().get()
except RuntimeError as e:
    print("raising instead of answering ends the actor:", type(e).__name__)

path = os.path.join(tempfile.mkdtemp(), "order.txt")
holder = this_host().spawn_procs(per_host={"gpus": 1}).spawn("holder", Holder, path)
print("concurrent call:", holder.hold.call_one().get())
holder.stop().get()
while (not os.path.exists(path) or open(path).read().count("\n") < 2) and time.monotonic() < deadline:
    time.sleep(0.1)
print("on stop:", open(path).read().split("\n")[:2])
procs.stop().get()
