"""Named dimensions: slice keeps or drops a dimension; split, flatten and rename reshape."""
from monarch.actor import Actor, context, current_rank, endpoint, this_host


class Where(Actor):
    @endpoint
    def where(self):
        # Which actor answered: its rank in the mesh it was spawned as. (current_rank() is the
        # message's point: its rank within the slice that was called.)
        return context().actor_instance.rank.rank

    @endpoint
    def point_in_call(self):
        return current_rank().rank, current_rank().extent.nelements


procs = this_host().spawn_procs({"gpus": 8})
mesh = procs.spawn("where", Where)
print("all:", list(mesh.where.call().get().values()))
print("first half:", list(mesh.slice(gpus=slice(0, 4)).where.call().get().values()))
print("every other:", list(mesh.slice(gpus=slice(0, 8, 2)).where.call().get().values()))
grid = mesh.split(gpus=("dp", "tp"), tp=2)
print("grid sizes:", grid.sizes)
print("tp=1 column:", list(grid.slice(tp=1).where.call().get().values()))
print("dp=2 row:", list(grid.slice(dp=2).where.call().get().values()))
print("tp=1 column, as each actor sees the call:", list(grid.slice(tp=1).point_in_call.call().get().values()))
flat = grid.rename(dp="replica").flatten("all")
print("renamed+flattened:", flat.sizes, list(flat.slice(all=slice(5, 8)).where.call().get().values()))
try:
    mesh.slice(hosts=0)
except TypeError as e:
    print("TypeError:", e)
try:
    mesh.slice(gpus=8)
except IndexError as e:
    print("IndexError:", e)
