"""Monarch's manual bootstrap on xmesh: `run_worker_loop_forever(address, ca)` on each worker
serves that host, `attach_to_workers(workers=[...], ca)` in the client makes a HostMesh of them.
A worker is an xmesh host agent (xmesh-hostd), so this is the same as starting agents by hand and
calling xmesh.hosts():

- `ipc://PATH`: an agent whose runtime directory is PATH, for clients on the same machine (the
  directory's permissions are the access control, as for every local agent).
- `tcp://HOST:PORT`: an agent serving clients elsewhere. xmesh's TCP is always authenticated and
  encrypted (CURVE) with a shared key file (`xmesh keygen FILE`); `ca` names that file, or with
  Monarch's `ca="trust_all_connections"` the key file is $XMESH_KEY_FILE. Monarch's unencrypted
  mode has no counterpart: without a key file a TCP worker is refused, saying so.
"""
import os
import time
from typing import TYPE_CHECKING, List, NoReturn, Optional, Sequence

if TYPE_CHECKING:
    import xmesh

TRUST_ALL = "trust_all_connections"


def _parse(address: str) -> "tuple[str, str]":
    """("ipc", path) or ("tcp", "host:port") of a worker address; ValueError naming it otherwise."""
    if not isinstance(address, str):
        raise TypeError(f"a worker address is a str such as 'tcp://node1:7000' or 'ipc:///tmp/w0', got {address!r}")
    for scheme in ("ipc", "tcp"):
        prefix = f"{scheme}://"
        if address.startswith(prefix) and len(address) > len(prefix):
            return scheme, address[len(prefix):]
    raise ValueError(f"worker address {address!r}: xmesh's workers are tcp://HOST:PORT or ipc://PATH")


def _key_file(ca: str, address: str) -> str:
    key = os.environ.get("XMESH_KEY_FILE") if ca == TRUST_ALL else ca
    if not key:
        raise ValueError(f"{address} is a worker over TCP, which xmesh always encrypts and authenticates with a shared "
                         "key file (`xmesh keygen FILE`): pass ca=FILE, or set XMESH_KEY_FILE with "
                         "ca='trust_all_connections'")
    return os.fspath(key)


def run_worker_loop_forever(address: str, ca: str = TRUST_ALL) -> NoReturn:
    """Serves this host at address until the process is killed (it becomes xmesh's host agent:
    the process is replaced, and never exits on its own)."""
    from xmesh.cli import run_hostd

    scheme, where = _parse(address)
    os.environ["XMESH_HOSTD_IDLE"] = "0"  # forever: no idle exit
    if scheme == "ipc":
        os.makedirs(where, mode=0o700, exist_ok=True)
        run_hostd(["--runtime-dir", where])
    else:
        run_hostd(["--listen", address, "--key-file", _key_file(ca, address)])
    raise SystemExit(1)  # not reached: run_hostd replaces the process or raises


WORKER_WAIT_S = 30.0  # how long attach_to_workers waits for a worker to serve


def _accepting(host_port: str, timeout: float) -> bool:
    """Waits at most timeout seconds until something accepts TCP connections at host:port (a
    worker still starting: its interpreter imports before it listens); whether it did."""
    import socket

    host, _, port = host_port.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(1.0, timeout))).close()
            return True
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def attach_to_workers(workers: Sequence[str], ca: str = TRUST_ALL, name: Optional[str] = None) -> "xmesh.HostMesh":
    """A HostMesh (dimension "hosts") of the workers started with run_worker_loop_forever.
    A worker is waited for while it may still be starting (up to 30 s: on this machine, its
    runtime directory served; over TCP, its port accepting connections); a local one that never
    serves is a RuntimeError naming it, a TCP one is connected all the same, and
    `hosts.initialized` (or the first spawn) names what cannot be reached. `name` is accepted
    for Monarch's signature."""
    import xmesh
    from xmesh._runtime.agents import agent_serving

    if isinstance(workers, str) or not workers:
        raise TypeError("attach_to_workers(workers=[...]) takes a non-empty list of worker addresses")
    hosts: List[str] = []
    key: Optional[str] = None
    deadline = time.monotonic() + WORKER_WAIT_S  # one wait for them all
    for address in workers:
        scheme, where = _parse(address)
        if scheme == "tcp":
            key = _key_file(ca, address)
            _accepting(where, max(0.0, deadline - time.monotonic()))  # else hosts() says at once nothing listens
        elif not agent_serving(where, WORKER_WAIT_S):  # never started here: attach means existing workers
            raise RuntimeError(f"attach failed: no worker serves {address} (nothing answered there within "
                               f"{WORKER_WAIT_S:.0f} s): is run_worker_loop_forever({address!r}) running?")
        hosts.append(where if scheme == "tcp" else os.path.abspath(where))
    return xmesh.hosts(hosts, key_file=key)
