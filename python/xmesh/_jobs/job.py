"""Jobs on schedulers (issue 21): hosts from SLURM, over SSH or in Kubernetes pods, kept across
kernel restarts.

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
import json
import os
import shlex
import subprocess
import threading
import time as _time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .. import _core
from .._base.context import current_cell
from .._base.env import env_float
from .._base.threads import start_user_thread
from .._runtime.agents import HostdError, tcp_locator
from .._runtime.process import interpreter
from .control import (SlurmState, address_towards_slurmctld, address_towards_ssh_host, final_state, output_tails,
                      release, reported_agents, run_ssh, slurm_state, ssh_job_dir, stop_job)
from .kubernetes import (DEFAULT_PORT, DEFAULT_RANK_LABEL, KubeConfig, MeshSpec, PortForward, check_mesh_name,
                         current_pods, default_selector, ready_pods)
from .records import NAME, JobError, JobRecord, default_state_dir, describe, job_key_file

if TYPE_CHECKING:
    from .._api.proc_mesh import HostMesh


def _check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be 0 (any free one) to 65535, got {port!r}")


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

    def _say_pythons(self, hm: "HostMesh") -> None:
        """Which Python the job's procs run (the environment each agent was started in)."""
        from .._runtime.agents import agent_at

        agents = map(agent_at, hm.runtime_dirs)
        pythons = sorted({f"Python {a.python_version} ({a.python})" for a in agents if a.python})
        if pythons:
            self._say(f"{self.name}'s procs run {', '.join(pythons)}")

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
                     "account": account, "extra_args": list(extra_args), "port": port, "python": python or interpreter(),
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
        agent = [str(s["python"]), "-m", "xmesh._jobs.agent", "--job-dir", job_dir, "--towards", address_towards_slurmctld(),
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
            up, failed = reported_agents(record)  # an agent that failed says why better than the job's end
            if failed:
                node, why = failed[0]
                raise JobError(f"the host agent could not start on {node} (SLURM job {record.job_id}): {why}")
            if not st.usable:
                st = final_state(record.job_id, st)
                raise JobError(f"SLURM job {record.job_id} ({self.name}) ended while awaited: {st.state}"
                               + (f" ({st.reason})" if st.reason not in ("", "None") else "") + output_tails(record))
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
                               + output_tails(record))
            _time.sleep(0.2)
        record.hosts = [up[n] for n in sorted(up)]
        record.save(self.state_dir)
        hm = hosts(record.hosts, key_file=job_key_file(self.state_dir))
        hm.initialized.get(timeout=max(5.0, deadline - _time.monotonic()))
        self._say_pythons(hm)
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
        # Set, it is the notice's lead whatever the limit; else 10 min, or the last fifth of a shorter job.
        fifth = "XMESH_JOB_NOTICE_S" not in os.environ
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
            if not warned and st.notice_due(warn_s, fifth):
                warned = True
                get_runtime().diag(f"SLURM job {record.job_id} ({record.name}) reaches its time limit in "
                                   f"{(st.seconds_left or 0) / 60:.0f} min", cell)
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
        self.spec = {"hosts": list(hosts), "python": python or interpreter(), "port": port, "ssh": ssh,
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
            towards = address_towards_ssh_host(self.spec, host)
        except JobError as e:
            return None, str(e)
        d = ssh_job_dir(tag, host)
        key_file = f"{d}/cluster.key"
        agent = [self.spec["python"], "-m", "xmesh._jobs.agent", "--detach", "--job-dir", d, "--towards", towards,
                 "--port", str(self.spec["port"]), "--key-file", key_file]
        command = (f"umask 077 && mkdir -p {shlex.quote(d)} && cat > {shlex.quote(key_file + '.new')} && "
                   f"mv -f {shlex.quote(key_file + '.new')} {shlex.quote(key_file)} && exec {shlex.join(agent)}")
        r = run_ssh(self.spec, host, command, stdin=key, timeout=self.timeout)
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
        self._say_pythons(hm)
        return hm


class KubernetesJob(_Job):
    """Host agents in Kubernetes pods (Monarch's attach mode): `add_mesh(name, num_replicas)` for
    each mesh; its pods are found through the Kubernetes API by label selector (Monarch's default
    `app.kubernetes.io/name=monarch-worker,monarch.pytorch.org/mesh-name=NAME`), ranked by a label
    (`apps.kubernetes.io/pod-index`), and must run `xmesh-hostd --listen tcp://$(POD_IP):PORT
    --key-file ...` with the controller's key (a Secret; examples/kubernetes/xmesh-workers.yaml).
    `job.host_mesh` waits until every rank's pod is Ready (timeout None: as long as it takes) and
    has one host per pod, the meshes' pods in the order they were added (`job.state().NAME` in the
    monarch shim is one mesh).

    Inside the cluster (no kubeconfig) the pods are dialled at their IPs. Outside it (kubeconfig: a
    path or KubeConfig) the controller reaches them through one forwarded port: attach_to
    ("localhost:PORT", a forward you made to any pod's agent port), else a `kubectl port-forward`
    it starts to the first pod (port_forward=False: the pods' IPs are routed here, a VPN);
    every connection then goes through that pod's agent, and the nodes never connect back.
    `kill()` stops the procs on the pods (the pods are the cluster's and stay) and forgets the job.
    key_file: the cluster key (default $XMESH_KEY_FILE, else the state directory's, made once:
    put it in the Secret with `kubectl create secret generic xmesh-key --from-file=cluster.key=...`)."""

    kind = "kubernetes"

    def __init__(self, namespace: str = "default", timeout: Optional[float] = None, kubeconfig: Any = None,
                 attach_to: Optional[str] = None, meshes: Sequence[dict] = (), key_file: Optional[str] = None,
                 port_forward: Optional[bool] = None, name: str = "xmesh", state_dir: Optional[str] = None,
                 progress: bool = True) -> None:
        super().__init__(name, state_dir, True, 60.0 if timeout is None else timeout, progress)
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"namespace must be a Kubernetes namespace's name, got {namespace!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be seconds > 0 or None (wait as long as it takes), got {timeout!r}")
        if attach_to is not None and tcp_locator(attach_to) is None:
            raise ValueError(f"attach_to={attach_to!r}: give the host:port of a forwarded agent port "
                             "(e.g. 'localhost:26600' after `kubectl port-forward pod/NAME 26600`)")
        self._kube = _kube_config(kubeconfig)
        self._wait_s = None if timeout is None else float(timeout)
        self._forward: Optional[PortForward] = None
        self._pods: list = []
        self.spec = {"namespace": namespace, "timeout": timeout, "kubeconfig": self._kube.saved_form(),
                     "attach_to": attach_to, "meshes": [], "key_file": os.path.abspath(key_file) if key_file else None,
                     "port_forward": port_forward}
        for m in meshes:
            self.add_mesh(**m)

    def add_mesh(self, name: str, num_replicas: int, label_selector: Optional[str] = None,
                 pod_rank_label: str = DEFAULT_RANK_LABEL, port: int = DEFAULT_PORT) -> None:
        """A mesh of num_replicas pods (ranks 0..num_replicas-1) found by label_selector (default
        Monarch's for `name`), ranked by the label pod_rank_label, their agents on port (a container
        port named "xmesh", or XMESH_PORT / MONARCH_PORT in the pod's spec, says otherwise)."""
        check_mesh_name(name)
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be a whole number >= 1, got {num_replicas!r}")
        if label_selector is not None and (not isinstance(label_selector, str) or not label_selector.strip()):
            raise ValueError(f"label_selector must be a Kubernetes label selector, got {label_selector!r}")
        if not isinstance(pod_rank_label, str) or not pod_rank_label:
            raise ValueError(f"pod_rank_label must name a pod label, got {pod_rank_label!r}")
        _check_port(port)
        if port == 0:
            raise ValueError("port must be the agents' port in the pods (1-65535), not 0")
        if any(m["name"] == name for m in self.spec["meshes"]):
            raise ValueError(f"a mesh {name!r} was added already")
        self.spec["meshes"].append({"name": name, "num_replicas": num_replicas,
                                    "label_selector": label_selector or default_selector(name),
                                    "pod_rank_label": pod_rank_label, "port": port})

    @property
    def mesh_sizes(self) -> dict:
        """Each mesh's number of hosts, in the order of host_mesh's hosts."""
        return {m["name"]: m["num_replicas"] for m in self.spec["meshes"]}

    def kill(self) -> None:
        """Stops the procs of every allocation on the job's pods (whichever controller made them,
        as ending a SLURM job does), closes the port forward and forgets the job; the pods stay
        (they are the cluster's: `kubectl delete` ends them)."""
        from .._runtime.agents import agent_at

        record = self._record or JobRecord.load(self.state_dir, self.name)
        if record is not None and record.kind == self.kind:
            try:
                hm = self._host_mesh if self._host_mesh is not None else self.attach()._host_mesh
                for locator in hm.runtime_dirs:
                    a = agent_at(locator).connect()
                    for alloc in a.status().allocations:
                        a.stop_procs(alloc=alloc.alloc)
            except (JobError, ConnectionError, HostdError) as e:
                self._say(f"the pods' procs could not be stopped ({e}): they end with their controllers, named "
                          "allocations stay")
        super().kill()
        self._close_forward()

    # -- the scheduler's part ---------------------------------------------------------------
    def _meshes(self) -> list:
        if not self.spec["meshes"]:
            raise JobError("the KubernetesJob has no meshes: add_mesh(name, num_replicas) first")
        return [MeshSpec(**m) for m in self.spec["meshes"]]

    def _still_there(self, record: JobRecord) -> bool:
        if record.kind != self.kind:
            return True
        if self._forward is not None and not self._forward.alive:
            self._say(f"the port forward to pod/{self._forward.pod.name} ended ({self._forward.last_words()}): "
                      "finding the pods again")
            return False
        api = self._kube.core_api()
        now = [p.locator for m in self._meshes() for p in current_pods(api, self.spec["namespace"], m)]
        return now == record.hosts

    def _existing_or_new(self) -> JobRecord:
        saved = JobRecord.load(self.state_dir, self.name)
        if saved is not None and saved.kind != self.kind:
            raise JobError(f"{describe(saved)} is saved as {self.name!r}: use another name, or `xmesh stop "
                           f"{self.name}` first")
        api = self._kube.core_api()
        self._say(f"finding the pods of {', '.join(m.name for m in self._meshes())} in namespace "
                  f"{self.spec['namespace']} through {self._kube.describe()}")
        deadline = None if self._wait_s is None else _time.monotonic() + self._wait_s
        self._pods = []
        for m in self._meshes():
            left = None if deadline is None else max(1.0, deadline - _time.monotonic())
            self._pods += ready_pods(api, self.spec["namespace"], m, left, self._say)
        record = JobRecord(self.kind, self.name, self.spec, f"k8s-{_core.random_hex(4)}",
                           os.path.join(self.state_dir, "jobs"), _time.time(), [p.locator for p in self._pods])
        record.save(self.state_dir)
        return record

    def _connect(self, record: JobRecord) -> "HostMesh":
        from .._api.proc_mesh import hosts

        hm = hosts(record.hosts, key_file=self._key_file(), gateway=self._gateway(record))
        hm.initialized.get(timeout=self.timeout)
        self._say(f"{len(record.hosts)} pods' host agents answer (" +
                  ", ".join(f"{m['name']}: {m['num_replicas']}" for m in self.spec["meshes"]) + ")")
        self._say_pythons(hm)
        return hm

    def _key_file(self) -> str:
        return self.spec["key_file"] or os.environ.get("XMESH_KEY_FILE") or job_key_file(self.state_dir)

    def _gateway(self, record: JobRecord) -> Optional[str]:
        """Where the pods are reached from outside the cluster: attach_to, else the local end of a
        kubectl port-forward to the first pod (None: dialled directly)."""
        if self.spec["attach_to"]:
            return self.spec["attach_to"]
        if not self._kube.out_of_cluster or self.spec["port_forward"] is False:
            return None
        if self._forward is not None and self._forward.alive and self._forward.pod.locator in record.hosts:
            return self._forward.local
        self._close_forward()
        pods = self._pods or [p for m in self._meshes() for p in current_pods(self._kube.core_api(),
                                                                                self.spec["namespace"], m)]
        first = next((p for p in pods if p.locator == record.hosts[0]), None)
        if first is None:
            raise JobError(f"the pod at {record.hosts[0]} is gone: the job's pods changed (apply it again)")
        self._forward = PortForward(self.spec["namespace"], first, self._kube.local)
        self._say(f"reaching the pods through `kubectl port-forward pod/{first.name}` (localhost:"
                  f"{self._forward.local.rsplit(':', 1)[1]})")
        return self._forward.local

    def _close_forward(self) -> None:
        if self._forward is not None:
            self._forward.close()
            self._forward = None


