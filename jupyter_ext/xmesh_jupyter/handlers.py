"""The panel's REST API, under the server's base URL, behind its authentication (token or
login, XSRF for anything but GET): GET /xmesh/api/meshes[?since=REVISION] answers what the
sidecar reads (or {"unchanged": true} when the panel's revision is still current);
POST /xmesh/api/debug {"pid": N, "lines": [...]} types commands at that kernel's (or
program's) debugger, as `xmesh debug` would, and answers the transcript; POST /xmesh/api/stop
{"id": allocation} stops an allocation's procs (named or not, whoever owns it); POST
/xmesh/api/pdb {"pid", "actor", "rank", "command"} types one pdb command at one stopped rank
and answers pdb's output and the source where that rank is now; POST /xmesh/api/release
{"pid"} hands that controller's debugger back to its cell (the sidecar keeps it a while after
each command, so that a series of commands takes the cell's prompt over once)."""
import json
import time
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join


class MeshesHandler(APIHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        msg = {"op": "meshes", "notebooks": await self._notebooks()}
        if self.get_argument("since", ""):
            msg["since"] = self.get_argument("since")  # the revision the panel has: {"unchanged": true} if current
        reply = await self.settings["xmesh_sidecar"].request(msg)
        if "error" in reply:
            self.set_status(502)  # the gateway (the sidecar, an agent) failed: the body says why
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(reply))

    NOTEBOOKS_TTL_S = 3.0  # the sessions are read at most this often (a poll comes every 0.8 s)
    _notebooks_seen: tuple = (0.0, {})

    async def _notebooks(self) -> dict:
        """{kernel id: the path of the notebook its session has now}, from this server's sessions
        (read again after NOTEBOOKS_TTL_S: a renamed notebook shows within that): the panel names
        kernels by notebook."""
        at, seen = MeshesHandler._notebooks_seen
        if time.monotonic() - at < self.NOTEBOOKS_TTL_S:
            return seen
        manager = self.settings.get("session_manager")
        if manager is None:
            return {}
        try:
            sessions = await manager.list_sessions()
        except Exception:  # the list is a nicety: the meshes are shown without it
            return {}
        seen = {s["kernel"]["id"]: s.get("path") or s.get("name") or "" for s in sessions if s.get("kernel")}
        MeshesHandler._notebooks_seen = (time.monotonic(), seen)
        return seen


class LogsHandler(APIHandler):
    """GET /xmesh/api/logs?id=ALLOC&name=NAME&rank=N&stream=stdout&grep=RE&tail=500: an
    allocation's lines (name: a named allocation's)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        msg: dict = {"op": "logs", "id": self.get_argument("id", "")}
        for key in ("rank", "tail"):
            value = self.get_argument(key, "")
            if value:
                msg[key] = int(value) if value.lstrip("-").isdigit() else value  # the sidecar names a bad one
        for key in ("name", "stream", "grep"):
            if self.get_argument(key, ""):
                msg[key] = self.get_argument(key)
        reply = await self.settings["xmesh_sidecar"].request(msg)
        if "error" in reply:
            self.set_status(400 if reply.get("bad_request") else 502)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(reply))


class _ActionHandler(APIHandler):
    """A POST whose JSON object body names what to do; the sidecar does it (`op`, `fields`)."""

    op = ""
    fields: tuple = ()

    @tornado.web.authenticated
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = None
        self.set_header("Content-Type", "application/json")
        if not isinstance(body, dict):
            self.set_status(400)
            self.finish(json.dumps({"error": f"the body is a JSON object with {', '.join(self.fields)}"}))
            return
        reply = await self.settings["xmesh_sidecar"].request(
            {"op": self.op, **{k: body.get(k) for k in self.fields}})
        if "error" in reply:
            self.set_status(400 if reply.get("bad_request") else 502)
        self.finish(json.dumps(reply))


class DebugHandler(_ActionHandler):
    op, fields = "debug", ("pid", "lines")


class StopHandler(_ActionHandler):
    op, fields = "stop", ("id",)


class PdbHandler(_ActionHandler):
    """The console on one stopped rank: a pdb command's answer and the source where it is now."""

    op, fields = "pdb", ("pid", "actor", "rank", "command")


class ReleaseHandler(_ActionHandler):
    """The panel is done with a controller's debugger: the cell's prompt comes back now."""

    op, fields = "release", ("pid",)


def setup_handlers(web_app: Any, sidecar: Any) -> None:
    web_app.settings["xmesh_sidecar"] = sidecar
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base, "xmesh", "api", "meshes"), MeshesHandler),
                                 (url_path_join(base, "xmesh", "api", "debug"), DebugHandler),
                                 (url_path_join(base, "xmesh", "api", "stop"), StopHandler),
                                 (url_path_join(base, "xmesh", "api", "pdb"), PdbHandler),
                                 (url_path_join(base, "xmesh", "api", "release"), ReleaseHandler),
                                 (url_path_join(base, "xmesh", "api", "logs"), LogsHandler)])
