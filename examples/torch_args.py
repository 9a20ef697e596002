"""64 MiB torch tensors as arguments and results (CPU torch from Debian)."""
import torch

from monarch.actor import Actor, endpoint, this_host


class TensorWorker(Actor):
    @endpoint
    def norm(self, t):
        return float(t.float().norm()), tuple(t.shape), str(t.dtype)

    @endpoint
    def double(self, t):
        return t * 2


procs = this_host().spawn_procs({"gpus": 2})
workers = procs.spawn("tensors", TensorWorker)
t = torch.ones(4096, 4096)  # 64 MiB of float32
for point, (norm, shape, dtype) in workers.norm.call(t).get().items():
    print(f"rank {point.rank}: norm={norm:.0f} shape={shape} dtype={dtype}")
doubled = workers.slice(gpus=0).double.call_one(t).get()
print("doubled:", type(doubled).__name__, tuple(doubled.shape), float(doubled[0, 0]), float(doubled.sum()))
