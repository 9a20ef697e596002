"""Jobs on real schedulers (issue 21): a SLURM cluster on this machine (slurm_cluster.py:
munged, slurmctld, a slurmd in each of two namespace hosts), driven with SLURM's own commands.
Skipped, saying why, only where it cannot run (not root, the packages missing)."""
import os
import time

import pytest
from netns_hosts import NetnsHosts
from netns_hosts import unavailable as netns_unavailable
from slurm_cluster import SlurmCluster
from slurm_cluster import unavailable as slurm_unavailable
from xmesh_testing import private_tmpdir

WHY_NOT = netns_unavailable() or slurm_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"a SLURM cluster cannot run here: {WHY_NOT}")


@pytest.fixture(scope="module")
def slurm():
    tmp = private_tmpdir("xmesh-slurm-")
    with NetnsHosts(2) as net, SlurmCluster(net, tmp) as cluster:
        yield cluster


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
