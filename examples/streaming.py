"""stream(): results as they arrive, fastest rank first."""
import time

from monarch.actor import Actor, current_rank, endpoint, this_host


class Worker(Actor):
    @endpoint
    def work(self, base):
        rank = current_rank().rank
        time.sleep(0.4 * (3 - rank))  # higher ranks finish first
        return rank * base


procs = this_host().spawn_procs({"gpus": 4})
workers = procs.spawn("workers", Worker)
arrivals = []
for reply in workers.work.stream(10):  # a Future per reply, in arrival order
    value = reply.get()
    arrivals.append(value)
    print("arrived:", value)
print("arrival order:", arrivals)
print("first to arrive:", arrivals[0])
print("sum:", sum(arrivals))
