"""`xmesh debug`: a controller's debugger driven from another terminal (DESIGN §7).

Every controller (kernel or script) listens on a unix socket, `<runtime dir>/c/<pid>.debug`:
mode 0600 inside the 0700 directory its node's own socket lives in, and each connecting peer's
uid is checked (SO_PEERCRED), so only the same user gets in. The wire is JSON lines:
controller -> client `{"out": text}` (print it) and `{"read": prompt}` (ask for a line);
client -> controller `{"line": text}`; closing the connection leaves the debugger.

One driver at a time: a client that connects takes over from the previous client (told so and
disconnected) and from a prompt open in a notebook cell or the script's own terminal
(interrupted; its call goes on waiting). When the client leaves, a waiting call takes the
prompt back. The client side is `run_client`, a select loop that prints what comes and sends
what is typed."""
import json
import os
import select
import socket
import struct
import sys
import threading

from .. import _core
from . import io as _debug_io
from .._runtime.process import on_controller_shutdown, on_controller_start
from .._runtime.unix_server import OwnerOnlyServer, live_sockets, read_bounded_line

SUFFIX = ".debug"
MAX_COMMAND_LINE = 1 << 16  # what a client may type in one line; longer ones are refused unread
MAX_OUTPUT_LINE = 1 << 24   # what the client holds of one line from the controller
SEND_TIMEOUT_S = 5          # a client that stops reading is dropped, never blocks the debugger


def socket_path(rundir, pid):
    return os.path.join(_core.layout_controller_dir(rundir), f"{pid}{SUFFIX}")


# -- controller side ----------------------------------------------------------------------------------
class RemoteIO:
    """The DebugPrompt's I/O over one client connection."""

    def __init__(self, conn, pid):
        self.conn = conn
        self.pid = pid
        self.label = client_label(pid)  # how notices name this driver
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_S, 0))
        self._rfile = conn.makefile("rb")
        self._lock = threading.Lock()
        self.closed = False

    def _send(self, msg):
        data = (json.dumps(msg) + "\n").encode()
        with self._lock:
            if self.closed:
                return
            try:
                self.conn.sendall(data)
            except OSError:  # gone, or not reading for SEND_TIMEOUT_S: drop it
                self.closed = True
                self._shutdown()

    def write(self, text):
        self._send({"out": text})

    def show_table(self, sessions):
        self.write(_debug_io.format_table(sessions))

    def read(self, prompt):
        self._send({"read": prompt})
        while True:
            try:
                raw = read_bounded_line(self._rfile, MAX_COMMAND_LINE)
            except (OSError, ValueError):
                raw = b""
            if raw is None:
                self.write(f"[xmesh] the client sent a line longer than {MAX_COMMAND_LINE} bytes; ignored\n")
                continue
            if not raw:
                raise EOFError
            try:
                return str(json.loads(raw)["line"])
            except (ValueError, KeyError, TypeError):
                self.write("[xmesh] the client sent a line this debugger cannot read; ignored\n")

    def close(self, text=None):
        if text:
            self.write(text)
        self.closed = True
        self._shutdown()  # without the lock: a send blocked on this client returns at once

    def _shutdown(self):
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class DebugServer:
    def __init__(self, rundir):
        self._server = OwnerOnlyServer(socket_path(rundir, os.getpid()), self._serve, "xmesh-debug")
        self.path = self._server.path
        self._clients = set()
        self._lock = threading.Lock()

    def start(self):
        """Listens; returns False (with the reason on stderr) where the path cannot be bound."""
        return self._server.start("`xmesh debug`")

    def stop(self):
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            client.close(f"[xmesh] pid {os.getpid()} is exiting; the debugger closed\n")
        self._server.stop()

    def _serve(self, conn, pid):
        from . import controller as _debug

        client = RemoteIO(conn, pid)
        with self._lock:
            self._clients.add(client)
        ctrl = _debug.controller()
        ctrl.take_over(client)
        try:
            _debug.DebugPrompt(ctrl, client, owner=client).run(leave_when_resumed=False, greeting=self._greeting())
        except (_debug.TakenOver, EOFError, KeyboardInterrupt):
            pass
        except Exception as e:  # the client must learn why, and the controller must live on
            client.write(f"[xmesh] the debugger failed: {e!r}\n")
        finally:
            left = ctrl.release(client)
            client.close(f"[xmesh] left the debugger{_still_stopped(left)}\n")
            conn.close()
            with self._lock:
                self._clients.discard(client)

    @staticmethod
    def _greeting():
        from .._kernel import interpreter as _kernel

        what = "kernel" if _kernel.in_kernel() else "program"
        argv = " ".join(sys.argv) if not _kernel.in_kernel() else ""
        return f"[xmesh] attached to the debugger of {what} pid {os.getpid()}{f' ({argv})' if argv else ''}\n"


def _still_stopped(sessions):
    if not sessions:
        return ""
    n = len(sessions)
    return f"; {n} actor{'s' if n != 1 else ''} still stopped in pdb, for the program's own prompt or a new client"


_server = None


def serve(rundir):
    global _server
    server = DebugServer(rundir)
    if server.start():
        _server = server


def stop_serving():
    if _server is not None:
        _server.stop()


