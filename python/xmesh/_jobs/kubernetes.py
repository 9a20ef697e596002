"""Kubernetes (issue 45): host agents in pods, found through the Kubernetes API.

A mesh is the pods a label selector finds (Monarch's default:
`app.kubernetes.io/name=monarch-worker,monarch.pytorch.org/mesh-name=NAME`), each running a host
agent started by its container command (`xmesh-hostd --listen tcp://$(POD_IP):PORT --key-file
/etc/xmesh/cluster.key`, the key a Secret: examples/kubernetes/xmesh-workers.yaml). A pod's rank
is a label of it (a StatefulSet's `apps.kubernetes.io/pod-index`); only Ready pods count, and a
mesh is ready when ranks 0..N-1 all are. The pods are listed once, then watched from that
listing's resourceVersion until the mesh is ready (a watch that expired, 410 Gone, lists again).

Inside the cluster the controller dials the pods' IPs. Outside it (a kubeconfig), the pods'
network is reached through one forwarded port, `attach_to` or a `kubectl port-forward` to the
first pod started here: that pod's agent is the gateway of `xmesh.hosts` (every connection this
controller opens goes through it; the nodes never connect back). This module only talks to the
Kubernetes API and to kubectl; the job itself (its record, `host_mesh`, `kill()`) is
`KubernetesJob` in job.py.
"""
import atexit
import collections
import os
import re
import select
import shutil
import subprocess
import time as _time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .records import JobError

DEFAULT_PORT = 26600  # Monarch's worker port: its manifests' pods serve here
DEFAULT_RANK_LABEL = "apps.kubernetes.io/pod-index"  # a StatefulSet's pod index
PORT_NAME = "xmesh"  # a container port of this name is the agent's
PORT_ENVS = ("XMESH_PORT", "MONARCH_PORT")  # else one of these in the container's environment
FORWARD_START_S = 30.0  # a kubectl port-forward that says nothing for this long is given up
WATCH_CHUNK_S = 30  # one watch request's server-side timeout: progress is said between them
_RFC_1123_LABEL = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")


def default_selector(mesh: str) -> str:
    return f"app.kubernetes.io/name=monarch-worker,monarch.pytorch.org/mesh-name={mesh}"


def check_mesh_name(name: str) -> None:
    """A mesh name is an RFC 1123 label (it is a label value and, provisioned, an object's name)."""
    if not isinstance(name, str) or not _RFC_1123_LABEL.match(name):
        raise ValueError(f"mesh name {name!r}: use 1-63 lowercase letters, digits or '-', starting with a letter "
                         "and ending with a letter or digit (an RFC 1123 label)")


def _client() -> tuple:
    """The official client's modules; JobError saying how to install it when it is missing."""
    try:
        from kubernetes import client, config, watch
    except ImportError:
        raise JobError("KubernetesJob needs the official Kubernetes client: `pip install 'xmesh[kubernetes]'` (or "
                       "`pip install kubernetes`; Debian: python3-kubernetes)") from None
    return client, config, watch


@dataclass(frozen=True)
class KubeConfig:
    """How this controller reaches the Kubernetes API: a kubeconfig file (`local`: outside the
    cluster), a client Configuration made in this process (`remote`), or neither (inside the
    cluster: the pod's service account)."""
    local: Optional[str] = None
    remote: Any = None

    @classmethod
    def from_path(cls, path: str) -> "KubeConfig":
        return cls(local=os.path.abspath(os.path.expanduser(os.fspath(path))))

    @classmethod
    def from_config(cls, configuration: Any) -> "KubeConfig":
        return cls(remote=configuration)

    @property
    def out_of_cluster(self) -> bool:
        return self.local is not None or self.remote is not None

    def saved_form(self) -> Any:
        """What a job's record keeps of it: the kubeconfig's path, None (in the cluster), or for a
        Configuration made in a process (not saved) the API server it names."""
        if self.remote is not None:
            return {"api_server": str(getattr(self.remote, "host", "?"))}
        return self.local

    def describe(self) -> str:
        if self.local is not None:
            return f"the kubeconfig {self.local}"
        if self.remote is not None:
            return f"the API server at {getattr(self.remote, 'host', '?')}"
        return "this pod's service account (in-cluster configuration)"

    def core_api(self) -> Any:
        """A CoreV1Api on a client of its own (the process's default configuration is left alone)."""
        client, config, _ = _client()
        if self.remote is not None:
            return client.CoreV1Api(client.ApiClient(self.remote))
        if self.local is not None:
            if not os.path.isfile(self.local):
                raise JobError(f"no kubeconfig at {self.local}")
            try:
                return client.CoreV1Api(config.new_client_from_config(config_file=self.local))
            except (config.ConfigException, KeyError, TypeError, ValueError) as e:
                raise JobError(f"the kubeconfig {self.local} does not read: {e}") from None
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as e:
            raise JobError(f"not inside a Kubernetes cluster ({e}): outside one, pass kubeconfig= (a path or "
                           "KubeConfig.from_path)") from None
        return client.CoreV1Api(client.ApiClient(configuration))


