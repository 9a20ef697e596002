"""`monarch.job` on xmesh: Monarch 0.7's job API over xmesh's jobs, so a Monarch program that
gets its hosts from `SlurmJob(meshes=...)` runs unchanged (`monarch.job.kubernetes`: KubernetesJob).

`job.state()` applies the job (or finds it running) and returns a `JobState` whose attributes are
the requested host meshes by name (`state.trainers`). One SLURM allocation serves every mesh of a
SlurmJob (`xmesh.SlurmJob` with the nodes of all meshes; each mesh is a slice of its hosts). The
job is kept where Monarch keeps it: `state(cached_path=".monarch/job_state.pkl")` writes that
pickle (for `job_load`) and xmesh's record beside it (`.monarch/jobs/NAME.json`, which `xmesh ls
--state-dir .monarch` shows), and a later `state()` with the same spec reconnects to the running
allocation; a saved job that cannot run the spec is released and a new one applied, as in
Monarch. README's Monarch table says where this differs.
"""
import os
import pickle
from typing import Any, Dict, List, Optional, Sequence

import xmesh
from xmesh import HostMesh
from xmesh._jobs.job import SlurmJob as _XmeshSlurmJob, SSHJob as _XmeshSSHJob, _Job
from xmesh._jobs.records import JobError, JobRecord

__all__ = ["JobState", "JobTrait", "LocalJob", "ProcessJob", "SSHJob", "SlurmJob", "job_load", "job_loads"]

DEFAULT_JOB_PATH = ".monarch/job_state.pkl"
_NO_START_TIMEOUT = 365 * 24 * 3600.0  # Monarch's job_start_timeout=None: wait as long as it takes


class JobState:
    """The host meshes of a job by name: `state.trainers` is the HostMesh of mesh "trainers"."""

    def __init__(self, hosts: Dict[str, HostMesh]) -> None:
        self._hosts = hosts

    def __getattr__(self, attr: str) -> HostMesh:
        hosts = self.__dict__.get("_hosts", {})
        if attr in hosts:
            return hosts[attr]
        raise AttributeError(f"'{attr}' is not a valid host mesh name. Available names: {', '.join(sorted(hosts))}")


class JobTrait:
    """A job's spec and, once applied, its allocation: `apply()`, `state()`, `kill()`,
    `can_run(spec)`, `dump(path)` / `dumps()`, `active`."""

    def __init__(self) -> None:
        self._job: Optional[_Job] = None
        self._where: Optional[tuple] = None  # (state_dir, name) of the xmesh job, once made

    # -- what each kind says ----------------------------------------------------------------
    def _spec(self) -> dict:
        raise NotImplementedError

    def _make(self, state_dir: str, name: str) -> Optional[_Job]:
        raise NotImplementedError

    def _meshes_of(self, hosts: Optional[HostMesh]) -> Dict[str, HostMesh]:
        raise NotImplementedError

    def _job_name(self) -> str:
        raise NotImplementedError

    # -- Monarch's API -----------------------------------------------------------------------
    def can_run(self, spec: "JobTrait") -> bool:
        """Whether this job's allocation can serve `spec` (same kind, same spec)."""
        return type(spec) is type(self) and spec._spec() == self._spec()

    @property
    def active(self) -> bool:
        """Applied and saved (also by the process that dumped this job)."""
        return self._where is not None and JobRecord.load(*self._where) is not None

    def apply(self, client_script: Optional[str] = None) -> None:
        """Brings the job into existence (or finds it running with this spec): submits and waits."""
        if client_script is not None:
            raise NotImplementedError(
                "apply(client_script=...) (Monarch's batch mode) is not supported by xmesh: the controller runs in "
                "your notebook or script; submit a script with sbatch yourself to run it inside an allocation")
        job = self._xmesh_job(DEFAULT_JOB_PATH)
        if job is not None:
            job.apply()

    def state(self, cached_path: Optional[str] = DEFAULT_JOB_PATH) -> JobState:
        """Applies the job (or reconnects to it, through the job saved beside cached_path) and
        returns its host meshes by name; with cached_path None a new allocation is made."""
        job = self._xmesh_job(cached_path)
        state = JobState(self._meshes_of(job.host_mesh if job is not None else None))
        if cached_path is not None:
            self.dump(cached_path)
        return state

    def kill(self) -> None:
        """Releases the allocation (scancel, agents stopped)."""
        job = self._xmesh_job(DEFAULT_JOB_PATH)
        if job is not None:
            job.kill()
        self._job = None

    def dump(self, filename: str) -> None:
        path = os.path.realpath(filename) if os.path.islink(filename) else filename
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            f.write(self.dumps())

    def dumps(self) -> bytes:
        return pickle.dumps(self)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_job"] = None  # the connection is made again, from the saved record
        return state

    # -- the xmesh job behind it ---------------------------------------------------------------
    def _xmesh_job(self, cached_path: Optional[str]) -> Optional[_Job]:
        if self._job is None:
            if self._where is None:
                if cached_path is None:  # not cached: an allocation of its own, under a name of its own
                    from xmesh import _core

                    self._where = (os.path.abspath(".monarch"), f"{self._job_name()}-{_core.random_hex(4)}")
                else:
                    self._where = (os.path.dirname(os.path.abspath(cached_path)), self._job_name())
            self._job = self._make(*self._where)
        return self._job


