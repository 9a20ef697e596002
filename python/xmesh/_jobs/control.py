"""A saved job on its scheduler, without a controller: SLURM's word on a job (`scontrol`,
`scancel`), the SSH jobs' agents (`ssh`), a Kubernetes job's pods (the API), where the nodes reach
this machine, releasing a job, and what `xmesh ls` and `xmesh stop` show and do."""
import glob
import json
import os
import re
import shlex
import subprocess
import time as _time
from dataclasses import dataclass
from typing import Optional

from .records import JobError, JobRecord, default_state_dir, describe

# ---- SLURM ----------------------------------------------------------------------------------
# States of a SLURM job that still holds (or will hold) its nodes.
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "RESIZING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
         "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"}
ENDING = {"COMPLETING", "SIGNALING", "STAGE_OUT"}


@dataclass
class SlurmState:
    """What `scontrol show job` says of a job: its state ("GONE" once SLURM forgot it), the reason
    it waits, its nodes, the seconds it has left (None: no limit or not started) and its time
    limit in seconds (None: unlimited or not said)."""
    state: str
    reason: str = ""
    nodes: str = ""
    seconds_left: Optional[float] = None
    limit_s: Optional[float] = None

    def notice_due(self, notice_s: float, within_last_fifth: bool = True) -> bool:
        """Whether its end is near enough to say: within notice_s and, by default, within the last
        fifth of its limit (a 10-minute job is not "near its end" when it starts)."""
        if self.seconds_left is None:
            return False
        near = min(notice_s, self.limit_s / 5) if self.limit_s and within_last_fifth else notice_s
        return self.seconds_left < near

    @property
    def alive(self) -> bool:
        """It still holds (or will hold) its nodes."""
        return self.state in ALIVE

    @property
    def usable(self) -> bool:
        """Not ending: a job COMPLETING (cancelled, at its limit) holds its nodes but is gone for use."""
        return self.state in ALIVE - ENDING


def _slurm_time(text: str) -> Optional[float]:
    """Epoch seconds of a SLURM timestamp (2026-11-24T18:02:03); None for Unknown/None."""
    try:
        return _time.mktime(_time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _slurm_duration(text: str) -> Optional[float]:
    """Seconds of a SLURM duration ([days-]hours:minutes:seconds, minutes:seconds or minutes);
    None for UNLIMITED, Partition_Limit or anything else."""
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    try:
        numbers = [int(p) for p in parts]
        d = int(days) if days else 0
    except ValueError:
        return None
    if len(numbers) == 3:
        h, m, sec = numbers
    elif len(numbers) == 2:
        h, m, sec = (numbers[0], numbers[1], 0) if days else (0, numbers[0], numbers[1])
    elif len(numbers) == 1:
        h, m, sec = (numbers[0], 0, 0) if days else (0, numbers[0], 0)
    else:
        return None
    return float(((d * 24 + h) * 60 + m) * 60 + sec)


def slurm_state(job_id: str) -> SlurmState:
    r = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        if "Invalid job id" in r.stderr:
            return SlurmState("GONE")
        raise JobError(f"scontrol show job {job_id} failed: {r.stderr.strip()}")
    fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
    state = fields.get("JobState", "UNKNOWN")
    end = _slurm_time(fields.get("EndTime", ""))
    left = end - _time.time() if end is not None and state == "RUNNING" else None
    return SlurmState(state, fields.get("Reason", ""), fields.get("NodeList", ""), left,
                      _slurm_duration(fields.get("TimeLimit", "")))


def final_state(job_id: str, st: SlurmState, wait_s: float = 5.0) -> SlurmState:
    """A job that is ending (COMPLETING) says why only once it ended: its state then, waited for
    a few seconds at most (else the ending state as it is)."""
    deadline = _time.monotonic() + wait_s
    while st.state in ENDING and _time.monotonic() < deadline:
        _time.sleep(0.2)
        st = slurm_state(job_id)
    return st


def cancel(record: JobRecord, wait_s: float = 30.0) -> None:
    """scancel, then wait (bounded) until SLURM says the job ended and its nodes are released."""
    r = subprocess.run(["scancel", record.job_id], capture_output=True, text=True, timeout=30)
    if r.returncode != 0 and "Invalid job id" not in r.stderr:
        raise JobError(f"scancel {record.job_id} failed: {r.stderr.strip()}")
    deadline = _time.monotonic() + wait_s
    while slurm_state(record.job_id).alive:
        if _time.monotonic() > deadline:
            raise JobError(f"SLURM job {record.job_id} still not ended {wait_s:.0f} s after scancel")
        _time.sleep(0.2)


def reported_agents(record: JobRecord) -> tuple:
    """The agents that said where they serve ({node: host:port}) and those that failed."""
    up, failed = {}, []
    d = os.path.join(record.job_dir, "nodes")
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if not f.endswith(".json"):
            continue
        try:
            with open(os.path.join(d, f)) as fh:
                st = json.load(fh)
        except (OSError, ValueError):
            continue  # being written
        if st.get("state") == "serving":
            up[st["node"]] = st["addr"]
        elif st.get("state") == "failed":
            log = st.get("log", "").strip()
            failed.append((st.get("node", f[:-5]), f"it exited with code {st.get('exit', '?')}"
                           + (f"; its log ends:\n{log}" if log else " without a word")))
    return up, failed


def output_tails(record: JobRecord) -> str:
    """The last lines of the job's output and of its agents' logs, to say why."""
    out = []
    log_dir = record.spec.get("log_dir")
    output = os.path.join(log_dir, f"xmesh-{record.name}-{record.job_id}.out") if log_dir else \
        os.path.join(record.job_dir, f"slurm-{record.job_id}.out")
    paths = [output] * os.path.exists(output) + sorted(glob.glob(os.path.join(record.job_dir, "nodes", "*.log")))
    for path in paths:
        with open(path, errors="replace") as f:
            text = f.read()[-1500:].strip()
        if text:
            shown = os.path.relpath(path, record.job_dir) if path.startswith(record.job_dir + os.sep) else path
            out.append(f"--- {shown}:\n{text}")
    return ("\n" + "\n".join(out)) if out else ""


def address_towards_slurmctld() -> str:
    """An address of this machine that the nodes route to: XMESH_CONTROLLER_HOST, else this
    machine's interface towards slurmctld (from `scontrol show config`)."""
    if os.environ.get("XMESH_CONTROLLER_HOST"):
        return os.environ["XMESH_CONTROLLER_HOST"]
    from .._runtime.agents import local_ip_towards

    r = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    m = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^(\s]+)(?:\(([^)]+)\))?", r.stdout, re.M)
    port = re.search(r"^SlurmctldPort\s*=\s*(\d+)", r.stdout, re.M)
    if r.returncode != 0 or not m:
        raise JobError("cannot tell which address the nodes reach this machine at (scontrol show config: "
                       f"{r.stderr.strip() or 'no SlurmctldHost'}); set XMESH_CONTROLLER_HOST")
    return local_ip_towards(f"tcp://{m.group(2) or m.group(1)}:{port.group(1) if port else 6817}")


