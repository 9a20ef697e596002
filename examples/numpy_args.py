"""64 MiB numpy arrays as arguments and results (sent without copying into the pickle)."""
import numpy as np

from monarch.actor import Actor, context, endpoint, this_host


class Reducer(Actor):
    @endpoint
    def scale_and_sum(self, array, factor):
        return float((array * factor).sum()), array.nbytes

    @endpoint
    def make(self, n):
        return np.full(n, context().actor_instance.rank.rank, dtype=np.float32)  # which actor made it


procs = this_host().spawn_procs({"gpus": 2})
reducers = procs.spawn("reducers", Reducer)
big = np.ones(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB
sums = reducers.scale_and_sum.call(big, 2.0).get()
for point, (total, nbytes) in sums.items():
    print(f"rank {point.rank}: sum={total:.0f} over {nbytes // (1 << 20)} MiB")
back = reducers.slice(gpus=1).make.call_one(16 * 1024 * 1024).get()
print("received", back.nbytes // (1 << 20), "MiB of", back.dtype, "filled with", back[0])