def _host_slices(hosts: HostMesh, sizes: Dict[str, int]) -> Dict[str, HostMesh]:
    """Consecutive slices of hosts, one per mesh, in the order the meshes were named."""
    out, first = {}, 0
    for name, n in sizes.items():
        out[name] = hosts.slice(hosts=slice(first, first + n))
        first += n
    return out


def _python(python_exe: str) -> Optional[str]:
    """Monarch's default "python" (whatever is first on the nodes' PATH) is the interpreter that
    runs xmesh here; any other path is used as given."""
    return None if python_exe == "python" else python_exe


class SlurmJob(JobTrait):
    """Monarch's SlurmJob: one allocation of `sum(meshes.values())` nodes (xmesh.SlurmJob);
    `state().NAME` is the HostMesh of mesh NAME. Arguments as in Monarch 0.7; `slurm_args` go to
    sbatch as they are, `exclusive`, `cpus_per_task`, `mem`, `qos` become sbatch's options."""

    def __init__(self, meshes: Dict[str, int], python_exe: str = "python", slurm_args: Sequence[str] = (),
                 monarch_port: int = 22222, job_name: str = "monarch_job", ntasks_per_node: int = 1,
                 time_limit: Optional[str] = None, partition: Optional[str] = None, log_dir: Optional[str] = None,
                 exclusive: bool = True, gpus_per_node: Optional[int] = None, cpus_per_task: Optional[int] = None,
                 mem: Optional[str] = None, job_start_timeout: Optional[int] = None,
                 account: Optional[str] = None, qos: Optional[str] = None) -> None:
        super().__init__()
        if not isinstance(meshes, dict) or not meshes or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
                for k, v in meshes.items()):
            raise ValueError(f"meshes must map mesh names to numbers of nodes (>= 1), got {meshes!r}")
        if ntasks_per_node != 1:
            raise ValueError("xmesh runs one host agent per node (ntasks_per_node=1); several procs per node come "
                             "from host_mesh.spawn_procs(per_host={'gpus': N})")
        self._meshes = dict(meshes)
        self._python_exe = python_exe
        self._slurm_args = list(slurm_args)
        self._port = monarch_port
        self._job_name_ = job_name
        self._time_limit = time_limit
        self._partition = partition
        self._log_dir = log_dir if log_dir is not None else os.getcwd()
        self._exclusive = exclusive
        self._gpus_per_node = gpus_per_node
        self._cpus_per_task = cpus_per_task
        self._mem = mem
        self._job_start_timeout = job_start_timeout
        self._account = account
        self._qos = qos

    def add_mesh(self, name: str, num_nodes: int) -> None:
        if not isinstance(name, str) or isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ValueError(f"add_mesh takes a mesh name and a number of nodes >= 1, got {name!r}, {num_nodes!r}")
        self._meshes[name] = num_nodes

    def _job_name(self) -> str:
        return self._job_name_

    def _sbatch_args(self) -> List[str]:
        args = ["--exclusive"] if self._exclusive else []
        for opt, value in (("--cpus-per-task", self._cpus_per_task), ("--mem", self._mem), ("--qos", self._qos)):
            if value is not None:
                args.append(f"{opt}={value}")
        return args + self._slurm_args

    def _spec(self) -> dict:
        return {"meshes": self._meshes, "python_exe": self._python_exe, "sbatch": self._sbatch_args(),
                "port": self._port, "time": self._time_limit, "partition": self._partition,
                "gpus_per_node": self._gpus_per_node, "account": self._account}

    def _make(self, state_dir: str, name: str) -> _Job:
        timeout = _NO_START_TIMEOUT if self._job_start_timeout is None else float(self._job_start_timeout)
        return _XmeshSlurmJob(nodes=sum(self._meshes.values()), gpus_per_node=self._gpus_per_node,
                              partition=self._partition, time=self._time_limit, account=self._account,
                              extra_args=self._sbatch_args(), name=name, port=self._port,
                              python=_python(self._python_exe), log_dir=self._log_dir, state_dir=state_dir,
                              replace=True, timeout=timeout)

    def _meshes_of(self, hosts: Optional[HostMesh]) -> Dict[str, HostMesh]:
        assert hosts is not None
        return _host_slices(hosts, self._meshes)


