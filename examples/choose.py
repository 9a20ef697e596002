"""choose(): send each request to one actor of the mesh (load balancing)."""
from collections import Counter as Tally

from monarch.actor import Actor, current_rank, endpoint, this_host


class Server(Actor):
    def __init__(self):
        self.served = 0

    @endpoint
    def handle(self, request):
        self.served += 1
        return current_rank().rank, request.upper()

    @endpoint
    def served_count(self):
        return self.served


procs = this_host().spawn_procs({"gpus": 3})
servers = procs.spawn("servers", Server)
answers = [servers.handle.choose(f"req{i}").get() for i in range(9)]
print("answers:", [a[1] for a in answers])
print("ranks used:", sorted(Tally(a[0] for a in answers).items()))
print("total served:", sum(servers.served_count.call().get().values()))