def _kube_config(kubeconfig: Any) -> KubeConfig:
    if kubeconfig is None:
        return KubeConfig()
    if isinstance(kubeconfig, KubeConfig):
        return kubeconfig
    if isinstance(kubeconfig, (str, os.PathLike)):
        return KubeConfig.from_path(os.fspath(kubeconfig))
    if isinstance(kubeconfig, dict) and "api_server" in kubeconfig:  # a saved job's: see KubeConfig.saved_form
        raise JobError(f"this job was made with a client Configuration of its own (API server "
                       f"{kubeconfig['api_server']}), which is not saved: make it again in the program, with "
                       "KubeConfig.from_config")
    raise ValueError(f"kubeconfig must be a path or a KubeConfig, got {type(kubeconfig).__name__}")


@dataclass
class JobView:
    """`job.state()`: the HostMesh as `.hosts` (Monarch's style), and the job."""
    hosts: Any
    job: Any


def saved_job(name: str, state_dir: Optional[str] = None) -> "_Job":
    """The job saved as `name`, rebuilt from its record (its spec is the constructor's
    arguments), not yet connected: `.attach()` connects without ever submitting."""
    d = default_state_dir(state_dir)
    record = JobRecord.load(d, name)
    if record is None:
        raise JobError(f"no job {name!r} is saved in {d} (`xmesh ls --state-dir DIR` lists the jobs of a directory)")
    kind = {"slurm": SlurmJob, "ssh": SSHJob, "kubernetes": KubernetesJob}.get(record.kind)
    if kind is None:
        raise JobError(f"the saved job {JobRecord.path(d, name)} is of an unknown kind {record.kind!r}")
    try:
        return kind(**record.spec, name=name, state_dir=d)
    except (TypeError, ValueError) as e:
        raise JobError(f"the saved job {JobRecord.path(d, name)} does not read ({e}): remove it") from None


def _spec_difference(saved: dict, wanted: dict) -> str:
    return ", ".join(f"{k}: {saved.get(k)!r} there, {wanted.get(k)!r} here" for k in sorted(set(saved) | set(wanted))
                     if saved.get(k) != wanted.get(k))
