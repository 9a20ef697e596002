"""Supervision: a proc that dies fails the calls on it with an error naming rank and cause;
the other ranks keep working."""
import os

from monarch.actor import Actor, ActorError, current_rank, endpoint, this_host


class Fragile(Actor):
    @endpoint
    def crash_if(self, rank_to_die):
        if current_rank().rank == rank_to_die:
            os._exit(7)
        return current_rank().rank


procs = this_host().spawn_procs({"gpus": 4})
actors = procs.spawn("fragile", Fragile)
try:
    actors.crash_if.call(2).get()
except ActorError as e:
    print(f"supervision error from rank {e.rank} {e.coords}: {e}")
survivors = actors.slice(gpus=slice(0, 2))
print("survivors answer:", list(survivors.crash_if.call(-1).get().values()))
try:
    actors.slice(gpus=2).crash_if.call_one(-1).get()
except ActorError as e:
    print("the dead rank stays dead:", type(e).__name__)
