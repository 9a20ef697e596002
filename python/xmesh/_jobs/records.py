"""What is saved of a job: its record (`<state_dir>/jobs/<name>.json`, this user's own, signed),
the state directory's key file, and the names a job may have."""
import hashlib
import hmac
import json
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .. import _core


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
        if self.kind not in ("slurm", "ssh", "kubernetes") or not isinstance(self.spec, dict):
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
        if self.kind == "kubernetes":
            meshes = self.spec.get("meshes")
            if not (isinstance(self.spec.get("namespace"), str) and isinstance(meshes, list)
                    and all(isinstance(m, dict) and isinstance(m.get("name"), str) for m in meshes)):
                raise ValueError("its Kubernetes settings")


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


def default_state_dir(state_dir: Optional[str] = None) -> str:
    return os.path.abspath(state_dir or os.path.join(os.getcwd(), ".xmesh"))


def describe(record: JobRecord) -> str:
    if record.kind == "slurm":
        return f"SLURM job {record.job_id} ({record.name})"
    if record.kind == "kubernetes":
        return f"Kubernetes job {record.name} ({len(record.hosts)} pods in namespace {record.spec.get('namespace')})"
    return f"SSH job {record.name} ({len(record.agents)} hosts)"
