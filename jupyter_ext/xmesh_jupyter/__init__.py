"""The xmesh panel's server side: a Jupyter server extension that serves /xmesh/api/meshes
(token-authenticated, as every Jupyter API) from a sidecar process running xmesh under Debian's
Python (sidecar.py), and the prebuilt JupyterLab extension in labextension/."""
from typing import Any, Dict, List


def _jupyter_labextension_paths() -> List[Dict[str, str]]:
    return [{"src": "labextension", "dest": "xmesh-jupyter"}]


def _jupyter_server_extension_points() -> List[Dict[str, str]]:
    return [{"module": "xmesh_jupyter"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from .handlers import setup_handlers
    from .sidecar import Sidecar

    setup_handlers(server_app.web_app, Sidecar(log=server_app.log))
    server_app.log.info("xmesh panel: /xmesh/api/meshes served")
