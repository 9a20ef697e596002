"""`jupyter notebook` (Debian's Notebook 6.4) lists the xmesh kernel and starts it."""
import json
import os
import socket
import subprocess
import time
import urllib.request

from xmesh_testing import wait_until


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port, path, method="GET", body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
        return json.loads(text) if text else None


def test_the_notebook_server_lists_and_starts_the_xmesh_kernel(kernel_rundir, tmp_path):
    port = _free_port()
    env = dict(os.environ, XMESH_RUNTIME_DIR=kernel_rundir, HOME=str(tmp_path))
    server = subprocess.Popen(
        ["jupyter-notebook", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
         "--NotebookApp.token=", "--NotebookApp.password=", "--NotebookApp.disable_check_xsrf=True", f"--notebook-dir={tmp_path}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def up():
            try:
                return _api(port, "kernelspecs") is not None
            except OSError:
                return False

        assert wait_until(up, timeout=60), server.stderr.read() if server.poll() is not None else "no answer"
        specs = _api(port, "kernelspecs")["kernelspecs"]
        assert specs["xmesh"]["spec"]["display_name"] == "Python 3 (xmesh)"
        kernel = _api(port, "kernels", "POST", {"name": "xmesh"})
        assert kernel["name"] == "xmesh"
        assert wait_until(lambda: _api(port, f"kernels/{kernel['id']}")["execution_state"] in ("idle", "starting"),
                          timeout=30)
        time.sleep(1)
        assert _api(port, f"kernels/{kernel['id']}")["execution_state"] != "dead"
        _api(port, f"kernels/{kernel['id']}", "DELETE")
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
