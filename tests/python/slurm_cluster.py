"""A real SLURM cluster on one machine, for the tests of jobs on schedulers (issue 21): a munged
with a key of its own, slurmctld in the root namespace and one slurmd per namespace host
(netns_hosts.py), each node named by its host's name and reached at its address, everything
configured under a temporary directory. `env()` points SLURM's commands (sbatch, squeue,
scancel, scontrol) at it. Everything stops and is removed at the end, also after a failure.
`unavailable()` says why it cannot run here (not root, the packages missing), for a skip."""
import os
import shutil
import socket
import subprocess
import textwrap
import time
from typing import Dict, List, Optional

from netns_hosts import NetnsHosts, Started

SLURM_PROGRAMS = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun", "munged")


def unavailable() -> Optional[str]:
    """Why a SLURM cluster cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "slurmctld, slurmd and network namespaces need root"
    missing = [p for p in SLURM_PROGRAMS if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]
    if missing:
        return f"{', '.join(missing)} missing (Debian's slurm-wlm and munge, installed by scripts/setup.sh)"
    return None


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


class SlurmCluster(Started):
    """slurmctld and a slurmd on each of net's hosts; use as a context manager."""

    def __init__(self, net: NetnsHosts, tmp: str, cpus_per_node: int = 2) -> None:
        self.net = net
        self.dir = os.path.join(tmp, "slurm")
        self.cpus = cpus_per_node
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket")
        self._procs: List[subprocess.Popen] = []

    def env(self) -> Dict[str, str]:
        """The environment SLURM's commands need to reach this cluster."""
        return dict(os.environ, SLURM_CONF=self.conf)

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """One of SLURM's commands against this cluster."""
        return subprocess.run([_program(argv[0]), *argv[1:]], env=self.env(), capture_output=True, text=True,
                              check=check, timeout=timeout)

    def log(self, name: str) -> str:
        path = os.path.join(self.dir, name)
        return open(path, errors="replace").read() if os.path.exists(path) else ""

    def _start(self) -> None:
        for sub in ("munge", "state", "spool"):
            os.makedirs(os.path.join(self.dir, sub), mode=0o755, exist_ok=True)
        os.chmod(self.dir, 0o755)
        self._start_munge()
        self._write_conf()
        self._procs.append(subprocess.Popen([_program("slurmctld"), "-D", "-i", "-f", self.conf],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        self._wait(lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, 30,
                   lambda: "slurmctld did not come up: " + self.log("slurmctld.log")[-2000:])
        for h in self.net.hosts:
            os.makedirs(os.path.join(self.dir, "spool", h.hostname), mode=0o755, exist_ok=True)
            self._procs.append(h.popen([_program("slurmd"), "-D", "-f", self.conf, "-N", h.hostname], keep_sys=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        self._wait(self._all_idle, 60,
                   lambda: "the slurmd nodes did not come up: " + self.run("sinfo", "-N", check=False).stdout
                   + "".join(self.log(f"slurmd-{h.hostname}.log")[-1500:] for h in self.net.hosts))

    def _start_munge(self) -> None:
        key = os.path.join(self.dir, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self._procs.append(subprocess.Popen(
            [_program("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
             f"--pid-file={self.dir}/munge/munged.pid", f"--log-file={self.dir}/munge/munged.log",
             f"--seed-file={self.dir}/munge/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        self._wait(lambda: os.path.exists(self.munge_socket), 15,
                   lambda: "munged did not start: " + self.log("munge/munged.log")[-2000:])

    def _write_conf(self) -> None:
        nodes = "\n".join(f"NodeName={h.hostname} NodeAddr={h.addr} CPUs={self.cpus} RealMemory=1000 State=UNKNOWN"
                          for h in self.net.hosts)
        d = self.dir
        with open(self.conf, "w") as f:
            f.write(textwrap.dedent(f"""\
                ClusterName=xmtest
                SlurmctldHost={socket.gethostname()}({self.net.gateway})
                SlurmctldPort={_free_port()}
                SlurmdPort={_free_port()}
                SlurmUser=root
                SlurmdUser=root
                AuthType=auth/munge
                CredType=cred/munge
                AuthInfo=socket={self.munge_socket}
                StateSaveLocation={d}/state
                SlurmdSpoolDir={d}/spool/%n
                SlurmctldPidFile={d}/slurmctld.pid
                SlurmdPidFile={d}/slurmd-%n.pid
                SlurmctldLogFile={d}/slurmctld.log
                SlurmdLogFile={d}/slurmd-%n.log
                ProctrackType=proctrack/linuxproc
                TaskPlugin=task/none
                MpiDefault=none
                SelectType=select/cons_tres
                SelectTypeParameters=CR_Core
                SchedulerType=sched/backfill
                ReturnToService=2
                JobCompType=jobcomp/none
                AccountingStorageType=accounting_storage/none
                JobAcctGatherType=jobacct_gather/none
                SlurmctldTimeout=30
                SlurmdTimeout=30
                InactiveLimit=0
                KillWait=2
                MinJobAge=30
                MessageTimeout=10
                {nodes}
                PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
            """))
        os.chmod(self.conf, 0o644)

    def _all_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return len(states) == len(self.net.hosts) and all(s == "idle" for s in states.values())

    @staticmethod
    def _wait(ok, timeout: float, why) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError(why())
            time.sleep(0.2)

    def close(self) -> None:
        for p in reversed(self._procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self._procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()