@dataclass(frozen=True)
class MeshSpec:
    """One mesh of a job: its name, how many ranks, how its pods are found and ranked, the port."""
    name: str
    num_replicas: int
    label_selector: str
    pod_rank_label: str = DEFAULT_RANK_LABEL
    port: int = DEFAULT_PORT


@dataclass(frozen=True)
class Pod:
    """A Ready pod of a mesh: its name, IP, the port its agent serves on and its rank."""
    name: str
    ip: str
    port: int
    rank: int

    @property
    def locator(self) -> str:
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"


def pod_ready(pod: Any) -> bool:
    """Its Ready condition is True (the agent's readiness probe passed) and it has an IP."""
    status = pod.status
    if status is None or not status.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def pod_rank(pod: Any, label: str) -> Optional[int]:
    """The rank its label says; None when it has none or it is not a whole number."""
    text = (pod.metadata.labels or {}).get(label)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def pod_port(pod: Any, default: int) -> int:
    """The agent's port: a container port named "xmesh", else XMESH_PORT or MONARCH_PORT in a
    container's environment, else the mesh's port."""
    containers = pod.spec.containers if pod.spec is not None else []
    for c in containers or []:
        for p in c.ports or []:
            if p.name == PORT_NAME and p.container_port:
                return int(p.container_port)
    for c in containers or []:
        for e in c.env or []:
            if e.name in PORT_ENVS and e.value and e.value.isdigit() and 0 < int(e.value) < 65536:
                return int(e.value)
    return default


class MeshWatch:
    """The Ready pods of one mesh by rank, kept from a listing and the watch events after it."""

    def __init__(self, mesh: MeshSpec, warn: Callable[[str], None]) -> None:
        self.mesh = mesh
        self.ready: dict[int, Pod] = {}
        self._warn = warn
        self._warned: set = set()

    def absorb(self, pod: Any, deleted: bool = False) -> None:
        rank = pod_rank(pod, self.mesh.pod_rank_label)
        name = pod.metadata.name
        if rank is None or not 0 <= rank < self.mesh.num_replicas:
            if name not in self._warned:
                self._warned.add(name)
                self._warn(f"pod {name} of mesh {self.mesh.name} is left out: its label {self.mesh.pod_rank_label!r} "
                           f"is {(pod.metadata.labels or {}).get(self.mesh.pod_rank_label)!r}, not a rank 0-"
                           f"{self.mesh.num_replicas - 1}")
            return
        if deleted or not pod_ready(pod):
            if self.ready.get(rank) is not None and self.ready[rank].name == name:
                del self.ready[rank]
            return
        self.ready[rank] = Pod(name, pod.status.pod_ip, pod_port(pod, self.mesh.port), rank)

    @property
    def complete(self) -> bool:
        return len(self.ready) == self.mesh.num_replicas

    def missing(self) -> list:
        return [r for r in range(self.mesh.num_replicas) if r not in self.ready]

    def pods(self) -> list:
        return [self.ready[r] for r in range(self.mesh.num_replicas)]


def _api_error(e: Any, namespace: str, what: str) -> JobError:
    status = getattr(e, "status", None)
    if status == 403:
        hint = (f": this identity may not {what} in namespace {namespace} (RBAC: a Role granting get, list and "
                "watch on pods, bound to it)")
    elif status == 404:
        hint = f": no namespace {namespace}?"
    elif status == 401:
        hint = ": the credentials were refused (an expired token?)"
    else:
        hint = ""
    reason = getattr(e, "reason", None) or str(e)
    return JobError(f"the Kubernetes API refused to {what} in namespace {namespace} "
                    f"({status or 'no status'} {reason}){hint}")


def _list(api: Any, namespace: str, mesh: MeshSpec, watch: MeshWatch) -> str:
    """Lists the mesh's pods into watch; the listing's resourceVersion."""
    from kubernetes.client.rest import ApiException

    try:
        listing = api.list_namespaced_pod(namespace, label_selector=mesh.label_selector, _request_timeout=30)
    except ApiException as e:
        raise _api_error(e, namespace, "list pods") from None
    except Exception as e:  # urllib3's connection errors: the API server is not reached
        raise JobError(f"the Kubernetes API server was not reached ({type(e).__name__}: {e})") from None
    watch.ready.clear()
    for pod in listing.items:
        watch.absorb(pod)
    return listing.metadata.resource_version


def _watch_once(api: Any, namespace: str, mesh: MeshSpec, watch: MeshWatch, version: str, seconds: int) -> str:
    """Follows the mesh's pods from version for at most seconds (or until it is complete); the
    last version seen, "" when the watch expired (410 Gone: list again)."""
    from kubernetes.client.rest import ApiException

    _, _, kwatch = _client()
    w = kwatch.Watch()
    try:
        for event in w.stream(api.list_namespaced_pod, namespace, label_selector=mesh.label_selector,
                              resource_version=version, timeout_seconds=seconds,
                              allow_watch_bookmarks=False, _request_timeout=seconds + 10):
            kind, pod = event["type"], event["object"]
            if kind == "ERROR":
                raw = event.get("raw_object") or {}
                if raw.get("code") == 410:
                    return ""
                raise JobError(f"the watch of mesh {mesh.name}'s pods failed: {raw.get('message', raw)}")
            watch.absorb(pod, deleted=kind == "DELETED")
            version = pod.metadata.resource_version or version
            if watch.complete:
                break
    except ApiException as e:
        if e.status == 410:
            return ""
        raise _api_error(e, namespace, "watch pods") from None
    except JobError:
        raise
    except Exception as e:
        raise JobError(f"the watch of mesh {mesh.name}'s pods broke ({type(e).__name__}: {e})") from None
    finally:
        w.stop()
    return version


