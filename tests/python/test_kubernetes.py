"""KubernetesJob (issue 45): host agents in pods, found through the Kubernetes API (attach mode),
reached from inside the cluster at the pods' IPs and from outside through one forwarded port.

No cluster exists on this machine, so: the API is k8s_replay (recorded responses: a PodList per
mesh, watch streams, a 403), each pod is a namespace host whose agent is started by the container
command of examples/kubernetes/xmesh-workers.yaml ($(POD_IP) filled in, the key a 0400 file as the
Secret's volume gives it), and `kubectl port-forward` is kubectl_standin.py. Not tested here: the
in-cluster service account (the client's load_incluster_config), a real API server's watch timing,
the real kubectl's tunnel through the API server, pod IPs through a CNI. Skipped, saying why, only
where namespaces cannot be made."""
import json
import os
import socket
import subprocess
import textwrap
import time

import pytest
import yaml
from netns_hosts import NetnsHosts, unavailable
from xmesh_testing import PYTHON, private_tmpdir, wait_until

import xmesh
from k8s_replay import ApiReplay
from xmesh import _core

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"namespace hosts unavailable: {WHY_NOT}")

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(os.environ.get("XMESH_SOURCE_DIR", os.path.join(HERE, "..", "..")), "examples",
                        "kubernetes", "xmesh-workers.yaml")
WATCH_AFTER_EXPIRY = {"trainers": ["watch-expired.jsonl", "watch-trainers.jsonl"]}


def worker_container() -> dict:
    (statefulset,) = [d for d in yaml.safe_load_all(open(MANIFEST)) if d["kind"] == "StatefulSet"]
    return statefulset["spec"]["template"]["spec"]["containers"][0]


def agent_command(ip: str, port: int, key: str) -> list:
    """The manifest's container command, as Kubernetes runs it in a pod at ip (its $(POD_IP)
    expanded, the Secret mounted at key's directory), on port."""
    c = worker_container()
    argv = [os.environ["XMESH_HOSTD"] if a == "xmesh-hostd" else a for a in c["command"] + c["args"]]
    return [a.replace("$(POD_IP)", ip).replace(":26600", f":{port}").replace("/etc/xmesh/cluster.key", key)
            for a in argv]


class Pods:
    """Three pods (trainers-0, trainers-1 on port 26600, gen-0 on 26700) on namespace hosts 0-2;
    host 3 is a laptop outside the cluster."""

    def __init__(self, net: NetnsHosts, tmp: str) -> None:
        self.net, self.tmp = net, tmp
        self.key = os.path.join(tmp, "secret", "cluster.key")
        os.makedirs(os.path.dirname(self.key), mode=0o700)
        _core.write_new_key_file(self.key)
        os.chmod(self.key, 0o400)  # the Secret's defaultMode
        self.ips = {f"IP{i}": net.hosts[i].addr for i in range(3)}
        self.agents = [self._start(i, port) for i, port in ((0, 26600), (1, 26600), (2, 26700))]

    def _start(self, i: int, port: int) -> subprocess.Popen:
        rundir = os.path.join(self.tmp, f"rt-{i}")
        os.makedirs(rundir, mode=0o700)
        log = os.path.join(self.tmp, f"agent-{i}.log")
        with open(log, "w") as f:
            p = self.net.hosts[i].popen(agent_command(self.net.hosts[i].addr, port, self.key),
                                        env=dict(os.environ, XMESH_RUNTIME_DIR=rundir), stdout=f,
                                        stderr=subprocess.STDOUT)
        assert wait_until(lambda: "serving" in open(log).read() or p.poll() is not None, 20)
        assert p.poll() is None, open(log).read()
        return p

    def close(self) -> None:
        for p in self.agents:
            p.terminate()
        for p in self.agents:
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def pods():
    tmp = private_tmpdir("xmesh-k8s-")
    with NetnsHosts(4, hidden=[_core.runtime_dir()]) as net:
        p = Pods(net, tmp)
        try:
            yield p
        finally:
            p.close()


class Where(xmesh.Actor):
    @xmesh.endpoint
    def where(self) -> str:
        print(f"on {socket.gethostname()}", flush=True)
        return socket.gethostname()


def test_the_example_manifest_runs_agents_the_job_finds():
    """The pods of examples/kubernetes/xmesh-workers.yaml carry the labels KubernetesJob looks for
    by default, their agent listens on the pod's IP at the port the readiness probe and the
    Service name, with the key from a Secret mounted 0400 (the fixture starts exactly its command)."""
    from xmesh._jobs.kubernetes import default_selector

    docs = list(yaml.safe_load_all(open(MANIFEST)))
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert default_selector("trainers") == ",".join(f"{k}={v}" for k, v in labels.items())
    c = worker_container()
    assert c["args"][:2] == ["--listen", "tcp://$(POD_IP):26600"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    assert c["ports"] == [{"name": "xmesh", "containerPort": 26600}] and c["readinessProbe"]["tcpSocket"]["port"] == "xmesh"
    (volume,) = sts["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["defaultMode"] == 0o400 and c["args"][3].startswith(c["volumeMounts"][0]["mountPath"])


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "xmesh.cli", *args], capture_output=True, text=True, timeout=100,
                          env=dict(os.environ, **env))


