"""A SLURM job from a notebook (issue 21): submitted from a cell with progress there, its
time-limit notice in the cell, found again by the restarted kernel (same job id, same named
procs), a changed spec asked about in the cell's input box, released from a cell. The cluster
is tests/python/slurm_cluster.py's (munged, slurmctld, a slurmd in each of two namespace hosts);
the kernel runs in a notebook directory of its own, whose `.xmesh/` keeps the job."""
import ast
import os

import pytest
from kernel_session import KernelSession
from netns_hosts import NetnsHosts
from netns_hosts import unavailable as netns_unavailable
from slurm_cluster import SlurmCluster
from slurm_cluster import unavailable as slurm_unavailable
from xmesh_testing import private_tmpdir

WHY_NOT = netns_unavailable() or slurm_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"a SLURM cluster cannot run here: {WHY_NOT}")

WHERE = '''
import os, socket, xmesh
class Where(xmesh.Actor):
    @xmesh.endpoint
    def where(self):
        return (socket.gethostname(), os.getpid())
'''
SUBMIT = WHERE + '''
job = xmesh.SlurmJob(nodes=2, name="nb", time="10", timeout=90)
procs = job.host_mesh.spawn_procs({"gpus": 1}, name="nb-procs")
print("FIRST", job.job_id, sorted(procs.spawn("w", Where).where.call().get().values()))
'''
REATTACH = WHERE + '''
job = xmesh.SlurmJob(nodes=2, name="nb", time="10", timeout=90)
procs = xmesh.attach("nb-procs", hosts=job.host_mesh)
print("AGAIN", job.job_id, sorted(procs.spawn("w2", Where).where.call().get().values()))
'''


@pytest.fixture(scope="module")
def slurm():
    with NetnsHosts(2) as net, SlurmCluster(net, private_tmpdir("xmesh-kslurm-")) as cluster:
        yield cluster


@pytest.fixture
def notebook_kernel(slurm, kernel_rundir):
    notebook_dir = private_tmpdir("xmesh-notebook-")
    env = {"SLURM_CONF": slurm.conf, "XMESH_JOB_POLL_S": "0.5", "XMESH_JOB_NOTICE_S": "900"}
    k = KernelSession(kernel_rundir, env=env, cwd=notebook_dir)
    k.notebook_dir = notebook_dir
    yield k
    k.close()
    for name in ("nb",):
        slurm.run("scancel", "--name", f"xmesh-{name}", check=False)


def _printed(result, tag):
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith(tag + " ")]
    job_id, rest = line[len(tag) + 1:].split(" ", 1)
    return job_id, ast.literal_eval(rest)


def test_a_job_from_a_cell_survives_a_kernel_restart_and_a_changed_spec_is_asked_about(notebook_kernel, slurm):
    k = notebook_kernel
    submit = k.send(SUBMIT)
    first = k.collect(submit, timeout=100)
    assert first.status == "ok", first.error_text
    job_id, where = _printed(first, "FIRST")
    assert f"xmesh: submitted SLURM job {job_id} (nb: 2 nodes)" in first.stdout
    assert "2/2 host agents up" in first.stdout
    assert [h for h, _ in where] == ["node-a", "node-b"]
    assert os.path.exists(os.path.join(k.notebook_dir, ".xmesh", "jobs", "nb.json"))  # the notebook's directory
    # The time limit (10 min, within XMESH_JOB_NOTICE_S) is announced in the cell that started the job.
    said = f"SLURM job {job_id} (nb) reaches its time limit in 10 min"
    if said not in first.stderr:  # or it comes after the cell ended, as that cell's late output
        late = k.iopub_until(lambda m: "reaches its time limit" in str(m["content"]), timeout=30)[-1]
        assert late["parent_header"]["msg_id"] == submit
        assert said in str(late["content"])

    k.restart()
    again = k.ok(REATTACH, timeout=100)
    again_id, again_where = _printed(again, "AGAIN")
    assert again_id == job_id and sorted(p for _, p in again_where) == sorted(p for _, p in where)
    assert f"xmesh: using SLURM job {job_id}" in again.stdout and "submitted" not in again.stdout

    # Another spec under the same name: asked in the cell; "n" keeps the running job.
    ask = k.converse('xmesh.SlurmJob(nodes=1, name="nb", time="10").host_mesh')
    prompt, _ = ask.expect_prompt(timeout=60)
    assert f"SLURM job {job_id} (nb) still runs with another spec (nodes: 2 there, 1 here)" in prompt
    assert prompt.rstrip().endswith("[y/N]")
    ask.answer("n")
    kept = ask.finish(timeout=60)
    assert kept.status == "error" and kept.error["ename"] == "JobError"
    assert "kept (not replaced: answered 'n')" in kept.error["evalue"]
    assert slurm.run("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip() == "RUNNING"
    # Where the request allows no input (nbclient, `xmesh run`), nobody is asked: refused, kept.
    r = k.run('xmesh.SlurmJob(nodes=1, name="nb", time="10").host_mesh', timeout=60)
    assert r.status == "error" and "pass replace=True" in r.error["evalue"]
    # "y" releases it and submits the new spec.
    ask = k.converse('job = xmesh.SlurmJob(nodes=1, name="nb", time="10", timeout=90)\n'
                     'print("NEW", job.job_id, job.host_mesh.sizes)')
    ask.expect_prompt(timeout=60)
    ask.answer("y")
    replaced = ask.finish(timeout=100)
    assert replaced.status == "ok", replaced.error_text
    assert f"releasing SLURM job {job_id} (nb)" in replaced.stdout and "{'hosts': 1}" in replaced.stdout
    assert slurm.run("squeue", "-h", "-j", job_id, check=False).stdout.strip() == ""
    k.ok("new_id = job.job_id\njob.kill()")
    assert not os.path.exists(os.path.join(k.notebook_dir, ".xmesh", "jobs", "nb.json"))