def ready_pods(api: Any, namespace: str, mesh: MeshSpec, timeout: Optional[float],
               say: Callable[[str], None]) -> list:
    """The mesh's Ready pods by rank, waiting for all of ranks 0..N-1 (timeout None: as long as
    it takes); progress through say. JobError naming the missing ranks at the timeout."""
    watch = MeshWatch(mesh, say)
    deadline = None if timeout is None else _time.monotonic() + timeout
    version = _list(api, namespace, mesh, watch)
    said = ""
    while not watch.complete:
        line = f"mesh {mesh.name}: {len(watch.ready)}/{mesh.num_replicas} pods ready (waiting for ranks " \
               f"{_ranks(watch.missing())})"
        if line != said:
            say(line)
            said = line
        left = WATCH_CHUNK_S if deadline is None else deadline - _time.monotonic()
        if left <= 0:
            raise JobError(f"mesh {mesh.name} not ready after {timeout:.0f} s: {len(watch.ready)}/"
                           f"{mesh.num_replicas} pods Ready with {mesh.label_selector!r} in namespace {namespace}, "
                           f"ranks {_ranks(watch.missing())} missing (label {mesh.pod_rank_label!r})")
        version = _watch_once(api, namespace, mesh, watch, version, max(1, min(WATCH_CHUNK_S, int(left + 0.999))))
        if not version:
            version = _list(api, namespace, mesh, watch)
    return watch.pods()


def current_pods(api: Any, namespace: str, mesh: MeshSpec) -> list:
    """The mesh's Ready pods now (one listing), by rank; ranks missing are left out."""
    watch = MeshWatch(mesh, lambda _: None)
    _list(api, namespace, mesh, watch)
    return [watch.ready[r] for r in sorted(watch.ready)]


def _ranks(ranks: list) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


class PortForward:
    """`kubectl port-forward pod/NAME :PORT` to one pod, its local end on this machine's loopback;
    ended by close() or when this process exits normally (a SIGKILLed controller leaves it: it
    holds a local port only)."""

    _LINE = re.compile(r"Forwarding from (?:127\.0\.0\.1|\[::1\]):(\d+) ->")

    def __init__(self, namespace: str, pod: Pod, kubeconfig: Optional[str]) -> None:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise JobError("outside the cluster the pods are reached through `kubectl port-forward`, and no kubectl "
                           "is on PATH: install it, or forward a pod's port yourself and pass attach_to='localhost:PORT'")
        argv = [kubectl, "port-forward", "--namespace", namespace, f"pod/{pod.name}", f":{pod.port}"]
        if kubeconfig is not None:
            argv += ["--kubeconfig", kubeconfig]
        self.pod = pod
        self.said: "collections.deque[str]" = collections.deque(maxlen=20)  # its last lines but connections
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.local = f"127.0.0.1:{self._local_port()}"
        _live_forwards.add(self)

    def _local_port(self) -> int:
        """The port kubectl's first line names; JobError with its words when it says none in time."""
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], FORWARD_START_S)
        line = self.process.stdout.readline() if ready else ""
        match = self._LINE.search(line)
        if match:
            self._drain()
            return int(match.group(1))
        self.close()
        said = (self.process.stderr.read() if self.process.stderr else "").strip()
        what = "said nothing within {:.0f} s".format(FORWARD_START_S) if not ready else f"said {line.strip()!r}"
        raise JobError(f"`kubectl port-forward pod/{self.pod.name}` {what}" + (f": {said[-500:]}" if said else ""))

    def _drain(self) -> None:
        """kubectl writes a line per connection ("Handling connection for ..."): read and dropped
        (its other lines, its errors, kept for last_words), or a full pipe would stop the forward."""
        import threading

        for stream in (self.process.stdout, self.process.stderr):
            threading.Thread(target=self._read_lines, args=(stream,), daemon=True,
                             name="xmesh-kubectl-port-forward").start()

    def _read_lines(self, stream: Any) -> None:
        for line in stream:
            if not line.startswith(("Handling connection", "Forwarding from")):
                self.said.append(line.rstrip())

    def last_words(self) -> str:
        """What kubectl said besides its connections (its errors), for a forward that ended."""
        said = list(self.said)
        return "; ".join(said[-3:]) if said else f"kubectl exited with code {self.process.poll()}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        _live_forwards.discard(self)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_live_forwards: "set[PortForward]" = set()


@atexit.register
def _close_forwards() -> None:
    for forward in list(_live_forwards):
        forward.close()