def test_pods_found_by_label_are_the_hosts_in_rank_order(pods, tmp_path, capsys):
    """Invariant hosts.2 (docs/architecture/04-hosts-and-jobs.md): the meshes' Ready pods, found by
    label selector in the namespace and ranked by their label, are the job's hosts in mesh then
    rank order, whatever order the API lists them in; a pod not Ready yet is waited for (the watch
    continues from the listing's resourceVersion and lists again after 410 Gone); a pod without a
    rank is left out, saying so. The saved job is listed by `xmesh ls` and reattached from its
    record; kill() stops the procs on the pods and leaves their agents."""
    api = ApiReplay(pods.ips, watches=WATCH_AFTER_EXPIRY)
    state = str(tmp_path / "state")
    job = xmesh.KubernetesJob("ml", timeout=60, kubeconfig=api.kubeconfig(str(tmp_path / "kubeconfig")),
                              port_forward=False, key_file=pods.key, name="k8s", state_dir=state)
    job.add_mesh("trainers", 2)
    job.add_mesh("gen", 1)
    try:
        w = job.host_mesh.spawn_procs({"gpus": 1}).spawn("w", Where)
        assert list(w.where.call().get(timeout=60).values()) == ["node-a", "node-b", "node-c"]
        said = capsys.readouterr().out
        assert "mesh trainers: 1/2 pods ready (waiting for ranks 1)" in said, said
        assert "pod trainers-debug of mesh trainers is left out" in said, said
        assert job.mesh_sizes == {"trainers": 2, "gen": 1}
        trainers = [r for r in api.requests if "mesh-name=trainers" in r["query"].get("labelSelector", "")]
        watched = [str(r["query"].get("watch")).lower() for r in trainers[:4]]
        assert watched == ["none", "true", "none", "true"], trainers  # list, watch (410 Gone), list, watch
        assert trainers[1]["query"]["resourceVersion"] == "48230"
        assert all(r["path"] == "/api/v1/namespaces/ml/pods" and r["authorization"] == "Bearer replay-token"
                   for r in api.requests)
        ls = run_cli("ls", "--state-dir", state)
        assert ls.returncode == 0 and "kubernetes" in ls.stdout and "running" in ls.stdout, ls.stdout + ls.stderr
        assert "3 (trainers-0,trainers-1,gen-0)" in ls.stdout, ls.stdout
        capsys.readouterr()
        job.kill()
        with pytest.raises(Exception):
            w.where.call().get(timeout=30)
        assert all(p.poll() is None for p in pods.agents)  # the pods stay
        time.sleep(2)
        said = capsys.readouterr()
        assert "given up" not in said.out + said.err, said.out + said.err  # the lanes end with the procs, quietly
        assert not os.path.exists(os.path.join(state, "jobs", "k8s.json"))
    finally:
        api.close()


OUTSIDE_PROGRAM = """
import json, os, socket, sys
sys.path.insert(0, {tests!r})
import xmesh
from k8s_replay import ApiReplay
from test_tcp_links import Relay
from xmesh._runtime.process import get_runtime

class Where(xmesh.Actor):
    @xmesh.endpoint
    def where(self):
        print("printed on", socket.gethostname(), flush=True)
        return socket.gethostname()

api = ApiReplay({ips!r}, watches={{"trainers": ["watch-trainers.jsonl"]}})
kubeconfig = api.kubeconfig(os.path.join({tmp!r}, "kubeconfig-outside"))
job = xmesh.KubernetesJob("ml", timeout=60, kubeconfig=kubeconfig, key_file={key!r}, name="outside",
                          state_dir=os.path.join({tmp!r}, "state-outside"))
job.add_mesh("trainers", 2)
job.add_mesh("gen", 1)
w = job.host_mesh.spawn_procs({{"gpus": 1}}).spawn("w", Where)
print("WHERE", list(w.where.call().get(timeout=60).values()), flush=True)
print("REACHES_BACK", get_runtime().node.reaches_back, flush=True)
job._forward.process.kill()  # the forward ends (a laptop that slept, a network that changed)
job._forward.process.wait()
job.host_mesh  # finds the pods again, through a new forward: the same actors answer
print("AFTER_FORWARD_ENDED", list(w.where.call().get(timeout=60).values()), flush=True)
forward = job._forward.process
job.kill()
print("FORWARD_ENDED", forward.poll() is not None, flush=True)

forward = Relay(26600, target_host={gateway_host!r}, port=17000)  # `kubectl port-forward pod/trainers-0 17000:26600`
job = xmesh.KubernetesJob("ml", timeout=60, kubeconfig=kubeconfig, key_file={key!r}, attach_to="localhost:17000",
                          name="by-hand", state_dir=os.path.join({tmp!r}, "state-outside"))
job.add_mesh("trainers", 2)
job.add_mesh("gen", 1)
w = job.host_mesh.spawn_procs({{"gpus": 1}}).spawn("w2", Where)
print("WHERE_ATTACH_TO", list(w.where.call().get(timeout=60).values()), flush=True)
job.kill()
print("DONE", flush=True)
"""


