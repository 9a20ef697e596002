"""current_rank() is the message's point in the mesh or slice it was sent to;
context().actor_instance.rank is the actor's own. Point and Extent as Monarch has them."""
from monarch.actor import Actor, Extent, Point, context, current_rank, current_size, endpoint, this_host


class Where(Actor):
    @endpoint
    def where(self) -> tuple:
        me = context().actor_instance.rank
        msg = current_rank()
        return me.rank, dict(me), msg.rank, dict(msg), current_size()


procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 3})
mesh = procs.spawn("where", Where)
for name, view in (("whole", mesh), ("gpus 1..2", mesh.slice(gpus=slice(1, 3))), ("host 1", mesh.slice(hosts=1))):
    print(name)
    for actor_rank, actor_point, message_rank, message_point, size in view.where.call().get().values():
        print(f"  actor {actor_rank} {actor_point} got message rank {message_rank} {message_point} of {size}")
one = mesh.slice(hosts=1, gpus=2).where.call_one().get()
print("one actor:", one)
p = Point(4, Extent(["hosts", "gpus"], [2, 3]))
print("point:", p.rank, dict(p), p.extent.nelements, p.size("gpus"))
procs.stop().get()
