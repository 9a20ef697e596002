"""`%xmesh` in the kernel: this kernel's meshes as a table (text and HTML), each with its ranks
counted by state as the panel shows them: a call left running keeps one rank "in a call" and
names its endpoint; a bad argument is an error naming it."""

NAP = '''
import time, xmesh

class Napper(xmesh.Actor):
    @xmesh.endpoint
    def nap(self, seconds: float) -> int:
        if xmesh.current_rank().rank == 1:
            time.sleep(seconds)
        return xmesh.current_rank().rank

procs = xmesh.this_host().spawn_procs({"gpus": 4}, name="napping")
nappers = procs.spawn("nappers", Napper)
nappers.initialized.get()
'''


def test_xmesh_magic_shows_the_kernel_s_meshes_by_rank_state(kernel):
    assert kernel.value("%xmesh") == "no meshes in this kernel"
    kernel.ok(NAP, timeout=90)
    kernel.ok("running = nappers.nap.call(30)")  # left running: rank 1 is in it
    # The other ranks answer at once, but not before the next cell can run: wait for them.
    kernel.ok("import time\n_t = time.monotonic()\n"
              "while running.pending_ranks() != [1] and time.monotonic() - _t < 30:\n    time.sleep(0.02)")
    r = kernel.ok("%xmesh")
    lines = r.text.splitlines()
    assert lines[0].split() == ["Name", "Shape", "Hosts", "Idle", "In", "a", "call", "Stopped", "Dead", "Busy", "in"]
    assert lines[1].split() == ["napping", "gpus=4", "1", "3", "1", "0", "0", "nap"], r.text
    html = r.data[-1]["text/html"]
    assert "1 mesh in this kernel" in html and "<td style=\"text-align: left\">napping</td>" in html
    r = kernel.run("%xmesh everything")
    assert r.status == "error" and "%xmesh takes no argument" in r.error["evalue"]
    kernel.ok("running.cancel()")