# ---- SSH ------------------------------------------------------------------------------------
def ssh_job_dir(tag: str, host: str) -> str:
    """An SSH job's directory on a host (relative to its home): one per host, since hosts often
    share their home directory (NFS) and two agents writing one key file would read each
    other's half-written copy."""
    return f".xmesh/jobs/{tag}-{re.sub(r'[^A-Za-z0-9_.-]', '_', host)}"


def run_ssh(spec: dict, host: str, command: str, stdin: Optional[bytes] = None,
         timeout: float = 60.0) -> "subprocess.CompletedProcess[str]":
    r = subprocess.run([spec["ssh"], *spec["ssh_args"], host, command], input=stdin, capture_output=True,
                       timeout=timeout)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


def address_towards_ssh_host(spec: dict, host: str) -> str:
    """This machine's address towards host as ssh resolves it (its configuration's HostName)."""
    from .._runtime.agents import local_ip_towards

    r = subprocess.run([spec["ssh"], *spec["ssh_args"], "-G", host], capture_output=True, text=True, timeout=30)
    m = re.search(r"^hostname (\S+)", r.stdout, re.M)
    port = re.search(r"^port (\d+)", r.stdout, re.M)
    if r.returncode != 0 or not m:
        raise JobError(f"ssh -G {host} failed: {r.stderr.strip()}")
    if os.environ.get("XMESH_CONTROLLER_HOST"):
        return os.environ["XMESH_CONTROLLER_HOST"]
    try:
        return local_ip_towards(f"tcp://{m.group(1)}:{port.group(1) if port else 22}")
    except ConnectionError as e:
        raise JobError(str(e)) from None


def ssh_state(record: JobRecord, timeout: float = 2.0) -> "SlurmState":
    """An SSH job's state as `xmesh ls` tells it: RUNNING while every agent accepts connections
    at its address, else LOST naming those that do not (without connecting as a controller)."""
    import socket

    lost = []
    for agent in record.agents:
        host, _, port = str(agent["addr"]).rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except (OSError, ValueError):
            lost.append(agent["host"])
    return SlurmState("LOST" if lost else "RUNNING", f"no agent answers on {', '.join(lost)}" if lost else "",
                      ",".join(a["host"] for a in record.agents))


