"""A Kubernetes API server on this machine's loopback that replays recorded responses
(tests/python/k8s_api: a PodList per mesh as `kubectl get pods -o json` gives it, watch streams as
the API sends them, a 403 Status): no cluster exists here. Pod IPs in the recordings are
placeholders ({{IP0}}...) filled with the namespace hosts' addresses, whose agents stand for the
pods' containers. What the watch streams replay is applied to the pods the next listing shows.

Routes: GET /api/v1/namespaces/NS/pods?labelSelector=... (watch=true: the mesh's next recorded
stream, else held open for timeoutSeconds, as the API server does) and /api/v1/namespaces/NS/pods/NAME.
Namespace "forbidden" answers 403. Every request is kept (path, query, Authorization) for the
tests to read."""
import json
import os
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional

RECORDINGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s_api")
MESH_LABEL = "monarch.pytorch.org/mesh-name"


def recording(name: str, ips: Dict[str, str]) -> str:
    with open(os.path.join(RECORDINGS, name)) as f:
        text = f.read()
    for key, ip in ips.items():
        text = text.replace("{{" + key + "}}", ip)
    return text


class ApiReplay:
    """The server: ips fill the recordings' placeholders; watches[mesh] are the recorded watch
    streams served in turn to that mesh's watch requests; token is the bearer token it expects."""

    def __init__(self, ips: Dict[str, str], watches: Optional[Dict[str, List[str]]] = None,
                 token: str = "replay-token") -> None:
        self.ips = ips
        self.token = token
        self.watches = {k: list(v) for k, v in (watches or {}).items()}
        self.requests: List[dict] = []
        self._pods: Dict[str, dict] = {}  # mesh -> its PodList, with what the streams replayed applied
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: str, namespace: str = "ml") -> str:
        """A kubeconfig naming this server, its token and namespace (kubectl's format)."""
        with open(path, "w") as f:
            f.write(f"""apiVersion: v1
kind: Config
clusters:
- name: replay
  cluster:
    server: {self.url}
users:
- name: notebook
  user:
    token: {self.token}
contexts:
- name: replay
  context:
    cluster: replay
    user: notebook
    namespace: {namespace}
current-context: replay
""")
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what it serves ------------------------------------------------------------------
    def pod_list(self, mesh: str) -> dict:
        with self._lock:
            if mesh not in self._pods:
                name = f"pods-{mesh}.json"
                self._pods[mesh] = json.loads(recording(name, self.ips)) if os.path.exists(
                    os.path.join(RECORDINGS, name)) else {"kind": "PodList", "apiVersion": "v1",
                                                          "metadata": {"resourceVersion": "1"}, "items": []}
            return json.loads(json.dumps(self._pods[mesh]))

    def next_watch(self, mesh: str) -> Optional[List[dict]]:
        self.pod_list(mesh)
        with self._lock:
            queue = self.watches.get(mesh) or []
            if not queue:
                return None
            events = [json.loads(line) for line in recording(queue.pop(0), self.ips).splitlines() if line.strip()]
            for e in events:  # what a stream said is what the next listing shows
                if e["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    items = [p for p in self._pods[mesh]["items"] if p["metadata"]["name"] != e["object"]["metadata"]["name"]]
                    self._pods[mesh]["items"] = items + ([] if e["type"] == "DELETED" else [e["object"]])
            return events

    def _handler(self):
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the watch's chunked stream

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                replay.requests.append({"path": url.path, "query": query,
                                        "authorization": self.headers.get("Authorization", "")})
                parts = url.path.strip("/").split("/")
                if self.headers.get("Authorization") != f"Bearer {replay.token}":
                    return self._json(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                            "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
                if parts[:3] != ["api", "v1", "namespaces"] or len(parts) < 5 or parts[4] != "pods":
                    return self._json(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})
                if parts[3] == "forbidden":
                    return self._json(403, json.loads(recording("forbidden.json", {})))
                if len(parts) == 6:  # one pod, by name
                    mesh = parts[5].rsplit("-", 1)[0]
                    pod = [p for p in replay.pod_list(mesh)["items"] if p["metadata"]["name"] == parts[5]]
                    if not pod:
                        return self._json(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})
                    return self._json(200, dict(pod[0], kind="Pod", apiVersion="v1"))
                selector = dict(term.split("=", 1) for term in query.get("labelSelector", "").split(",") if "=" in term)
                mesh = selector.get(MESH_LABEL, "")
                if query.get("watch") in ("true", "True", "1"):
                    return self._watch(mesh, float(query.get("timeoutSeconds", "5")))
                return self._json(200, replay.pod_list(mesh))

            def _watch(self, mesh: str, timeout: float) -> None:
                events = replay.next_watch(mesh)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if events is None:
                    time.sleep(timeout)  # nothing changes: the server ends the watch at its timeout
                for e in events or []:
                    self._chunk(json.dumps(e).encode() + b"\n")
                self._chunk(b"")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _json(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
