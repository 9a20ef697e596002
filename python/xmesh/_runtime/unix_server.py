"""A unix-socket server only this user reaches: created mode 0600 (never briefly wider) in the
runtime directory's 0700 controller directory, and each connecting peer's uid checked
(SO_PEERCRED). Every controller serves two on it: `xmesh debug`'s prompt (`<pid>.debug`,
_debug_remote) and the panel's queries (`<pid>.panel`, _panel). Each client is served on a
thread of its own by `on_client(conn, peer_pid)`, which owns the connection."""
import glob
import os
import socket
import struct
import sys
import threading
from typing import Callable, Dict, Optional

from .. import _core
from .._base.pids import pid_alive
from .._base.threads import start_thread


def peer_credentials(conn: socket.socket) -> tuple:
    """(pid, uid) of the process at the other end of a unix socket."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return pid, uid


def read_bounded_line(rfile, limit: int) -> "bytes | None":
    """One line of at most `limit` bytes from a binary file; b"" at the end of input; None for a
    longer line, whose rest is read and dropped in pieces rather than held."""
    raw = rfile.readline(limit + 1)
    if len(raw) <= limit or raw.endswith(b"\n"):
        return raw
    while raw and not raw.endswith(b"\n"):
        raw = rfile.readline(limit)
    return None


def live_sockets(rundir: str, suffix: str, remove_dead: bool = False) -> Dict[int, str]:
    """{pid: path} of the `<pid><suffix>` sockets of a runtime directory's live controllers
    (remove_dead: the sockets of those that died are removed)."""
    out = {}
    for path in glob.glob(os.path.join(_core.layout_controller_dir(rundir), f"*{suffix}")):
        try:
            pid = int(os.path.basename(path)[: -len(suffix)])
        except ValueError:
            continue
        if pid_alive(pid):
            out[pid] = path
        elif remove_dead:
            try:
                os.unlink(path)
            except OSError:
                pass
    return out


class OwnerOnlyServer:
    def __init__(self, path: str, on_client: Callable[[socket.socket, int], None], name: str) -> None:
        self.path = path
        self._on_client = on_client
        self._name = name
        self._sock: Optional[socket.socket] = None

    def start(self, what: str) -> bool:
        """Listens; returns False (saying on stderr that `what` cannot reach this program, and
        why) where the path cannot be bound."""
        try:
            if os.path.exists(self.path):
                os.unlink(self.path)  # a pid's earlier process that died without cleaning up
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)  # the socket is created 0600, never briefly wider
            try:
                sock.bind(self.path)
            finally:
                os.umask(old)
            sock.listen(4)
        except OSError as e:
            sys.stderr.write(f"[xmesh] {what} cannot reach this program: cannot listen on {self.path}: {e}\n")
            return False
        self._sock = sock
        start_thread(threading.Thread(target=self._accept_loop, name=f"{self._name}-server", daemon=True))
        return True

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def _accept_loop(self) -> None:
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                pid, uid = peer_credentials(conn)
            except OSError:
                conn.close()
                continue
            if uid != os.getuid():
                conn.close()  # another user: the directory's mode should have kept them out already
                continue
            start_thread(threading.Thread(target=self._on_client, args=(conn, pid), name=f"{self._name}-client",
                                          daemon=True))