class SSHJob(JobTrait):
    """Monarch's SSHJob: `add_mesh(name, hosts)` for each mesh, host agents started over ssh
    (xmesh.SSHJob: the OpenSSH client, `ssh_args` its options) listening on `monarch_port`."""

    def __init__(self, python_exe: str = "python", ssh_args: Sequence[str] = (), monarch_port: int = 22222) -> None:
        super().__init__()
        self._python_exe = python_exe
        self._ssh_args = list(ssh_args)
        self._port = monarch_port
        self._meshes: Dict[str, List[str]] = {}

    def add_mesh(self, name: str, hosts: List[str]) -> None:
        taken = {h for hs in self._meshes.values() for h in hs}
        again = [h for h in hosts if h in taken or list(hosts).count(h) > 1]
        if again:
            raise ValueError(f"hosts {again} are named twice: xmesh runs one host agent per host, in one mesh")
        self._meshes[name] = list(hosts)

    def _job_name(self) -> str:
        return "monarch_ssh_job"

    def _spec(self) -> dict:
        return {"meshes": self._meshes, "python_exe": self._python_exe, "ssh_args": self._ssh_args, "port": self._port}

    def _make(self, state_dir: str, name: str) -> _Job:
        if not self._meshes:
            raise JobError("the SSHJob has no meshes: add_mesh(name, hosts) first")
        every = [h for hs in self._meshes.values() for h in hs]
        return _XmeshSSHJob(every, python=_python(self._python_exe), port=self._port, ssh_args=self._ssh_args,
                            name=name, state_dir=state_dir, replace=True)

    def _meshes_of(self, hosts: Optional[HostMesh]) -> Dict[str, HostMesh]:
        assert hosts is not None
        return _host_slices(hosts, {name: len(hs) for name, hs in self._meshes.items()})


