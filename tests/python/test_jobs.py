"""Jobs on real schedulers (issue 21): a SLURM cluster on this machine (slurm_cluster.py:
munged, slurmctld, a slurmd in each of two namespace hosts), driven with SLURM's own commands.
Skipped, saying why, only where it cannot run (not root, the packages missing)."""
import os
import socket
import subprocess
import textwrap
import time

import pytest
from netns_hosts import NetnsHosts
from netns_hosts import unavailable as netns_unavailable
from slurm_cluster import SlurmCluster
from slurm_cluster import unavailable as slurm_unavailable
from xmesh_testing import private_tmpdir, run_program

import xmesh

WHY_NOT = netns_unavailable() or slurm_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"a SLURM cluster cannot run here: {WHY_NOT}")


@pytest.fixture(scope="module")
def slurm():
    tmp = private_tmpdir("xmesh-slurm-")
    with NetnsHosts(2) as net, SlurmCluster(net, tmp) as cluster:
        os.environ["SLURM_CONF"] = cluster.conf  # for SlurmJob's sbatch, scontrol, scancel
        os.environ["XMESH_JOB_POLL_S"] = "0.5"
        try:
            yield cluster
        finally:
            os.environ.pop("SLURM_CONF", None)
            os.environ.pop("XMESH_JOB_POLL_S", None)


class Where(xmesh.Actor):
    @xmesh.endpoint
    def where(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid()}


def wait_gone(slurm: SlurmCluster, job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while slurm.run("squeue", "-h", "-j", job_id, check=False).stdout.strip():
        assert time.monotonic() < deadline, f"job {job_id} still queued"
        time.sleep(0.2)


def test_the_test_cluster_runs_a_job_step_on_both_nodes(slurm, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsrun -N2 -n2 hostname\n")
    out = tmp_path / "out"
    r = slurm.run("sbatch", "--parsable", "-N2", "-o", str(out), "-D", str(tmp_path), str(script))
    job_id = r.stdout.strip().split(";")[0]
    wait_gone(slurm, job_id)
    assert sorted(out.read_text().split()) == ["node-a", "node-b"]


def test_a_slurm_job_gives_hosts_that_a_restarted_kernel_finds_again(slurm, tmp_path, capsys):
    job = xmesh.SlurmJob(nodes=2, name="train", state_dir=str(tmp_path), timeout=90)
    hm = job.host_mesh
    said = capsys.readouterr().out
    assert f"submitted SLURM job {job.job_id}" in said and "2/2 host agents up" in said, said
    assert hm.sizes == {"hosts": 2}
    procs = hm.spawn_procs({"gpus": 1}, name="job-procs")
    w = procs.spawn("where", Where)
    first = w.where.call().get(timeout=60)
    assert [v["host"] for v in first.values()] == ["node-a", "node-b"]
    # A new process (a restarted kernel) finds the same job and its named procs: no new submission.
    prog = textwrap.dedent(f"""
        import sys, xmesh
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_jobs import Where
        job = xmesh.SlurmJob(nodes=2, name="train", state_dir={str(tmp_path)!r}, timeout=60)
        procs = xmesh.attach("job-procs", hosts=job.host_mesh)
        print("JOB", job.job_id, sorted(v["pid"] for v in procs.spawn("w2", Where).where.call().get().values()))
    """)
    r = run_program(prog, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"JOB {job.job_id} {sorted(v['pid'] for v in first.values())}" in r.stdout, r.stdout
    assert "submitted" not in r.stdout and f"using SLURM job {job.job_id}" in r.stdout
    job_id = job.job_id
    job.kill()
    assert slurm.run("squeue", "-h", "-j", job_id, check=False).stdout.strip() == ""
    assert not os.path.exists(tmp_path / "jobs" / "train.json")