# ---- Kubernetes --------------------------------------------------------------------------------
def pods_state(record: JobRecord) -> "SlurmState":
    """A Kubernetes job's state as `xmesh ls` tells it, from one listing of its meshes' pods:
    RUNNING while the Ready pods are the ones it was connected to, else LOST saying what changed."""
    from .kubernetes import KubeConfig, MeshSpec, current_pods

    saved = record.spec.get("kubeconfig")
    if isinstance(saved, dict):
        return SlurmState("unknown", f"made with an in-process client Configuration ({saved.get('api_server')})")
    api = (KubeConfig.from_path(saved) if saved else KubeConfig()).core_api()
    pods = [p for m in record.spec["meshes"] for p in current_pods(api, record.spec["namespace"], MeshSpec(**m))]
    names = ",".join(p.name for p in pods)
    if [p.locator for p in pods] == record.hosts:
        return SlurmState("RUNNING", "", names)
    return SlurmState("LOST", f"{len(pods)}/{len(record.hosts)} of its pods Ready at the addresses it used "
                      "(apply the job again)", names)


# ---- a saved job of any kind -------------------------------------------------------------
def release(record: JobRecord) -> None:
    """Ends what a record holds: scancel for SLURM, the agents stopped over ssh for SSH."""
    if record.kind == "slurm":
        if slurm_state(record.job_id).alive:
            cancel(record)
        return
    if record.kind == "kubernetes":
        return  # its pods are the cluster's (attach mode): a controller's kill() stops the procs on them
    errors = []
    for a in record.agents:
        key_copy = shlex.quote(f"{ssh_job_dir(record.job_id, a['host'])}/cluster.key")
        r = run_ssh(record.spec, a["host"], f"kill {int(a['pid'])} 2>/dev/null; rm -f {key_copy}", timeout=30)
        if r.returncode != 0:
            errors.append(f"{a['host']}: {r.stderr.strip()}")
    if errors:
        raise JobError("could not stop the agents of " + describe(record) + ": " + "; ".join(errors))


def stop_job(name: str, state_dir: Optional[str] = None) -> Optional[str]:
    """Releases the saved job `name` (SLURM: scancel; SSH: its agents stopped) and removes its
    record: what was released, in words; None when no job of that name is saved. JobError when
    its record is refused (never acted on) or the release failed."""
    d = default_state_dir(state_dir)
    record = JobRecord.load(d, name)
    if record is None:
        return None
    release(record)
    os.unlink(JobRecord.path(d, name))
    if record.kind == "slurm":
        return f"released SLURM job {record.job_id} ({name}; scancel)"
    if record.kind == "kubernetes":
        return (f"forgot Kubernetes job {name} (its pods are the cluster's and stay; job.kill() from a program "
                "also stops the procs on them)")
    return f"stopped the host agents of SSH job {name} on {', '.join(a['host'] for a in record.agents)}"


def saved_jobs(state_dir: Optional[str] = None, problems: Optional[list] = None) -> list:
    """The records of every job saved under state_dir (default ./.xmesh). A record that cannot
    be used is left out, its (name, why) added to `problems` when given: one bad record never
    hides the others."""
    d = os.path.join(default_state_dir(state_dir), "jobs")
    names = sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json")) if os.path.isdir(d) else []
    records = []
    for n in names:
        try:
            record = JobRecord.load(default_state_dir(state_dir), n)
        except JobError as e:
            if problems is not None:
                problems.append((n, str(e)))
            continue
        if record is not None:
            records.append(record)
    return records


def job_rows(state_dir: Optional[str] = None) -> list:
    """What `xmesh ls` shows of the saved jobs: name, scheduler and id, nodes, state, time left."""
    rows: list = []
    problems: list = []
    for r in saved_jobs(state_dir, problems):
        try:
            st = slurm_state(r.job_id) if r.kind == "slurm" else pods_state(r) if r.kind == "kubernetes" else ssh_state(r)
        except (OSError, JobError) as e:  # scontrol missing or failing here
            st = SlurmState(f"unknown ({e})")
        rows.append({"kind": "job", "name": r.name, "scheduler": r.kind, "job_id": r.job_id,
                     "nodes": r.spec.get("nodes", len(r.agents) or len(r.hosts)), "node_list": st.nodes, "state": st.state,
                     "reason": "" if st.reason == "None" else st.reason,
                     "seconds_left": st.seconds_left, "hosts": r.hosts})
    for name, why in problems:  # listed, with why, beside the others
        rows.append({"kind": "job", "name": name, "scheduler": "?", "job_id": "", "nodes": 0, "node_list": "",
                     "state": "REFUSED", "reason": why, "seconds_left": None, "hosts": []})
    return rows
