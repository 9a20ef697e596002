"""A SLURM job started from a venv holding the wheel (issue 43): its nodes' agents and procs run
that environment's Python (on a cluster it is on a shared file system; here the namespace
hosts share this machine's), the job says which, and a package only the environment has is
imported by the procs."""
import json
import os
import textwrap

import pytest
from netns_hosts import NetnsHosts
from netns_hosts import unavailable as netns_unavailable
from slurm_cluster import SlurmCluster
from slurm_cluster import unavailable as slurm_unavailable
from test_wheel_programs import env_only_package
from wheel_envs import run_in, shared_venv, wheel, wheel_versions
from xmesh_testing import private_tmpdir

WHY_NOT = netns_unavailable() or slurm_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"a SLURM cluster cannot run here: {WHY_NOT}")


@pytest.fixture(scope="module")
def slurm():
    with NetnsHosts(2) as net, SlurmCluster(net, private_tmpdir("xmesh-wslurm-")) as cluster:
        yield cluster


def test_a_slurm_job_from_a_venv_runs_its_procs_in_that_venv(slurm, tmp_path):
    """Invariant env.1 (docs/architecture/12-environments.md): on a job's hosts."""
    python = shared_venv(wheel_versions(wheel())[-1])
    pkg = env_only_package(python)
    prefix = os.path.dirname(os.path.dirname(python))
    version = run_in(python, "import platform; print(platform.python_version())").stdout.strip()
    program = textwrap.dedent(f"""
        import json, socket, sys
        import xmesh

        class Where(xmesh.Actor):
            @xmesh.endpoint
            def where(self) -> list:
                import {pkg}
                return [socket.gethostname(), sys.executable, {pkg}.MARKER]

        job = xmesh.SlurmJob(nodes=2, name="venv", state_dir={str(tmp_path / "state")!r}, timeout=90)
        procs = job.host_mesh.spawn_procs({{"gpus": 1}})
        print("WHERE", json.dumps(list(procs.spawn("w", Where).where.call().get(timeout=60).values())))
        job.kill()
    """)
    r = run_in(python, program, timeout=110, cwd=str(tmp_path), SLURM_CONF=slurm.conf, XMESH_JOB_POLL_S="0.5",
               XMESH_RUNTIME_DIR=private_tmpdir("xmw-"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"xmesh: venv's procs run Python {version} ({python})" in r.stdout, r.stdout
    where = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("WHERE "))[6:])
    assert where == [["node-a", python, f"from {prefix}"], ["node-b", python, f"from {prefix}"]]