def test_a_controller_outside_the_cluster_reaches_the_pods_through_one_forwarded_port(pods, tmp_path):
    """Invariant hosts.2 (docs/architecture/04-hosts-and-jobs.md): from a laptop nothing can
    connect to and whose network reaches no pod (only trainers-0's agent port, through a
    forward), a kubeconfig is enough: the job starts `kubectl port-forward pod/trainers-0 :26600`
    in the namespace, every connection goes through that pod's agent, calls and output reach all
    three pods; when the forward ends, the next `job.host_mesh` forwards again and the same actors
    answer through it; kill() ends the forward; attach_to= a forward made by hand does the same
    without kubectl."""
    laptop, a = pods.net.hosts[3], pods.net.hosts[0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(f"#!/bin/sh\nexec {PYTHON} {os.path.join(HERE, 'kubectl_standin.py')} \"$@\"\n")
    (bin_dir / "kubectl").chmod(0o755)
    kubectl_log = tmp_path / "kubectl.log"
    tmp = private_tmpdir("xmesh-k8s-outside-")
    source = textwrap.dedent(OUTSIDE_PROGRAM.format(tests=HERE, ips=pods.ips, tmp=tmp, key=pods.key,
                                                    gateway_host=a.addr))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", KUBECTL_STANDIN_LOG=str(kubectl_log),
               XMESH_RUNTIME_DIR=os.path.join(tmp, "ctl"), PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    laptop.firewall([])  # nothing connects to the laptop
    for pod in pods.net.hosts[1:3]:
        pod.firewall([], only_from=[laptop.addr])  # and it reaches no pod but trainers-0
    try:
        r = subprocess.run(laptop.command([PYTHON, "-c", source]), env=env, capture_output=True, text=True, timeout=110)
    finally:
        for h in pods.net.hosts[1:4]:
            h.open_firewall()
    assert r.returncode == 0 and "DONE" in r.stdout, r.stdout + r.stderr
    assert "WHERE ['node-a', 'node-b', 'node-c']" in r.stdout and "WHERE_ATTACH_TO ['node-a', 'node-b', 'node-c']" in r.stdout
    assert "AFTER_FORWARD_ENDED ['node-a', 'node-b', 'node-c']" in r.stdout, r.stdout + r.stderr
    assert "the port forward to pod/trainers-0 ended (kubectl exited with code -9)" in r.stdout, r.stdout
    assert (r.stdout + r.stderr).count("printed on node-") == 9, r.stdout + r.stderr
    assert "REACHES_BACK True" in r.stdout and "FORWARD_ENDED True" in r.stdout, r.stdout
    assert "reaching the pods through `kubectl port-forward pod/trainers-0`" in r.stdout, r.stdout
    argvs = [json.loads(line) for line in kubectl_log.read_text().splitlines()]  # attach_to used none
    assert argvs == [["port-forward", "--namespace", "ml", "pod/trainers-0", ":26600", "--kubeconfig",
                      os.path.join(tmp, "kubeconfig-outside")]] * 2, argvs  # and again once it ended


MONARCH_PROGRAM = """
import os, socket, sys
sys.path.insert(0, {tests!r})
os.chdir({tmp!r})
from k8s_replay import ApiReplay
from monarch.actor import Actor, endpoint
from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

class Where(Actor):
    @endpoint
    def where(self):
        return socket.gethostname()

api = ApiReplay({ips!r}, watches={{"trainers": ["watch-trainers.jsonl"]}})
job = KubernetesJob("ml", timeout=60, kubeconfig=KubeConfig.from_path(api.kubeconfig("kubeconfig")))
job.add_mesh("trainers", 2)
job.add_mesh("gen", 1)
try:
    job.add_mesh("more", 1, image_spec=ImageSpec("registry.example/worker:1"))
except NotImplementedError as e:
    print("PROVISIONING", e, flush=True)
state = job.state()
for name in ("trainers", "gen"):
    hosts = getattr(state, name)
    print(name.upper(), list(hosts.spawn_procs({{"gpus": 1}}).spawn("w", Where).where.call().get().values()), flush=True)
job.kill()
print("DONE", flush=True)
"""


def test_monarchs_kubernetes_job_runs_unchanged(pods, tmp_path):
    """Monarch's `monarch.job.kubernetes.KubernetesJob(namespace, timeout, kubeconfig=KubeConfig.from_path(...))`
    with add_mesh per mesh: `job.state().trainers` and `.gen` are those pods' hosts (through
    kubectl port-forward, outside the cluster, as in Monarch); provisioning is refused naming why."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(f"#!/bin/sh\nexec {PYTHON} {os.path.join(HERE, 'kubectl_standin.py')} \"$@\"\n")
    (bin_dir / "kubectl").chmod(0o755)
    source = textwrap.dedent(MONARCH_PROGRAM.format(tests=HERE, ips=pods.ips, tmp=str(tmp_path)))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", KUBECTL_STANDIN_LOG=str(tmp_path / "kubectl.log"),
               XMESH_KEY_FILE=pods.key, XMESH_RUNTIME_DIR=str(tmp_path / "rt"),
               PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([PYTHON, "-c", source], env=env, capture_output=True, text=True, timeout=110)
    assert r.returncode == 0 and "DONE" in r.stdout, r.stdout + r.stderr
    assert "TRAINERS ['node-a', 'node-b']" in r.stdout and "GEN ['node-c']" in r.stdout, r.stdout
    assert "PROVISIONING provisioning pods (image_spec" in r.stdout, r.stdout


def test_kubernetes_problems_are_named(pods, tmp_path, monkeypatch):
    """Each way a Kubernetes job cannot start says what is wrong, at once or at its timeout, and
    never hangs: arguments, no cluster config, a missing kubeconfig, an API server not reached,
    RBAC refusing the listing, ranks whose pods never become Ready, no kubectl outside the cluster."""
    from xmesh import JobError

    api = ApiReplay(pods.ips)
    kubeconfig = api.kubeconfig(str(tmp_path / "kubeconfig"))
    job = xmesh.KubernetesJob("ml", kubeconfig=kubeconfig, state_dir=str(tmp_path / "s"))
    try:
        for bad, match in ((dict(name="Trainers", num_replicas=1), "RFC 1123"),
                           (dict(name="trainers", num_replicas=0), "num_replicas must be a whole number >= 1"),
                           (dict(name="trainers", num_replicas=1, port=0), "not 0")):
            with pytest.raises(ValueError, match=match):
                job.add_mesh(**bad)
        job.add_mesh("trainers", 1)
        with pytest.raises(ValueError, match="a mesh 'trainers' was added already"):
            job.add_mesh("trainers", 1)
        with pytest.raises(ValueError, match="attach_to='nope'"):
            xmesh.KubernetesJob("ml", attach_to="nope")
        with pytest.raises(JobError, match="add_mesh"):
            xmesh.KubernetesJob("ml", kubeconfig=kubeconfig, state_dir=str(tmp_path / "s")).host_mesh
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        with pytest.raises(JobError, match="not inside a Kubernetes cluster"):
            xmesh.KubernetesJob("ml", meshes=[{"name": "gen", "num_replicas": 1}], state_dir=str(tmp_path / "s")).host_mesh
        with pytest.raises(JobError, match="no kubeconfig at"):
            xmesh.KubernetesJob("ml", kubeconfig=str(tmp_path / "none"), meshes=[{"name": "gen", "num_replicas": 1}],
                                state_dir=str(tmp_path / "s")).host_mesh
        closed = ApiReplay(pods.ips)
        gone = closed.kubeconfig(str(tmp_path / "gone"))
        closed.close()
        with pytest.raises(JobError, match="API server was not reached"):
            xmesh.KubernetesJob("ml", kubeconfig=gone, meshes=[{"name": "gen", "num_replicas": 1}],
                                state_dir=str(tmp_path / "s")).host_mesh
        with pytest.raises(JobError, match="RBAC"):
            xmesh.KubernetesJob("forbidden", kubeconfig=kubeconfig, meshes=[{"name": "gen", "num_replicas": 1}],
                                state_dir=str(tmp_path / "s")).host_mesh
        with pytest.raises(JobError, match=r"mesh trainers not ready after 2 s: 1/3 pods Ready .* ranks 1, 2 missing"):
            xmesh.KubernetesJob("ml", timeout=2, kubeconfig=kubeconfig, meshes=[{"name": "trainers", "num_replicas": 3}],
                                state_dir=str(tmp_path / "s")).host_mesh
        monkeypatch.setenv("PATH", str(tmp_path))  # no kubectl
        with pytest.raises(JobError, match="no kubectl is on PATH"):
            xmesh.KubernetesJob("ml", kubeconfig=kubeconfig, key_file=pods.key, meshes=[{"name": "gen", "num_replicas": 1}],
                                state_dir=str(tmp_path / "s")).host_mesh
    finally:
        api.close()
