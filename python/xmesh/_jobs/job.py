"""Jobs on schedulers (issue 21): hosts from SLURM, kept across kernel restarts.

`SlurmJob(nodes=2, ...)` submits one allocation with `sbatch`, whose `srun` starts a host agent
in the foreground on every node (`python -m xmesh._jobs.agent`: it listens on the node's
interface towards this machine, with the key file of the state directory, `.xmesh/cluster.key`,
made fresh by xmesh there once, mode 0600, its path and never its content on a command line; one
key for every job of a controller, which authenticates with one). The controller waits with progress (queue state, agents
up), then connects to the agents over TCP (`xmesh.hosts`): `job.host_mesh` is a HostMesh with
one host per node. The job's record is saved under `.xmesh/jobs/` in the working directory (or
`state_dir`), so that a restarted kernel, another one, or `xmesh ls` finds the same running
allocation instead of submitting a new one. While the job is used a thread watches it: when it
ends (cancelled, its time limit, a node failure) the hosts are lost at once with that cause, and
a notice says when the time limit nears.
"""
import glob
import hashlib
import hmac
import json
import os
import re
import shlex
import stat
import subprocess
import threading
import time as _time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .. import _core
from .._base.context import current_cell
from .._base.env import env_float
from .._base.paths import PYTHON
from .._base.threads import start_user_thread

if TYPE_CHECKING:
    from .._api.proc_mesh import HostMesh

# States of a SLURM job that still holds (or will hold) its nodes.
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "RESIZING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
         "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"}
ENDING = {"COMPLETING", "SIGNALING", "STAGE_OUT"}
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class JobError(RuntimeError):
    """A job could not be submitted, ended while it was awaited, or its agents did not start;
    the text says why (the scheduler's own words where it gave some)."""