class LocalJob(JobTrait):
    """This machine for every mesh named (`this_host()`): a stand-in so that a program switches
    between local and remote runs by its job alone."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        self._host_names = list(hosts)

    def can_run(self, spec: JobTrait) -> bool:
        return False

    def _job_name(self) -> str:
        return "local"

    def _spec(self) -> dict:
        return {"hosts": self._host_names}

    def _make(self, state_dir: str, name: str) -> Optional[_Job]:
        return None

    def _meshes_of(self, hosts: Optional[HostMesh]) -> Dict[str, HostMesh]:
        return {k: xmesh.this_host() for k in self._host_names}


class ProcessJob(JobTrait):
    """Monarch's ProcessJob: each host of each mesh is a host agent in a process of its own on
    this machine (its own runtime directory, as `run_worker_loop_forever("ipc://...")` starts
    one), to try multi-host programs on one machine. `env` is added to the environment of the
    agents and of every proc spawned on the job's hosts. `kill()` stops them; an agent left
    running exits by itself once idle (XMESH_HOSTD_IDLE, 300 s) with no controller and no procs."""

    def __init__(self, meshes: Dict[str, int], env: Optional[Dict[str, str]] = None) -> None:
        super().__init__()
        if not isinstance(meshes, dict) or not meshes or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
                for k, v in meshes.items()):
            raise ValueError(f"meshes must map mesh names to numbers of hosts (>= 1), got {meshes!r}")
        if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TypeError("env maps names to str values")
        self._meshes = dict(meshes)
        self._env = dict(env or {})
        self._dir: Optional[str] = None
        self._pids: List[int] = []

    def _job_name(self) -> str:
        return "process_job"

    def _spec(self) -> dict:
        return {"meshes": self._meshes, "env": self._env}

    def _make(self, state_dir: str, name: str) -> Optional[_Job]:
        return None  # its hosts are its own processes (_meshes_of starts them)

    def _workers(self) -> List[str]:
        assert self._dir is not None
        return [f"ipc://{self._dir}/{name}_{i}" for name, n in self._meshes.items() for i in range(n)]

    def _running(self) -> bool:
        return bool(self._pids) and all(os.path.exists(f"/proc/{pid}") for pid in self._pids)

    def _start(self) -> None:
        import subprocess
        import tempfile

        from xmesh._runtime.agents import hostd_environment, hostd_executable

        self.kill()
        self._dir = tempfile.mkdtemp(prefix="xmesh_process_job_")
        env = dict(os.environ, **hostd_environment(), **self._env)
        for address in self._workers():
            where = address[len("ipc://"):]
            os.makedirs(where, mode=0o700)
            # The agent's own lines go to its log (its procs' output comes to the program as
            # every proc's does): nothing of it holds the program's stdout or stderr.
            with open(os.path.join(where, "agent.log"), "ab") as log:
                proc = subprocess.Popen([hostd_executable(), "--runtime-dir", where], env=env,
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
            self._pids.append(proc.pid)

    def _meshes_of(self, hosts: Optional[HostMesh]) -> Dict[str, HostMesh]:
        from .._workers import attach_to_workers

        if not self._running():
            self._start()
        workers = attach_to_workers(self._workers())
        return _host_slices(workers.with_env(self._env) if self._env else workers, self._meshes)

    def can_run(self, spec: JobTrait) -> bool:
        return super().can_run(spec) and self._running()

    @property
    def active(self) -> bool:
        return self._running()

    def kill(self) -> None:
        """Stops its agents (SIGTERM: they stop their procs) and removes their directories."""
        import shutil
        import signal
        import time

        from xmesh._runtime.agents import release_agent
        from xmesh._runtime.process import current_runtime

        if self._dir is not None and current_runtime() is not None:  # their loss is no news to the program
            for address in self._workers():
                release_agent(address[len("ipc://"):], "its ProcessJob was killed")
        for pid in self._pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in self._pids) and time.monotonic() < deadline:
            for pid in self._pids:
                try:
                    os.waitpid(pid, os.WNOHANG)  # ours: reaped here; an earlier process's: gone by itself
                except ChildProcessError:
                    pass
            time.sleep(0.05)
        self._pids = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def job_loads(data: bytes) -> JobTrait:
    """A job from `job.dumps()`; its `state()` reconnects to the allocation it was saved with."""
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise TypeError(f"not a saved job: {type(job).__name__}")
    return job


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """A job from `job.dump(filename)` (the one `state()` saves at .monarch/job_state.pkl)."""
    with open(filename, "rb") as f:
        return job_loads(f.read())


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "kubernetes":  # a submodule (`from monarch.job import kubernetes`)
        import importlib

        return importlib.import_module(f"{__name__}.kubernetes")
    raise NotImplementedError(f"monarch.job.{name} is not supported by xmesh (supported: {', '.join(__all__)})")
