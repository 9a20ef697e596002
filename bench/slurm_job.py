#!/usr/bin/python3
"""SlurmJob on a real SLURM cluster on this machine (tests/python/slurm_cluster.py: munged,
slurmctld, a slurmd in each of two namespace hosts; root needed), in one run:

- fresh: from `SlurmJob(nodes=2, ...)` to a usable 2-node host mesh (procs spawned on both
  nodes and a call answered by each), a new job each round;
- reattach: a new process (a restarted kernel) that finds the same job and its named procs and
  gets a call answered, measured inside it from before `SlurmJob(...)` (xmesh already imported),
  and from the process's start (Python and xmesh imported too);
- the same two for SSHJob over the same hosts (sshd in each namespace, tests/python/ssh_hosts.py).

Target (issue 21): a restarted kernel's reattached mesh answers within 300 ms.

    sudo PYTHONPATH=build/python /usr/bin/python3 bench/slurm_job.py [--rounds 5]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import xmesh  # noqa: E402
from netns_hosts import NetnsHosts, unavailable  # noqa: E402
from slurm_cluster import SlurmCluster  # noqa: E402
from slurm_cluster import unavailable as slurm_unavailable  # noqa: E402
from ssh_hosts import SshHosts  # noqa: E402


class Noop(xmesh.Actor):
    @xmesh.endpoint
    def noop(self) -> None:
        return None


REATTACH = textwrap.dedent("""
    import time
    t_start = time.monotonic()
    import sys, xmesh
    sys.path.insert(0, {here!r})
    from slurm_job import Noop
    t0 = time.monotonic()
    job = {job}
    procs = xmesh.attach("bench-procs", hosts=job.host_mesh)
    procs.spawn("n2", Noop).noop.call().get()
    t1 = time.monotonic()
    print("TIMES", (t1 - t0) * 1000, (t1 - t_start) * 1000)
""")


def fresh(make_job) -> float:
    t0 = time.monotonic()
    job = make_job()
    procs = job.host_mesh.spawn_procs({"gpus": 1})
    procs.spawn("n", Noop).noop.call().get()
    took = (time.monotonic() - t0) * 1000
    job.kill()
    return took


def reattach(script: str) -> tuple:
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("TIMES")]
    if not line:
        raise RuntimeError(f"the reattaching process failed: {r.stdout}{r.stderr}")
    _, inside, whole = line[0].split()
    return float(inside), float(whole)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    why = unavailable() or slurm_unavailable()
    if why:
        sys.exit(f"slurm_job.py needs a SLURM cluster here: {why}")
    tmp = tempfile.mkdtemp(prefix="xmesh-slurmbench-", dir="/tmp")
    state = os.path.join(tmp, "state")
    with NetnsHosts(2) as net, SlurmCluster(net, tmp) as cluster, SshHosts(net, tmp) as ssh:
        os.environ["SLURM_CONF"] = cluster.conf
        ssh_args = ["-F", ssh.config]
        kinds = {
            "SLURM": (lambda name: xmesh.SlurmJob(nodes=2, name=name, state_dir=state, progress=False),
                      f"xmesh.SlurmJob(nodes=2, name='bench', state_dir={state!r}, progress=False)"),
            "SSH": (lambda name: xmesh.SSHJob(["node-a", "node-b"], ssh_args=ssh_args, name=name, state_dir=state,
                                              progress=False),
                    f"xmesh.SSHJob(['node-a', 'node-b'], ssh_args={ssh_args!r}, name='bench', state_dir={state!r}, "
                    "progress=False)"),
        }
        med = {kind: measure(kind, make, job_text, tmp, args.rounds) for kind, (make, job_text) in kinds.items()}
    print(f"2 hosts (namespace hosts), median of {args.rounds} rounds (ms)     SLURM      SSH")
    for key, label in (("fresh", "a new job to a usable 2-host mesh"),
                       ("inside", "restarted process: job() to a call answered"),
                       ("whole", "restarted process: its start to a call answered")):
        print(f"  {label:<48} {med['SLURM'][key]:8.1f} {med['SSH'][key]:8.1f}")


def measure(kind: str, make_job, job_text: str, tmp: str, rounds: int) -> dict:
    """Medians of fresh and reattach rounds for one kind of job (a kept job 'bench' to reattach to)."""
    script = os.path.join(tmp, f"reattach-{kind}.py")
    with open(script, "w") as f:
        f.write(REATTACH.format(here=HERE, job=job_text))
    kept = make_job("bench")
    kept.host_mesh.spawn_procs({"gpus": 1}, name="bench-procs").spawn("n", Noop).noop.call().get()
    figures: dict = {"fresh": [], "inside": [], "whole": []}
    try:
        for _ in range(rounds):
            figures["fresh"].append(fresh(lambda: make_job("fresh")))
            inside, whole = reattach(script)
            figures["inside"].append(inside)
            figures["whole"].append(whole)
    finally:
        kept.kill()
    return {k: statistics.median(v) for k, v in figures.items()}


if __name__ == "__main__":
    main()