@dataclass
class JobRecord:
    """What is saved of a job (`<state_dir>/jobs/<name>.json`).

    A record chooses what `xmesh stop` and `attach` run (ssh and its options, scancel's job id,
    the agents' pids), and a state directory may come from somewhere else (a repository checkout,
    an unpacked archive). So a record counts only when it is this user's own (mode 0600 in a
    0700 directory, no symlink) and signed by this user's xmesh (an HMAC with the secret in
    `records_secret_path()`, which never sits in a state directory); anything else is refused,
    naming why, and never run."""
    kind: str
    name: str
    spec: dict
    job_id: str
    job_dir: str
    submitted: float
    hosts: list = field(default_factory=list)  # host:port of its agents, once up
    agents: list = field(default_factory=list)  # SSH jobs: {host, addr, pid} of each agent

    @staticmethod
    def path(state_dir: str, name: str) -> str:
        return os.path.join(state_dir, "jobs", f"{name}.json")

    def save(self, state_dir: str) -> None:
        path = self.path(state_dir, self.name)
        directory = os.path.dirname(path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)  # one made by an older xmesh may be open to others
        body = asdict(self)
        body["mac"] = _record_mac(body)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, state_dir: str, name: str) -> Optional["JobRecord"]:
        """The record saved as `name`, None when there is none. JobError, naming why, when it is
        not one this user's xmesh wrote (owner, mode, signature) or does not read."""
        if not NAME.match(name):
            return None  # not a job's name (no path of its own under jobs/)
        path = cls.path(state_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise JobError(f"the saved job {path} cannot be read ({e.strerror}): remove it") from None
        with os.fdopen(fd) as f:
            _check_own_private(path, os.fstat(f.fileno()), "file", 0o600)
            _check_own_private(os.path.dirname(path), os.stat(os.path.dirname(path)), "directory", 0o700)
            try:
                body = json.load(f)
            except ValueError as e:
                raise JobError(f"the saved job {path} does not read ({e}): remove it to submit anew") from None
        if not isinstance(body, dict) or not hmac.compare_digest(str(body.pop("mac", "")), _record_mac(body)):
            raise JobError(f"the saved job {path} was not written by xmesh for this user (its signature does not "
                           f"match {records_secret_path()}): it is not acted on; remove it")
        try:
            record = cls(**body)
            record.check()
        except (TypeError, ValueError) as e:
            raise JobError(f"the saved job {path} does not read ({e}): remove it to submit anew") from None
        return record

    def check(self) -> None:
        """ValueError naming the first field that is not what xmesh writes."""
        if self.kind not in ("slurm", "ssh") or not isinstance(self.spec, dict):
            raise ValueError(f"kind {self.kind!r}")
        if not isinstance(self.job_id, str) or not NAME.match(self.job_id):
            raise ValueError(f"job id {self.job_id!r}")
        for a in self.agents:
            if not (isinstance(a, dict) and _is_host(a.get("host")) and isinstance(a.get("pid"), int)
                    and a["pid"] > 1):
                raise ValueError(f"agent {a!r}")
        if self.kind == "ssh":
            spec = self.spec
            if not (isinstance(spec.get("ssh"), str) and isinstance(spec.get("ssh_args"), list)
                    and all(isinstance(x, str) for x in spec["ssh_args"])
                    and isinstance(spec.get("hosts"), list) and all(_is_host(h) for h in spec["hosts"])):
                raise ValueError("its ssh settings")


def _is_host(host: Any) -> bool:
    """A host name ssh takes as one (never an option)."""
    return isinstance(host, str) and bool(host) and not host.startswith("-") and not any(c.isspace() for c in host)


def _check_own_private(path: str, st: os.stat_result, what: str, mode: int) -> None:
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise JobError(f"the saved job's {what} {path} is not this user's own private one (owner uid {st.st_uid}, "
                       f"mode {stat.S_IMODE(st.st_mode):04o}; xmesh writes {mode:04o}, owned by uid {os.geteuid()}): "
                       "it is not acted on; remove it")


def records_secret_path() -> str:
    """This user's secret that signs job records (outside any state directory)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "xmesh", "records.key")


def _records_secret() -> bytes:
    path = records_secret_path()
    try:
        with open(path, "rb") as f:
            secret = f.read()
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it meanwhile
            return _records_secret()
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
        return _records_secret()
    st = os.stat(path)
    if len(secret) < 32 or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise JobError(f"{path} is not this user's private secret of 32 bytes (mode 0600): remove it and it is "
                       "made anew (records saved with the old one are then refused)")
    return secret


def _record_mac(body: dict) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(_records_secret(), text, hashlib.sha256).hexdigest()


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


def saved_job(name: str, state_dir: Optional[str] = None) -> "_Job":
    """The job saved as `name`, rebuilt from its record (its spec is the constructor's
    arguments), not yet connected: `.attach()` connects without ever submitting."""
    d = default_state_dir(state_dir)
    record = JobRecord.load(d, name)
    if record is None:
        raise JobError(f"no job {name!r} is saved in {d} (`xmesh ls --state-dir DIR` lists the jobs of a directory)")
    kind = {"slurm": SlurmJob, "ssh": SSHJob}.get(record.kind)
    if kind is None:
        raise JobError(f"the saved job {JobRecord.path(d, name)} is of an unknown kind {record.kind!r}")
    try:
        return kind(**record.spec, name=name, state_dir=d)
    except (TypeError, ValueError) as e:
        raise JobError(f"the saved job {JobRecord.path(d, name)} does not read ({e}): remove it") from None


def job_key_file(state_dir: str) -> str:
    """The state directory's key file (made on first use, mode 0600), which every job started
    from there uses: a controller authenticates with one key."""
    path = os.path.join(state_dir, "cluster.key")
    if not os.path.exists(path):
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        try:
            _core.write_new_key_file(path)
        except Exception:
            if not os.path.exists(path):  # another kernel made it meanwhile: use that one
                raise
    return path


def job_rows(state_dir: Optional[str] = None) -> list:
    """What `xmesh ls` shows of the saved jobs: name, scheduler and id, nodes, state, time left."""
    rows: list = []
    problems: list = []
    for r in saved_jobs(state_dir, problems):
        try:
            st = slurm_state(r.job_id) if r.kind == "slurm" else _ssh_state(r)
        except (OSError, JobError) as e:  # scontrol missing or failing here
            st = SlurmState(f"unknown ({e})")
        rows.append({"kind": "job", "name": r.name, "scheduler": r.kind, "job_id": r.job_id,
                     "nodes": r.spec.get("nodes", len(r.agents)), "node_list": st.nodes, "state": st.state,
                     "reason": "" if st.reason == "None" else st.reason,
                     "seconds_left": st.seconds_left, "hosts": r.hosts})
    for name, why in problems:  # listed, with why, beside the others
        rows.append({"kind": "job", "name": name, "scheduler": "?", "job_id": "", "nodes": 0, "node_list": "",
                     "state": "REFUSED", "reason": why, "seconds_left": None, "hosts": []})
    return rows


def _ssh_state(record: JobRecord, timeout: float = 2.0) -> "SlurmState":
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
    return f"stopped the host agents of SSH job {name} on {', '.join(a['host'] for a in record.agents)}"


def describe(record: JobRecord) -> str:
    if record.kind == "slurm":
        return f"SLURM job {record.job_id} ({record.name})"
    return f"SSH job {record.name} ({len(record.agents)} hosts)"


def release(record: JobRecord) -> None:
    """Ends what a record holds: scancel for SLURM, the agents stopped over ssh for SSH."""
    if record.kind == "slurm":
        if slurm_state(record.job_id).alive:
            cancel(record)
        return
    errors = []
    for a in record.agents:
        key_copy = shlex.quote(f"{_ssh_job_dir(record.job_id, a['host'])}/cluster.key")
        r = _ssh(record.spec, a["host"], f"kill {int(a['pid'])} 2>/dev/null; rm -f {key_copy}", timeout=30)
        if r.returncode != 0:
            errors.append(f"{a['host']}: {r.stderr.strip()}")
    if errors:
        raise JobError("could not stop the agents of " + describe(record) + ": " + "; ".join(errors))


def _check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be 0 (any free one) to 65535, got {port!r}")


def default_state_dir(state_dir: Optional[str] = None) -> str:
    return os.path.abspath(state_dir or os.path.join(os.getcwd(), ".xmesh"))


@dataclass
class SlurmState:
    """What `scontrol show job` says of a job: its state ("GONE" once SLURM forgot it), the reason
    it waits, its nodes and the seconds it has left (None: no limit or not started)."""
    state: str
    reason: str = ""
    nodes: str = ""
    seconds_left: Optional[float] = None

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
    return SlurmState(state, fields.get("Reason", ""), fields.get("NodeList", ""), left)


def final_state(job_id: str, st: SlurmState, wait_s: float = 5.0) -> SlurmState:
    """A job that is ending (COMPLETING) says why only once it ended: its state then, waited for
    a few seconds at most (else the ending state as it is)."""
    deadline = _time.monotonic() + wait_s
    while st.state in ENDING and _time.monotonic() < deadline:
        _time.sleep(0.2)
        st = slurm_state(job_id)
    return st


def _towards_controller() -> str:
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


class _Job:
    """What SlurmJob and SSHJob share: the record, `host_mesh` / `state()` / `kill()`, progress."""

    kind = ""

    def __init__(self, name: str, state_dir: Optional[str], replace: Optional[bool], timeout: float,
                 progress: bool) -> None:
        if not isinstance(name, str) or not NAME.match(name):
            raise ValueError(f"a job name is 1-64 letters, digits, '_', '.' or '-', got {name!r}")
        self.name = name
        self.spec: dict[str, Any] = {}
        self.state_dir = default_state_dir(state_dir)
        self.replace = replace
        self.timeout = timeout
        self.progress = progress
        self._record: Optional[JobRecord] = None
        self._host_mesh: Any = None
        self._lock = threading.Lock()

    @property
    def host_mesh(self) -> "HostMesh":
        return self.apply()._host_mesh

    def state(self) -> "JobView":
        """Monarch's style: `job.state().hosts` is the HostMesh."""
        self.apply()
        return JobView(self._host_mesh, self)

    @property
    def job_id(self) -> Optional[str]:
        return self._record.job_id if self._record else None

    def apply(self) -> "_Job":
        """Finds this job's saved allocation or starts one, and waits until its hosts answer."""
        with self._lock:
            if self._host_mesh is not None and self._record is not None and self._still_there(self._record):
                return self
            self._host_mesh = None
            self._record = self._existing_or_new()
            self._host_mesh = self._connect(self._record)
            return self

    def attach(self) -> "_Job":
        """Connects to this job's saved allocation and never starts one (`xmesh attach`): a
        JobError says when none is saved or it has ended."""
        with self._lock:
            saved = JobRecord.load(self.state_dir, self.name)
            if saved is None:
                raise JobError(f"no job {self.name!r} is saved in {self.state_dir} (`xmesh ls --state-dir DIR` "
                               "lists the jobs of a directory)")
            if not self._still_there(saved):
                raise JobError(f"{describe(saved)} has ended (`xmesh stop {self.name}` forgets it)")
            self._record = saved
            self._host_mesh = self._connect(saved)
            return self

    def kill(self) -> None:
        """Releases the allocation (its agents stop their procs) and forgets it."""
        from .._runtime.agents import release_agent

        record = self._record or JobRecord.load(self.state_dir, self.name)
        self._record = None
        self._host_mesh = None
        if record is not None:
            for h in record.hosts:
                release_agent(f"tcp://{h}", f"{describe(record)} was released (kill)")
        stop_job(self.name, self.state_dir)

    def _saved_or_refused(self) -> Optional[JobRecord]:
        """The saved record of this name, if its job still runs with this spec; a job of another
        spec is released when replace=True or a person says so when asked (replace=None), else
        refused."""
        saved = JobRecord.load(self.state_dir, self.name)
        if saved is None:
            return None
        if not self._still_there(saved):
            self._say(f"{describe(saved)} has ended: starting anew")
            return None
        if saved.kind == self.kind and saved.spec == self.spec:
            self._say(f"using {describe(saved)}, saved in {JobRecord.path(self.state_dir, self.name)}")
            return saved
        difference = _spec_difference(saved.spec, self.spec) if saved.kind == self.kind else \
            f"{saved.kind} there, {self.kind} here"
        if not self._may_replace(saved, difference):
            raise JobError(f"{describe(saved)} still runs with another spec ({difference}): pass replace=True "
                           "to release it and start this one, or use another name")
        self._say(f"releasing {describe(saved)} to start this spec")
        release(saved)
        return None

    def _may_replace(self, saved: JobRecord, difference: str) -> bool:
        """replace=True/False as given; None asks a person (a terminal, the cell's input box),
        and where nobody can answer the saved job is kept."""
        if self.replace is not None:
            return bool(self.replace)
        from .._runtime.process import ask

        answer = ask(f"{describe(saved)} still runs with another spec ({difference}). Release it and start "
                     "this one? [y/N] ")
        if answer is None:
            return False
        if answer.strip().lower() in ("y", "yes"):
            return True
        raise JobError(f"{describe(saved)} kept (not replaced: answered {answer.strip()!r}); use another name "
                       "for a second job")

    def _say(self, text: str) -> None:
        if self.progress:
            print(f"xmesh: {text}", flush=True)

    # The scheduler's part.
    def _still_there(self, record: JobRecord) -> bool:
        raise NotImplementedError

    def _existing_or_new(self) -> JobRecord:
        raise NotImplementedError

    def _connect(self, record: JobRecord) -> "HostMesh":
        raise NotImplementedError


class SlurmJob(_Job):
    """One SLURM allocation of `nodes` nodes running an xmesh host agent each (see the module).

    `job.host_mesh` (or `job.state().hosts`) submits or finds the job, waits, and gives the
    HostMesh; `job.kill()` releases it. A job of the same name saved earlier and still alive is
    used again (same spec); one of another spec is released with `replace=True`, kept and refused
    with `replace=False`, and by default a person is asked (a terminal, the cell's input box) and
    it is kept where nobody can answer."""

    kind = "slurm"

    def __init__(self, nodes: int = 1, gpus_per_node: Optional[int] = None, partition: Optional[str] = None,
                 time: Optional[str] = None, account: Optional[str] = None, extra_args: Sequence[str] = (),
                 name: str = "xmesh", port: int = 0, python: Optional[str] = None, log_dir: Optional[str] = None,
                 state_dir: Optional[str] = None, replace: Optional[bool] = None, timeout: float = 600.0,
                 progress: bool = True) -> None:
        super().__init__(name, state_dir, replace, timeout, progress)
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"nodes must be a whole number >= 1, got {nodes!r}")
        if gpus_per_node is not None and (isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int)
                                          or gpus_per_node < 0):
            raise ValueError(f"gpus_per_node must be a whole number >= 0 or None, got {gpus_per_node!r}")
        if isinstance(extra_args, str) or not all(isinstance(a, str) for a in extra_args):
            raise ValueError("extra_args must be a list of strings (sbatch's own arguments)")
        _check_port(port)
        self.spec = {"nodes": nodes, "gpus_per_node": gpus_per_node, "partition": partition, "time": time,
                     "account": account, "extra_args": list(extra_args), "port": port, "python": python or PYTHON,
                     "log_dir": os.path.abspath(log_dir) if log_dir else None}
        self._watcher: Optional[threading.Thread] = None
        self._ended = False  # the watcher saw the job end

    def slurm_state(self) -> SlurmState:
        if self._record is None:
            raise JobError(f"the job {self.name!r} has not been submitted (use job.host_mesh first)")
        return slurm_state(self._record.job_id)

    def _still_there(self, record: JobRecord) -> bool:
        if record is self._record and self._ended:
            return False
        return record.kind != "slurm" or slurm_state(record.job_id).usable

    def _connect(self, record: JobRecord) -> "HostMesh":
        hm = self._wait_for_agents(record)
        self._ended = False
        self._watch()
        return hm

    # -- submitting and finding ------------------------------------------------------------
    def _existing_or_new(self) -> JobRecord:
        return self._saved_or_refused() or self._submit()

    def _submit(self) -> JobRecord:
        s = self.spec
        job_dir = os.path.join(self.state_dir, "jobs", f"{self.name}-{_core.random_hex(4)}")
        os.makedirs(os.path.join(job_dir, "nodes"), mode=0o700)
        script = os.path.join(job_dir, "job.sh")
        agent = [str(s["python"]), "-m", "xmesh._jobs.agent", "--job-dir", job_dir, "--towards", _towards_controller(),
                 "--port", str(s["port"]), "--key-file", job_key_file(self.state_dir)]
        with open(script, "w") as f:
            f.write("#!/bin/sh\n# an xmesh host agent on every node of this allocation\n"
                    f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 {shlex.join(agent)}\n")
        output = os.path.join(s["log_dir"], f"xmesh-{self.name}-%j.out") if s["log_dir"] else f"{job_dir}/slurm-%j.out"
        if s["log_dir"]:
            os.makedirs(s["log_dir"], exist_ok=True)
        argv = ["sbatch", "--parsable", f"--job-name=xmesh-{self.name}", f"--nodes={s['nodes']}",
                "--ntasks-per-node=1", f"--output={output}", f"--chdir={job_dir}"]
        for opt, key in (("--time", "time"), ("--partition", "partition"), ("--account", "account"),
                         ("--gpus-per-node", "gpus_per_node")):
            if s[key] is not None:
                argv.append(f"{opt}={s[key]}")
        extra: list[str] = list(s["extra_args"])
        r = subprocess.run([*argv, *extra, script], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise JobError(f"sbatch failed: {(r.stderr or r.stdout).strip()}")
        record = JobRecord("slurm", self.name, self.spec, r.stdout.strip().split(";")[0], job_dir, _time.time())
        record.save(self.state_dir)
        self._say(f"submitted SLURM job {record.job_id} ({self.name}: {s['nodes']} nodes)")
        return record

    def _wait_for_agents(self, record: JobRecord) -> "HostMesh":
        from .._api.proc_mesh import hosts

        deadline = _time.monotonic() + self.timeout
        said = None
        while True:
            st = slurm_state(record.job_id)
            up, failed = _agents(record)  # an agent that failed says why better than the job's end
            if failed:
                node, why = failed[0]
                raise JobError(f"the host agent could not start on {node} (SLURM job {record.job_id}): {why}")
            if not st.usable:
                st = final_state(record.job_id, st)
                raise JobError(f"SLURM job {record.job_id} ({self.name}) ended while awaited: {st.state}"
                               + (f" ({st.reason})" if st.reason not in ("", "None") else "") + _tails(record))
            waits_for = f" ({st.reason})" if st.reason not in ("", "None") else ""
            line = f"SLURM job {record.job_id} {st.state.lower()}" + (
                waits_for if st.state == "PENDING" else f": {len(up)}/{record.spec['nodes']} host agents up")
            if line != said:
                self._say(line)
                said = line
            if len(up) == record.spec["nodes"]:
                break
            if _time.monotonic() > deadline:
                raise JobError(f"SLURM job {record.job_id} ({self.name}) not ready after {self.timeout:.0f} s "
                               f"({st.state.lower()}, {len(up)}/{record.spec['nodes']} host agents up)"
                               + _tails(record))
            _time.sleep(0.2)
        record.hosts = [up[n] for n in sorted(up)]
        record.save(self.state_dir)
        hm = hosts(record.hosts, key_file=job_key_file(self.state_dir))
        hm.initialized.get(timeout=max(5.0, deadline - _time.monotonic()))
        return hm

    # -- while in use ----------------------------------------------------------------------
    def _watch(self) -> None:
        if self._watcher is not None and self._watcher.is_alive():
            return
        # Notices go to the cell that started (or found) the job, as its other output does.
        self._watcher = threading.Thread(target=self._watch_loop, args=(self._record, current_cell()), daemon=True,
                                         name=f"xmesh-job-{self.name}")
        start_user_thread(self._watcher)  # it runs scontrol

    def _watch_loop(self, record: JobRecord, cell: str) -> None:
        """Loses the job's hosts at once when it ends (naming why) and says when its time limit nears."""
        from .._runtime.process import get_runtime

        # A malformed knob falls back to its default (_env), never ending the watch; no busy loop.
        every = max(0.1, env_float("XMESH_JOB_POLL_S", 10))
        warn_s = env_float("XMESH_JOB_NOTICE_S", 600)
        warned = False
        while self._record is record:
            try:
                st = slurm_state(record.job_id)
            except Exception:
                _time.sleep(every)
                continue
            if not st.usable:
                st = final_state(record.job_id, st)  # CANCELLED, TIMEOUT...: the cause, not COMPLETING
                self._ended = True
                rt = get_runtime()
                for h in record.hosts:
                    rt.node.lose_host(f"tcp://{h}", f"SLURM job {record.job_id} ({record.name}) ended: {st.state}"
                                      + (f" ({st.reason})" if st.reason not in ("", "None") else ""))
                return
            if st.seconds_left is not None and st.seconds_left < warn_s and not warned:
                warned = True
                get_runtime().diag(f"SLURM job {record.job_id} ({record.name}) reaches its time limit in "
                                   f"{st.seconds_left / 60:.0f} min", cell)
            _time.sleep(every)



class SSHJob(_Job):
    """Host agents started over SSH (the OpenSSH client with the user's own keys and
    configuration; `ssh_args` adds options, `-F config` say) on each of `hosts`, one host each in
    the HostMesh. The key reaches each host on ssh's standard input, never on a command line; the
    agents run in sessions of their own, so they outlive the connection and a restarted kernel
    finds them again (the job saved as SlurmJob's is). `kill()` stops them."""

    kind = "ssh"

    def __init__(self, hosts: Sequence[str], python: Optional[str] = None, port: int = 0, ssh: str = "ssh",
                 ssh_args: Sequence[str] = (), name: str = "xmesh", state_dir: Optional[str] = None,
                 replace: Optional[bool] = None, timeout: float = 60.0, progress: bool = True) -> None:
        super().__init__(name, state_dir, replace, timeout, progress)
        if isinstance(hosts, str) or not hosts or not all(isinstance(h, str) and h and not h.startswith("-")
                                                          for h in hosts):
            raise ValueError(f"hosts must be a non-empty list of host names, got {hosts!r}")
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"hosts names a host twice ({hosts!r}): one host agent runs per host")
        if isinstance(ssh_args, str) or not all(isinstance(a, str) for a in ssh_args):
            raise ValueError("ssh_args must be a list of strings (ssh's own options)")
        _check_port(port)
        self.spec = {"hosts": list(hosts), "python": python or PYTHON, "port": port, "ssh": ssh,
                     "ssh_args": list(ssh_args)}

    def _still_there(self, record: JobRecord) -> bool:
        if record.kind != "ssh":
            return True
        from .._api.proc_mesh import hosts

        try:
            hosts(record.hosts, key_file=job_key_file(self.state_dir)).initialized.get(timeout=10)
            return True
        except Exception:
            return False

    def _existing_or_new(self) -> JobRecord:
        return self._saved_or_refused() or self._start()

    def _start(self) -> JobRecord:
        key_file = job_key_file(self.state_dir)
        with open(key_file, "rb") as f:
            key = f.read()
        tag = f"{self.name}-{_core.random_hex(4)}"
        results: dict = {}
        threads = [threading.Thread(target=lambda h=h: results.__setitem__(h, self._start_one(h, tag, key)))
                   for h in self.spec["hosts"]]
        for t in threads:  # each starts ssh, whose SIGINT must not be blocked
            start_user_thread(t)
        for t in threads:
            t.join()
        failed = [f"{h}: {why}" for h, (status, why) in results.items() if status is None]
        agents = [dict(results[h][0], host=h) for h in self.spec["hosts"] if results[h][0] is not None]  # in order
        record = JobRecord("ssh", self.name, self.spec, tag, os.path.join(self.state_dir, "jobs", tag),
                           _time.time(), [a["addr"] for a in agents], agents)
        if failed:
            release(record)  # what did start stops again
            raise JobError("the host agents could not start over ssh on " + "; ".join(failed))
        record.save(self.state_dir)
        self._say(f"started host agents over ssh on {', '.join(self.spec['hosts'])}")
        return record

    def _start_one(self, host: str, tag: str, key: bytes) -> tuple:
        """(status, "") once the agent on host serves, else (None, why)."""
        try:
            towards = _address_towards_ssh_host(self.spec, host)
        except JobError as e:
            return None, str(e)
        d = _ssh_job_dir(tag, host)
        key_file = f"{d}/cluster.key"
        agent = [self.spec["python"], "-m", "xmesh._jobs.agent", "--detach", "--job-dir", d, "--towards", towards,
                 "--port", str(self.spec["port"]), "--key-file", key_file]
        command = (f"umask 077 && mkdir -p {shlex.quote(d)} && cat > {shlex.quote(key_file + '.new')} && "
                   f"mv -f {shlex.quote(key_file + '.new')} {shlex.quote(key_file)} && exec {shlex.join(agent)}")
        r = _ssh(self.spec, host, command, stdin=key, timeout=self.timeout)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode != 0 and not lines:
            return None, f"ssh exited with code {r.returncode}: {r.stderr.strip() or 'no word'}"
        try:
            status = json.loads(lines[-1])
        except (IndexError, ValueError):
            return None, f"the agent said nothing readable: {r.stdout.strip()[-500:]} {r.stderr.strip()[-500:]}"
        if status.get("state") != "serving":
            return None, f"it exited with code {status.get('exit')}; its log ends:\n{status.get('log', '').strip()}"
        return status, ""

    def _connect(self, record: JobRecord) -> "HostMesh":
        from .._api.proc_mesh import hosts

        hm = hosts(record.hosts, key_file=job_key_file(self.state_dir))
        hm.initialized.get(timeout=self.timeout)
        return hm


def _ssh_job_dir(tag: str, host: str) -> str:
    """An SSH job's directory on a host (relative to its home): one per host, since hosts often
    share their home directory (NFS) and two agents writing one key file would read each
    other's half-written copy."""
    return f".xmesh/jobs/{tag}-{re.sub(r'[^A-Za-z0-9_.-]', '_', host)}"


def _ssh(spec: dict, host: str, command: str, stdin: Optional[bytes] = None,
         timeout: float = 60.0) -> "subprocess.CompletedProcess[str]":
    r = subprocess.run([spec["ssh"], *spec["ssh_args"], host, command], input=stdin, capture_output=True,
                       timeout=timeout)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


def _address_towards_ssh_host(spec: dict, host: str) -> str:
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


@dataclass
class JobView:
    """`job.state()`: the HostMesh as `.hosts` (Monarch's style), and the job."""
    hosts: Any
    job: Any


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


def _agents(record: JobRecord) -> tuple:
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


def _tails(record: JobRecord) -> str:
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


def _spec_difference(saved: dict, wanted: dict) -> str:
    return ", ".join(f"{k}: {saved.get(k)!r} there, {wanted.get(k)!r} here" for k in sorted(set(saved) | set(wanted))
                     if saved.get(k) != wanted.get(k))