# Every controller serves `xmesh debug` from its start to its shutdown.
on_controller_start(lambda rt: serve(_core.runtime_dir()))
on_controller_shutdown(lambda rt: stop_serving())


# -- client side ----------------------------------------------------------------------------------------
def live_controllers(rundir):
    """{pid: socket path} of the controllers of this runtime directory that serve a debugger;
    sockets left by controllers that died are removed."""
    return live_sockets(rundir, SUFFIX, remove_dead=True)


def client_label(pid):
    """How the debugger's notices name a client: the mesh panel (its Jupyter server's sidecar)
    or an `xmesh debug` from a terminal."""
    if "xmesh._panel.sidecar" in describe_process(pid):
        return f"the xmesh panel (pid {pid})"
    return f"`xmesh debug` (pid {pid})"


def describe_process(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _client_message(raw: bytes) -> dict:
    try:
        msg = json.loads(raw)
    except ValueError:
        msg = None
    if not isinstance(msg, dict) or not all(isinstance(msg.get(k, ""), str) for k in ("out", "read")):
        return {"out": "[xmesh] the debugger sent a line this client cannot read; ignored\n"}
    return msg


def run_client(path, stdin=None, stdout=None):
    """Talks to the debugger at `path` until either side leaves. Returns an exit status."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as e:
        raise RuntimeError(f"cannot connect to the debugger at {path}: {e}") from None
    buf = b""
    prompt = None  # the prompt shown and not yet answered
    try:
        while True:
            wait_for = [sock] + ([stdin] if prompt is not None else [])
            ready, _, _ = select.select(wait_for, [], [])
            if sock in ready:
                data = sock.recv(65536)
                if not data:
                    if prompt is not None:
                        stdout.write("\n")
                    stdout.flush()
                    return 0
                buf += data
                *lines, buf = buf.split(b"\n")
                if len(buf) > MAX_OUTPUT_LINE:
                    stdout.write(f"\n[xmesh] the debugger sent a line longer than {MAX_OUTPUT_LINE} bytes; leaving\n")
                    return 1
                for raw in lines:
                    msg = _client_message(raw)
                    if "out" in msg:
                        if prompt is not None:  # news while the user types: on its own line, prompt again
                            stdout.write("\n" + msg["out"] + prompt)
                        else:
                            stdout.write(msg["out"])
                    elif "read" in msg:
                        prompt = msg["read"]
                        stdout.write(prompt)
                stdout.flush()
            if prompt is not None and stdin in ready:
                line = stdin.readline()
                if not line:  # end of input: leave
                    return 0
                prompt = None
                sock.sendall((json.dumps({"line": line.rstrip("\n")}) + "\n").encode())
    except KeyboardInterrupt:
        stdout.write("\n")
        return 0
    finally:
        sock.close()


class DebugClient:
    """One connection to a controller's debugger that types lines and collects what each one
    printed, for as long as it stays open: while it does, it drives (the cell's prompt waits),
    so a client that types several commands in a row takes the debugger over once. For the
    panel (the sidecar keeps one per controller while its user works in it)."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            raise RuntimeError(f"cannot connect to the debugger at {path}: {e}") from None
        self._rfile = self.sock.makefile("rb")
        self.closed = False
        self.prompt = ""  # the prompt it shows now ("xmesh_dbg> ")
        self.greeting = self._until_prompt()  # the greeting and the table, before the first prompt

    def _until_prompt(self) -> str:
        """What the debugger prints before its next prompt (the end of its answer), which goes
        to self.prompt. On a timeout or a closed connection, what came, with why; the client is
        closed then."""
        out: list = []
        try:
            while True:
                raw = read_bounded_line(self._rfile, MAX_OUTPUT_LINE)
                if not raw:  # b"" (it closed) or None (a line too long to hold)
                    self.close()
                    break
                msg = _client_message(raw)
                if "out" in msg:
                    out.append(msg["out"])
                elif "read" in msg:
                    self.prompt = msg["read"]
                    break
        except socket.timeout:
            out.append(f"\n[xmesh] the debugger did not answer within {self.sock.gettimeout():.0f} s; left it\n")
            self.close()
        except OSError as e:
            out.append(f"\n[xmesh] the connection to the debugger failed: {e}\n")
            self.close()
        return "".join(out)

    def type(self, line: str) -> str:
        """Types one line at the prompt; returns what the debugger printed in answer."""
        if self.closed:
            return "[xmesh] the debugger connection is closed\n"
        try:
            self.sock.sendall((json.dumps({"line": line}) + "\n").encode())
        except OSError as e:
            self.close()
            return f"[xmesh] the connection to the debugger failed: {e}\n"
        return self._until_prompt()

    def close(self) -> None:
        """Leaves: a waiting call takes the prompt back."""
        if not self.closed:
            self.closed = True
            self._rfile.close()
            self.sock.close()


def transcript(client: DebugClient, lines: list, fresh: bool) -> tuple:
    """Types `lines`: (what a terminal would show, prompts and commands included, the greeting
    too where the client is `fresh`; the answer of each line)."""
    out = [client.greeting] if fresh else []
    answers = []
    for line in lines:
        prompt = client.prompt
        answers.append(client.type(str(line)))
        out += [prompt, str(line), "\n", answers[-1]]
    if not client.closed:
        out.append(client.prompt)
    return "".join(out), answers

