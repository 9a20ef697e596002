"""The mesh panel's sidecar (issue 22): the process a Jupyter server's extension (jupyter_ext/)
runs with Debian's Python, so that the server, in its own environment, never loads xmesh's
runtime. It reads this user's host agent and controllers through _panel and answers JSON lines on
its standard input and output."""
import json
import sys
from typing import Any

from . import _panel


def serve_stdio(stdin: Any, stdout: Any) -> int:
    """The sidecar a Jupyter server's extension runs (`python -m xmesh._panel_sidecar`): JSON lines,
    `{"op": "meshes", "runtime_dir": optional}` in, one answer line out each, until the end of
    input. A bad request is answered with {"error": why}; the sidecar lives on."""
    for raw in stdin:
        try:
            msg = json.loads(raw)
            if not isinstance(msg, dict) or msg.get("op") != "meshes":
                raise ValueError("unknown request: the sidecar answers {\"op\": \"meshes\"}")
            rundir = msg.get("runtime_dir")
            if rundir is not None and not isinstance(rundir, str):
                raise ValueError("runtime_dir is a path")
            answer = _panel.meshes(rundir)
        except ValueError as e:
            answer = {"error": str(e)}
        except Exception as e:  # an agent that does not answer, say: the panel shows why
            answer = {"error": f"{type(e).__name__}: {e}"}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve_stdio(sys.stdin, sys.stdout))
