"""Driving JupyterLab 4 and Notebook 7 in Debian's Chromium through Playwright, as a person
would: a Jupyter server of build/frontend started on loopback (`JupyterServer`), notebooks
written beforehand (`write_notebook`), and a `NotebookPage` that runs cells, answers the input
box, presses toolbar buttons and reads outputs from the page."""
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.request

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("XMESH_BUILD_DIR", os.path.join(SOURCE, "build"))
FRONTEND = os.path.join(BUILD, "frontend", "bin")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def write_notebook(path, cells, kernel_name="xmesh"):
    """A notebook on the xmesh kernel (or another kernelspec) with these code cells."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": kernel_name, "display_name": kernel_name, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServer:
    """`jupyter lab` (which serves Notebook 7's pages too) on a loopback port with a token, its
    root a directory of the test's, kernels from the build tree's kernelspec (and those under
    more_kernels, a share/jupyter directory). sigint_ignored: started as `nohup ... &` would (its
    kernels inherit SIGINT ignored)."""

    def __init__(self, root, runtime_dir, log_path, sigint_ignored=False, more_kernels=None):
        self.root = root
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        jupyter_path = os.pathsep.join(filter(None, [more_kernels, os.path.join(BUILD, "share", "jupyter")]))
        env = dict(os.environ, XMESH_RUNTIME_DIR=runtime_dir, JUPYTER_PATH=jupyter_path,
                   JUPYTER_CONFIG_DIR=os.path.join(root, ".jupyter-config"),
                   JUPYTER_DATA_DIR=os.path.join(root, ".jupyter-data"))
        argv = [os.path.join(FRONTEND, "jupyter-lab"), "--no-browser", "--allow-root", "--ip=127.0.0.1",
                f"--port={self.port}", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
                "--MappingKernelManager.default_kernel_name=xmesh", "--LabApp.news_url=",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        self._log = open(log_path, "w")
        preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=root, preexec_fn=preexec, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=1)
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Jupyter server did not start; see {log_path}")
                time.sleep(0.2)

    def sigint_ignored(self):
        """Whether the server process has SIGINT ignored (what its kernels inherit)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
        return bool(mask & (1 << (signal.SIGINT - 1)))

    def url(self, path, query=""):
        return f"{self.base}/{path}?{query + '&' if query else ''}token={self.token}"

    def get(self, path):
        return self.get_query(path, "")

    def get_query(self, path, query):
        with urllib.request.urlopen(self.url(path, query), timeout=10) as r:
            return r.read()

    def start_session(self, path, kernel_name="xmesh"):
        """A session for the notebook with an xmesh kernel, made through the REST API before the
        page opens it: the page then connects to it (on a first load JupyterLab may ask which
        kernel to start before it has read the kernelspecs)."""
        body = json.dumps({"path": path, "name": path, "type": "notebook", "kernel": {"name": kernel_name}}).encode()
        req = urllib.request.Request(f"{self.base}/api/sessions", data=body, method="POST",
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def kernel_display_name(self, kernel_name):
        """The display name the server's kernelspec for kernel_name gives (what a front end's
        kernel menus list)."""
        specs = json.loads(self.get("api/kernelspecs"))["kernelspecs"]
        if kernel_name not in specs:
            raise KeyError(f"the server has no kernelspec {kernel_name!r} (it has {sorted(specs)})")
        return specs[kernel_name]["spec"]["display_name"]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()


def _visible_text(text):
    return text.replace("\u00a0", " ")


class NotebookPage:
    """One notebook open in JupyterLab (ui="lab") or Notebook 7 (ui="notebook")."""

    def __init__(self, page, server, name, ui="lab", kernel_name="xmesh"):
        self.page = page
        self.kernel_name = kernel_name
        self.server = server
        server.start_session(name, kernel_name)
        # JupyterLab restores the tabs of the last session unless reset: one notebook per page.
        page.goto(server.url(f"lab/tree/{name}", "reset") if ui == "lab" else server.url(f"notebooks/{name}"))
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60000)
        self.wait_idle(timeout=60)

    def cell(self, i):
        return self.page.locator(".jp-Notebook .jp-Cell").nth(i)

    def wait_idle(self, timeout=60):
        """The kernel is connected and idle (the toolbar's indicator, then the prompt numbers)."""
        self.page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=timeout * 1000)

    def run(self, i, wait=True, timeout=60):
        """Runs cell i with the toolbar's run button; waits until it has run (its prompt shows a
        number) unless wait is False. A press the front end drops (its kernel connection not
        quite ready, which the indicator does not show) is pressed again."""
        before = self.prompt(i)

        def started():
            now = self.prompt(i)
            return now == "[*]:" or (re.fullmatch(r"\[\d+\]:", now) is not None and now != before)

        def kernel_busy():
            return self.page.locator(".jp-Notebook-ExecutionIndicator[data-status='busy']").count() > 0

        for _ in range(5):
            self._choose_kernel_if_asked()
            self.cell(i).locator(".jp-InputArea-editor").click()
            idle_before = not kernel_busy()
            self.page.click(".jp-NotebookPanel-toolbar [data-command='notebook:run-cell-and-select-next']")
            # Under load the prompt may lag the press by seconds: a kernel that turned busy took it
            # (pressing again would run the cell twice), and only a press unseen for 15 s is
            # pressed again.
            def taken():
                return started() or (idle_before and kernel_busy())

            deadline = time.monotonic() + 15
            while not taken() and time.monotonic() < deadline:
                time.sleep(0.05)
            if taken():
                break
        else:
            raise TimeoutError(f"cell {i} never started (prompt {before!r})")
        if wait:
            self.wait_done(i, timeout)

    def _choose_kernel_if_asked(self):
        """A "Select Kernel" dialog (should the front end not know the session's kernel yet):
        the page's kernel (by the display name its kernelspec gives)."""
        dialog = self.page.locator(".jp-Dialog")
        if dialog.count() and dialog.locator("select").count():
            dialog.locator("select").select_option(label=self.server.kernel_display_name(self.kernel_name))
            self.accept_dialog()
            self.wait_idle()

    def prompt(self, i):
        return _visible_text(self.cell(i).locator(".jp-InputPrompt").inner_text()).strip()

    def wait_done(self, i, timeout=60):
        deadline = time.monotonic() + timeout
        while not re.fullmatch(r"\[\d+\]:", self.prompt(i)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell {i} did not finish within {timeout} s (prompt {self.prompt(i)!r}); "
                                   f"output: {self.output(i)!r}")
            time.sleep(0.1)

    def wait_running(self, i, timeout=30):
        deadline = time.monotonic() + timeout
        while self.prompt(i) != "[*]:":
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell {i} did not start within {timeout} s")
            time.sleep(0.05)

    def output(self, i):
        area = self.cell(i).locator(".jp-OutputArea")
        return _visible_text(area.inner_text()) if area.count() else ""

    def wait_output(self, i, pred, timeout=60):
        """Waits until pred(output text of cell i) holds; returns the text."""
        deadline = time.monotonic() + timeout
        text = self.output(i)
        while not pred(text):
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell {i}'s output never matched within {timeout} s: {text!r}")
            time.sleep(0.1)
            text = self.output(i)
        return text

    def answer(self, text, timeout=30):
        """Types a line into the input box (the debugger's prompt) and presses Enter."""
        box = self.page.locator(".jp-Stdin-input").last
        box.wait_for(timeout=timeout * 1000)
        handle = box.element_handle()
        box.fill(text)
        box.press("Enter")
        # The box becomes text; the next prompt's box is a new one (input_prompt waits for it).
        deadline = time.monotonic() + timeout
        while handle.evaluate("e => e.isConnected && e.classList.contains('jp-Stdin-input')"):
            if time.monotonic() > deadline:
                raise TimeoutError("the input box did not take the answer")
            time.sleep(0.02)

    def input_prompt(self, timeout=30):
        """The prompt text next to the open input box."""
        self.page.locator(".jp-Stdin-input").last.wait_for(timeout=timeout * 1000)
        return _visible_text(self.page.locator(".jp-Stdin-prompt").last.inner_text())

    def toolbar(self, command):
        self.page.click(f".jp-NotebookPanel-toolbar [data-command='{command}']")

    def accept_dialog(self):
        self.page.locator(".jp-Dialog .jp-mod-accept").click()
