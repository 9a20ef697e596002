#!/usr/bin/python3
"""sync_workspace to 3 hosts over TCP (issue 20) beside rsync to a daemon on each, in one run.
Three namespace hosts (tests/python/netns_hosts.py; root needed), each running
`xmesh-hostd --listen tcp://ADDR:7000 --key-file K` and `rsync --daemon` on ADDR:8730; this
process is the controller in the root namespace. The same generated tree as sync_bench.py
(small files plus 20 MiB blobs): the initial sync into a fresh destination, a no-op re-sync and
one file changed. The rsync peer pushes to the three daemons concurrently, as xmesh serves its
hosts concurrently; xmesh's links are encrypted (CURVE), rsync's are not.

    sudo PYTHONPATH=build/python /usr/bin/python3 bench/tcp_sync.py [--small N] [--big N] [--repeat N]

Targets (issue 20): no-op and one-file as on one machine (under 20 ms); initial within 1.5x of rsync.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import xmesh  # noqa: E402
from xmesh import _core  # noqa: E402
from netns_hosts import NetnsHosts, unavailable  # noqa: E402
from sync_bench import edit, make_tree, timed  # noqa: E402
from tcp_hosts import start_agents  # noqa: E402

RSYNC_PORT = 8730


def start_rsync_daemons(net: NetnsHosts, tmp: str) -> list:
    daemons = []
    for i, h in enumerate(net.hosts):
        dest = os.path.join(tmp, f"rsync-dst-{i}")
        os.makedirs(dest)
        conf = os.path.join(tmp, f"rsyncd-{i}.conf")
        with open(conf, "w") as f:
            f.write(f"use chroot = no\nreverse lookup = no\nuid = {os.getuid()}\ngid = {os.getgid()}\n"
                    f"[ws]\n  path = {dest}\n"
                    "  read only = no\n")
        daemons.append(h.popen(["rsync", "--daemon", "--no-detach", f"--port={RSYNC_PORT}", f"--address={h.addr}",
                                f"--config={conf}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(0.5)
    return daemons


def rsync_to_all(net: NetnsHosts, src: str, sub: str) -> None:
    """rsync -a --delete to every host's daemon, concurrently."""
    pushes = [subprocess.Popen(["rsync", "-a", "--delete", src + "/", f"rsync://{h.addr}:{RSYNC_PORT}/ws/{sub}/"])
              for h in net.hosts]
    if any(p.wait() != 0 for p in pushes):
        raise RuntimeError("an rsync push failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=10000)
    ap.add_argument("--big", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"tcp_sync.py needs namespace hosts: {why}")
    if not shutil.which("rsync"):
        sys.exit("tcp_sync.py needs rsync (scripts/setup.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="xmesh-tcpsync-")
    os.chmod(tmp, 0o700)
    key = os.path.join(tmp, "cluster.key")
    _core.write_new_key_file(key)
    src = os.path.join(tmp, "src")
    make_tree(src, args.small, args.big)
    rows: dict[str, dict[str, list[float]]] = {}

    def add(name: str, peer: str, ms: float) -> None:
        rows.setdefault(name, {}).setdefault(peer, []).append(ms)

    with NetnsHosts(3) as net:
        agents = start_agents(net, tmp, key)
        daemons = start_rsync_daemons(net, tmp)
        try:
            hm = xmesh.hosts([f"{h.addr}:7000" for h in net.hosts], key_file=key)
            hm.initialized.get(timeout=30)
            for r in range(max(2, args.repeat // 2)):
                add("initial", "rsync daemons", timed(lambda: rsync_to_all(net, src, f"init{r}")))
                add("initial", "xmesh", timed(lambda: hm.sync_workspace(src, dest=f"init{r}")))
            time.sleep(1.1)  # past the racy window of the files just written
            for r in range(args.repeat):
                add("no-op", "rsync daemons", timed(lambda: rsync_to_all(net, src, "init0")))
                add("no-op", "xmesh", timed(lambda: hm.sync_workspace(src, dest="init0")))
            for r in range(args.repeat):
                edit(src, 1, r)
                add("1 file changed", "rsync daemons", timed(lambda: rsync_to_all(net, src, "init0")))
                add("1 file changed", "xmesh", timed(lambda: hm.sync_workspace(src, dest="init0")))
        finally:
            for p in daemons + agents:
                p.terminate()
            for p in daemons + agents:
                p.wait(timeout=15)
    size = sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(src) for f in fs) / 2**20
    print(f"sync to 3 namespace hosts: {args.small} small files + {args.big} x 20 MiB ({size:.0f} MiB), "
          f"median ms of {args.repeat} ({max(2, args.repeat // 2)} for initial)")
    print(f"  {'':<18}{'xmesh':>10}{'rsync daemons':>15}{'ratio':>8}")
    for name, by in rows.items():
        x, r = statistics.median(by["xmesh"]), statistics.median(by["rsync daemons"])
        print(f"  {name:<18}{x:>10.1f}{r:>15.1f}{x / r:>7.2f}x")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
