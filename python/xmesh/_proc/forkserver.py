"""The host agent's fork server (issue 23): a Python that has imported xmesh once and forks a
proc for each request, so a proc starts without Python's start-up and xmesh's imports (about
0.1 s of CPU each, which on a few cores is most of a mesh's spawn time).

`xmesh-hostd` starts `python -m xmesh._proc.worker --fork-server` (so that `ps` shows its procs
with the worker's command line) with a unix stream socket on fd 3 and the
environment and working directory of the procs it will serve (one fork server per distinct
command, directory and environment outside XMESH_*: what an import could depend on). A request
is a 4-byte big-endian length and a JSON object {"env": {...}, "cwd": "..."}, with the proc's
stdout and stderr pipes attached (SCM_RIGHTS); the answer is the same framing around {"pid": N}
or {"error": why}.

For each request the server forks twice: the middle process exits at once, so the proc is
reparented to the host agent (a child subreaper) and is the agent's to wait for, as a proc it
started itself would be. The proc then takes its pipes as stdout and stderr, /dev/null as stdin,
its own process group, directory and environment (XMESH_* is read only after this: no module
reads it at import), and runs `xmesh._proc.worker` as `python -m xmesh._proc.worker` would. The server
never starts a thread (a fork copies only the calling thread), and holds nothing a proc could
share: the socket and the pipes are closed in the proc before the worker runs.
"""
import json
import os
import runpy
import socket
import struct
import sys
import time
from typing import List, Optional, Tuple

AGENT_FD = 3

MAX_REQUEST = 16 << 20  # an environment is kilobytes; more is a broken agent, not a request


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _request(sock: socket.socket) -> Tuple[dict, List[int]]:
    """One request and the fds that came with it (EOFError when the agent closed the socket)."""
    head, fds, _, _ = socket.recv_fds(sock, 4, 4)
    if not head:
        raise EOFError
    head += _read_exactly(sock, 4 - len(head))
    (size,) = struct.unpack(">I", head)
    if size > MAX_REQUEST:
        raise ValueError(f"a request of {size} bytes")
    return json.loads(_read_exactly(sock, size)), list(fds)


def _answer(sock: socket.socket, msg: dict) -> None:
    body = json.dumps(msg).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def _fork_proc() -> Tuple[Optional[int], int]:
    """In the server: (the proc's pid, the middle process's). In the proc: (None, the middle
    process's pid): it goes on to run the worker."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: fork the proc, say its pid, leave
        os.close(r)
        me = os.getpid()
        proc = os.fork()
        if proc == 0:
            os.close(w)
            return None, me
        os.write(w, struct.pack(">i", proc))
        os._exit(0)
    os.close(w)
    try:
        raw = b""
        while len(raw) < 4:
            chunk = os.read(r, 4 - len(raw))
            if not chunk:
                raise OSError("the middle process of a fork ended without the proc's pid")
            raw += chunk
        return struct.unpack(">i", raw)[0], middle
    finally:
        os.close(r)
        os.waitpid(middle, 0)


def serve(sock: socket.socket) -> Tuple[dict, List[int], int]:
    """Answers requests until the agent closes the socket (then exits); returns only in a
    forked proc, with its request, its pipes and the middle process's pid."""
    while True:
        try:
            request, fds = _request(sock)
        except (EOFError, ConnectionError):
            os._exit(0)
        except (ValueError, OSError) as e:
            _answer(sock, {"error": f"the fork server could not read a request: {e}"})
            continue
        if len(fds) != 2 or not isinstance(request.get("env"), dict) or not isinstance(request.get("cwd"), str):
            for fd in fds:
                os.close(fd)
            _answer(sock, {"error": "a request is {env, cwd} with the proc's stdout and stderr attached"})
            continue
        if request["cwd"] and not os.path.isdir(request["cwd"]):  # said by the agent's own start instead
            for fd in fds:
                os.close(fd)
            _answer(sock, {"error": f"no directory {request['cwd']}"})
            continue
        try:
            pid, middle = _fork_proc()
        except OSError as e:
            pid, middle = -1, 0
            _answer(sock, {"error": f"fork failed: {e}"})
        if pid is None:
            return request, fds, middle
        for fd in fds:
            os.close(fd)
        if pid > 0:
            _answer(sock, {"pid": pid})


def _set_process_name(name: bytes) -> None:
    import ctypes

    PR_SET_NAME = 15
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _become_proc(sock: socket.socket, request: dict, fds: List[int], middle: int) -> None:
    """In the forked proc: what a proc the agent started itself would have."""
    sock.close()
    _set_process_name(os.path.basename(sys.executable).encode())
    # The agent (a subreaper) adopts it once the middle process is gone: wait for that, so the
    # worker's parent-death signal is tied to the agent.
    while os.getppid() == middle:
        time.sleep(0.0005)
    os.setpgid(0, 0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (devnull, *fds):
        os.close(fd)
    os.chdir(request["cwd"] or "/")
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})


def main() -> None:
    sock = socket.socket(fileno=AGENT_FD)
    sock.set_inheritable(False)
    from .._runtime.agents import FORK_SERVER_NAME

    _set_process_name(FORK_SERVER_NAME)  # its procs get python3's back
    import xmesh  # noqa: F401  (the point: what every proc imports, imported once)

    request, fds, middle = serve(sock)
    _become_proc(sock, request, fds, middle)
    sys.argv = sys.argv[:1]  # as `python -m xmesh._proc.worker` (run_module sets argv[0] to its file)
    runpy.run_module("xmesh._proc.worker", run_name="__main__", alter_sys=True)
