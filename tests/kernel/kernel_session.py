"""A kernel driven as a front end drives it: execute requests on shell, outputs from iopub,
interrupts by signal, restarts and shutdowns through the KernelManager."""
import ast
import os
import time
from queue import Empty

from jupyter_client.manager import KernelManager


def stream_text(msg, name="stdout"):
    """The text a message adds to what a cell shows of stream name: a stream message's, or a
    display's standing in that stream (metadata xmesh_output: _kernel.interpreter.write_summaries)."""
    if msg["msg_type"] == "stream" and msg["content"]["name"] == name:
        return msg["content"]["text"]
    if msg["msg_type"] == "display_data" and msg["content"].get("metadata", {}).get("xmesh_output") == name:
        return msg["content"]["data"]["text/plain"]
    return ""


class CellResult:
    def __init__(self, reply, outputs):
        self.reply = reply["content"]
        self.outputs = outputs  # iopub messages of the cell, in order (not status/execute_input)

    @property
    def status(self):
        return self.reply["status"]

    def _stream(self, name):
        """What the cell shows of stream name: its stream messages and the displays that stand in
        it (remote lines from a summary of lines alike on: see folds)."""
        return "".join(stream_text(m, name) for m in self.outputs)

    @property
    def folds(self):
        """The text/html of the displays showing remote lines with summaries that unfold."""
        return [m["content"]["data"]["text/html"] for m in self.outputs
                if m["msg_type"] == "display_data" and m["content"]["metadata"].get("xmesh_output")]

    @property
    def stdout(self):
        return self._stream("stdout")

    @property
    def stderr(self):
        return self._stream("stderr")

    @property
    def data(self):
        """The mime bundles of execute_result and display_data, in order."""
        return [m["content"]["data"] for m in self.outputs if m["msg_type"] in ("execute_result", "display_data")]

    @property
    def text(self):
        """text/plain of the execute_result, or None."""
        for m in self.outputs:
            if m["msg_type"] == "execute_result":
                return m["content"]["data"].get("text/plain")
        return None

    @property
    def error(self):
        for m in self.outputs:
            if m["msg_type"] == "error":
                return m["content"]
        return None

    @property
    def error_text(self):
        e = self.error
        if e is None:
            return ""
        return f"{e['ename']}: {e['evalue']}\n" + "\n".join(e["traceback"])

    def __repr__(self):
        return f"<cell {self.status} stdout={self.stdout!r} stderr={self.stderr!r} error={self.error_text!r}>"


