"""`monarch.job.kubernetes` on xmesh: Monarch's KubernetesJob in its attach mode, over
`xmesh.KubernetesJob`, so a Monarch program that finds its workers' pods by label runs unchanged
once the pods run xmesh's host agent (examples/kubernetes/xmesh-workers.yaml) instead of
`run_worker_loop_forever`.

`KubernetesJob(namespace, timeout, kubeconfig, attach_to)`, `add_mesh(name, num_replicas,
label_selector, pod_rank_label, port)`: `job.state().NAME` is the HostMesh of mesh NAME. Inside
the cluster the pods are dialled at their IPs; with a kubeconfig (outside) through attach_to or a
`kubectl port-forward` to the first pod, as in Monarch. Provisioning (image_spec, pod_template:
MonarchMesh objects for Monarch's operator) is not supported; `kill()` stops the procs on the pods
(Monarch refuses it in attach mode) and leaves the pods. README's Monarch table says where this
differs.
"""
import dataclasses
from typing import Any, Dict, Optional

from xmesh import HostMesh
from xmesh._jobs.job import KubernetesJob as _XmeshKubernetesJob, _Job
from xmesh._jobs.kubernetes import DEFAULT_PORT, DEFAULT_RANK_LABEL, KubeConfig

from . import JobTrait, _host_slices

__all__ = ["ImageSpec", "KubeConfig", "KubernetesJob"]


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """Monarch's container image for provisioned pods: accepted so programs import, refused by
    add_mesh (xmesh attaches to pods that exist)."""
    image: str
    resources: Optional[Dict[str, Any]] = None


class KubernetesJob(JobTrait):
    """Monarch's KubernetesJob (attach mode) on xmesh: see the module."""

    def __init__(self, namespace: str, timeout: Optional[int] = None, kubeconfig: Optional[KubeConfig] = None,
                 attach_to: Optional[str] = None) -> None:
        super().__init__()
        self._namespace = namespace
        self._timeout = timeout
        self._kubeconfig = kubeconfig or KubeConfig()
        self._attach_to = attach_to
        self._meshes: Dict[str, dict] = {}
        _XmeshKubernetesJob(namespace, timeout, self._kubeconfig, attach_to)  # its arguments are checked now

    def add_mesh(self, name: str, num_replicas: int, label_selector: Optional[str] = None,
                 pod_rank_label: str = DEFAULT_RANK_LABEL, image_spec: Optional[ImageSpec] = None,
                 port: int = DEFAULT_PORT, pod_template: Any = None, labels: Optional[Dict[str, str]] = None,
                 annotations: Optional[Dict[str, str]] = None) -> None:
        if image_spec is not None or pod_template is not None or labels is not None or annotations is not None:
            raise NotImplementedError(
                "provisioning pods (image_spec, pod_template, labels, annotations: MonarchMesh objects for Monarch's "
                "operator) is not supported by xmesh: run the pods yourself with xmesh's host agent "
                "(examples/kubernetes/xmesh-workers.yaml) and add_mesh(name, num_replicas) attaches to them")
        mesh = {"name": name, "num_replicas": num_replicas, "label_selector": label_selector,
                "pod_rank_label": pod_rank_label, "port": port}
        probe = _XmeshKubernetesJob(self._namespace, self._timeout, self._kubeconfig, self._attach_to)
        for m in [*self._meshes.values(), mesh]:
            probe.add_mesh(**m)  # refused (ValueError naming it) before it is kept
        self._meshes[name] = mesh

    def _job_name(self) -> str:
        return "monarch_kubernetes_job"

    def _spec(self) -> dict:
        return {"namespace": self._namespace, "kubeconfig": self._kubeconfig.saved_form(),
                "attach_to": self._attach_to, "meshes": self._meshes}

    def _make(self, state_dir: str, name: str) -> _Job:
        return _XmeshKubernetesJob(self._namespace, self._timeout, self._kubeconfig, self._attach_to,
                                   meshes=list(self._meshes.values()), name=name, state_dir=state_dir)

    def _meshes_of(self, hosts: Optional[HostMesh]) -> Dict[str, HostMesh]:
        assert hosts is not None
        return _host_slices(hosts, {name: m["num_replicas"] for name, m in self._meshes.items()})
