"""The panel's REST API, under the server's base URL, behind its authentication (token or
login, XSRF for anything but GET): GET /xmesh/api/meshes answers what the sidecar reads;
POST /xmesh/api/debug {"pid": N, "lines": [...]} types commands at that kernel's (or
program's) debugger, as `xmesh debug` would, and answers the transcript."""
import json
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join


class MeshesHandler(APIHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        reply = await self.settings["xmesh_sidecar"].request({"op": "meshes"})
        if "error" in reply:
            self.set_status(502)  # the gateway (the sidecar, an agent) failed: the body says why
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(reply))


class DebugHandler(APIHandler):
    @tornado.web.authenticated
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self.set_status(400)
            self.finish(json.dumps({"error": "the body is a JSON object: {\"pid\": N, \"lines\": [...]}"}))
            return
        reply = await self.settings["xmesh_sidecar"].request(
            {"op": "debug", "pid": body.get("pid"), "lines": body.get("lines")})
        if "error" in reply:
            self.set_status(400 if reply.get("bad_request") else 502)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(reply))


def setup_handlers(web_app: Any, sidecar: Any) -> None:
    web_app.settings["xmesh_sidecar"] = sidecar
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base, "xmesh", "api", "meshes"), MeshesHandler),
                                 (url_path_join(base, "xmesh", "api", "debug"), DebugHandler)])