class KernelSession:
    def __init__(self, rundir, env=None, cwd=None, kernel_name="xmesh", base_env=None, connection_file=None):
        """A kernel of the kernelspec `kernel_name`, started with base_env (default: this
        process's environment) plus env and its runtime directory; connection_file: where its
        connection file goes (a Jupyter server names it kernel-ID.json)."""
        self.rundir = rundir
        full_env = dict(os.environ if base_env is None else base_env)
        full_env["XMESH_RUNTIME_DIR"] = rundir
        full_env.update(env or {})
        self.km = KernelManager(kernel_name=kernel_name, **({"connection_file": connection_file} if connection_file else {}))
        self.km.start_kernel(env=full_env, **({"cwd": cwd} if cwd else {}))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self):
        return self.km.provisioner.process.pid

    def send(self, code):
        """Starts executing code; returns the request's msg_id (see collect)."""
        return self.kc.execute(code, store_history=True, allow_stdin=False)

    def collect(self, msg_id, timeout=60):
        """Waits for the cell's reply and its idle status; returns a CellResult."""
        deadline = time.monotonic() + timeout
        outputs, reply, idle = [], None, False
        while not (reply and idle):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"cell {msg_id} did not finish within {timeout} s; outputs so far: {outputs}")
            if reply is None:
                try:
                    msg = self.kc.get_shell_msg(timeout=min(left, 0.05))
                    if msg["parent_header"].get("msg_id") == msg_id:
                        reply = msg
                except Empty:
                    pass
            try:
                msg = self.kc.get_iopub_msg(timeout=min(max(left, 0.01), 0.05))
            except Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status":
                idle = idle or msg["content"]["execution_state"] == "idle"
            elif msg["msg_type"] != "execute_input":
                outputs.append(msg)
        return CellResult(reply, outputs)

    def run(self, code, timeout=60):
        return self.collect(self.send(code), timeout)

    def ok(self, code, timeout=60):
        """Runs a cell that must succeed; returns its CellResult."""
        r = self.run(code, timeout)
        assert r.status == "ok", f"cell failed:\n{code}\n{r.error_text}\nstderr: {r.stderr}"
        return r

    def value(self, expr, timeout=60):
        """The text/plain of an expression's result."""
        return self.ok(expr, timeout).text

    def literal(self, expr, timeout=60):
        """An expression's result read back as a Python literal (a list of pids, a dict)."""
        return ast.literal_eval(self.value(expr, timeout))

    def wait_for_output(self, msg_id, pred, timeout=30):
        """Reads iopub for msg_id until pred(accumulated stdout and stderr) holds (the cell keeps running)."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except Empty:
                continue
            shown = stream_text(msg, "stdout") + stream_text(msg, "stderr")
            if msg["parent_header"].get("msg_id") == msg_id and shown:
                text += shown
                if pred(text):
                    return text
        raise TimeoutError(f"no matching output within {timeout} s; got {text!r}")

    def iopub_until(self, pred, timeout=30):
        """Reads iopub messages of any cell until pred(message) holds; returns them all."""
        deadline = time.monotonic() + timeout
        msgs = []
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except Empty:
                continue
            msgs.append(msg)
            if pred(msg):
                return msgs
        raise TimeoutError(f"no matching iopub message within {timeout} s; got {[m['msg_type'] for m in msgs]}")

    def converse(self, code):
        """Starts a cell that may ask for input (allow_stdin=True); see Conversation."""
        return Conversation(self, self.kc.execute(code, store_history=True, allow_stdin=True))

    def run_interrupted(self, code, marker, timeout=30):
        """Runs a cell, interrupts it once its output shows marker (and a moment later: the
        cell is then in its wait), and returns its CellResult and how long the interrupt took to
        end it."""
        msg_id = self.send(code)
        self.wait_for_output(msg_id, lambda t: marker in t)
        time.sleep(0.3)
        start = time.monotonic()
        self.interrupt()
        r = self.collect(msg_id, timeout=timeout)
        return r, time.monotonic() - start

    def interrupt(self):
        self.km.interrupt_kernel()

    def restart(self):
        self.km.restart_kernel(now=False)
        self.kc.wait_for_ready(timeout=60)

    def close(self):
        try:
            self.kc.stop_channels()
        finally:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=False)


class Conversation:
    """A cell that talks through the stdin channel, as a person at the input box would:
    `expect_prompt()` waits for the next input_request (collecting the cell's stdout meanwhile),
    `answer(text)` replies, `finish()` waits for the end of the cell."""

    def __init__(self, session, msg_id):
        self.s = session
        self.kc = session.kc
        self.msg_id = msg_id
        self.outputs = []
        self.prompts = []
        self.reply = None
        self.idle = False
        self.mark = 0  # stdout before this offset was already returned by expect_prompt
        self.request = None  # the header of the last input_request (answers carry it, as JupyterLab's do)

    @property
    def stdout(self):
        """The cell's stdout, with the text form of its displays (the debugger's table) in place."""
        return "".join(m["content"]["text"] if m["msg_type"] == "stream" else m["content"]["data"]["text/plain"]
                       for m in self.outputs
                       if (m["msg_type"] == "stream" and m["content"]["name"] == "stdout") or
                       (m["msg_type"] == "display_data" and "text/plain" in m["content"]["data"]))

    def _pump(self, timeout):
        """Reads what is there on iopub and shell for this cell; returns an input_request prompt if one came."""
        try:
            msg = self.kc.get_stdin_msg(timeout=timeout)
            if msg["msg_type"] == "input_request":
                self.request = msg["header"]
                return msg["content"]["prompt"]
        except Empty:
            pass
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.01)
            except Empty:
                break
            if msg["parent_header"].get("msg_id") != self.msg_id:
                continue
            if msg["msg_type"] == "status":
                self.idle = self.idle or msg["content"]["execution_state"] == "idle"
            elif msg["msg_type"] != "execute_input":
                self.outputs.append(msg)
        if self.reply is None:
            try:
                msg = self.kc.get_shell_msg(timeout=0.01)
                if msg["parent_header"].get("msg_id") == self.msg_id:
                    self.reply = msg
            except Empty:
                pass
        return None

    def expect_prompt(self, timeout=30):
        """Waits for the next input_request: (its prompt, the stdout that came since the last one).
        Output published just before the request may trail it on iopub: it is read until quiet."""
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no input_request within {timeout} s; stdout: {self.stdout[self.mark:]!r}; "
                                   f"reply: {self.reply and self.reply['content']}")
            if self.reply is not None and self.idle:
                raise AssertionError(f"the cell ended instead of prompting: {self.reply['content']}; "
                                     f"stdout: {self.stdout[self.mark:]!r}")
            prompt = self._pump(0.05)
            if prompt is not None:
                break
        quiet_until = time.monotonic() + 0.2
        while time.monotonic() < quiet_until:
            n = len(self.outputs)
            self._pump(0.02)
            if len(self.outputs) != n:
                quiet_until = time.monotonic() + 0.2
        self.prompts.append(prompt)
        text = self.stdout[self.mark:]
        self.mark = len(self.stdout)
        return prompt, text

    def answer(self, text, request=None):
        """Replies to the last input_request (or to `request`, a header), naming it as the
        parent as JupyterLab does."""
        reply = self.kc.session.msg("input_reply", {"value": text}, parent=request or self.request)
        self.kc.stdin_channel.send(reply)

    def say(self, text, timeout=30):
        """Answers the pending prompt and waits for the next: (prompt, stdout in between)."""
        self.answer(text)
        return self.expect_prompt(timeout)

    def finish(self, timeout=60):
        """Waits for the cell's reply and idle; returns a CellResult with everything it output."""
        deadline = time.monotonic() + timeout
        while not (self.reply and self.idle):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cell did not finish within {timeout} s; stdout: {self.stdout!r}")
            prompt = self._pump(0.05)
            if prompt is not None:
                raise AssertionError(f"unexpected input_request {prompt!r}; stdout: {self.stdout!r}")
        return CellResult(self.reply, self.outputs)
