"""sync_workspace beside rsync, in the same run, on a generated tree of 10,000 small files plus
5 files of 20 MiB: initial sync, no-op re-sync, one file changed, 100 files changed, to 1 host
agent and to 4. Peers: local `rsync -a` and rsync over a loopback rsync daemon (what Monarch
uses). Also checks, from the 4 agents' own byte counts, that each changed byte reached each
host once.

    /usr/bin/python3 bench/sync_bench.py [--small N] [--big N] [--repeat N]
(run from the build tree: PYTHONPATH=build/python, or after installing)."""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import xmesh
from xmesh._runtime.agents import agent


def make_tree(root, small, big):
    for i in range(small):
        d = os.path.join(root, f"pkg{i // 100:03d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"mod{i % 100:03d}.py"), "w") as f:
            f.write(f"x = {i}\n" * (10 + i % 190))
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    for j in range(big):
        with open(os.path.join(root, "data", f"blob{j}.bin"), "wb") as f:
            f.write(os.urandom(20 * 2**20))


def timed(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def rsync_local(src, dst):
    subprocess.run(["rsync", "-a", "--delete", src + "/", dst + "/"], check=True)


class RsyncDaemon:
    def __init__(self, base):
        self.dir = os.path.join(base, "daemon-dst")
        os.makedirs(self.dir)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        conf = os.path.join(base, "rsyncd.conf")
        with open(conf, "w") as f:
            f.write(f"use chroot = no\nuid = {os.getuid()}\ngid = {os.getgid()}\n"
                    f"[ws]\n  path = {self.dir}\n  read only = no\n")
        self.proc = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--port={self.port}", "--address=127.0.0.1",
                                      f"--config={conf}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("rsync daemon did not start")

    def push(self, src, sub):
        subprocess.run(["rsync", "-a", "--delete", src + "/", f"rsync://127.0.0.1:{self.port}/ws/{sub}/"], check=True)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def edit(root, n, round_):
    """Changes n small files (appends a line)."""
    for i in range(n):
        path = os.path.join(root, f"pkg{(i * 7) % 100:03d}", f"mod{(i * 13 + round_) % 100:03d}.py")
        with open(path, "a") as f:
            f.write(f"edit = {round_}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=10000)
    ap.add_argument("--big", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if not shutil.which("rsync"):
        sys.exit("sync_bench needs rsync (scripts/setup.sh installs it)")
    base = tempfile.mkdtemp(prefix="xmesh-sync-bench-")
    os.chmod(base, 0o700)
    src = os.path.join(base, "src")
    make_tree(src, args.small, args.big)
    dirs = [os.path.join(base, f"rt{i}") for i in range(4)]
    for d in dirs:
        os.makedirs(d, mode=0o700)
    one, four = xmesh.hosts(dirs[:1]), xmesh.hosts(dirs)
    daemon = RsyncDaemon(base)
    rows = {}

    def add(name, peer, ms):
        rows.setdefault(name, {}).setdefault(peer, []).append(ms)

    try:
        # Initial: each into a fresh destination, interleaved so page cache and disk pressure are alike.
        for r in range(max(2, args.repeat // 2)):
            add("initial", "rsync -a", timed(lambda: rsync_local(src, os.path.join(base, f"local{r}"))))
            add("initial", "rsync daemon", timed(lambda: daemon.push(src, f"init{r}")))
            add("initial", "xmesh 1 host", timed(lambda: one.sync_workspace(src, dest=f"init{r}")))
            add("initial", "xmesh 4 hosts", timed(lambda: four.sync_workspace(src, dest=f"four{r}")))
        # The steady destinations: local0, daemon init0, dest init0 / four0.
        time.sleep(1.1)  # past the racy window of the files just written
        for r in range(args.repeat):
            add("no-op", "rsync -a", timed(lambda: rsync_local(src, os.path.join(base, "local0"))))
            add("no-op", "rsync daemon", timed(lambda: daemon.push(src, "init0")))
            add("no-op", "xmesh 1 host", timed(lambda: one.sync_workspace(src, dest="init0")))
            add("no-op", "xmesh 4 hosts", timed(lambda: four.sync_workspace(src, dest="four0")))
        received = []
        for label, n in (("1 file changed", 1), ("100 files changed", 100)):
            for r in range(args.repeat):
                # Each peer sees the same edit: edit, sync all peers, next round.
                edit(src, n, r + (1000 if n > 1 else 0))
                add(label, "rsync -a", timed(lambda: rsync_local(src, os.path.join(base, "local0"))))
                add(label, "rsync daemon", timed(lambda: daemon.push(src, "init0")))
                add(label, "xmesh 1 host", timed(lambda: one.sync_workspace(src, dest="init0")))
                before = [agent(d).status()["sync_bytes_received"] for d in dirs]
                rep = {}
                add(label, "xmesh 4 hosts", timed(lambda: rep.setdefault("r", four.sync_workspace(src, dest="four0"))))
                after = [agent(d).status()["sync_bytes_received"] for d in dirs]
                content = sum(size for _, size, _ in rep["r"].files_sent)
                received.append((label, content, [a - b for a, b in zip(after, before)], rep["r"]))
    finally:
        daemon.stop()

    print(f"sync_workspace vs rsync: {args.small} small files + {args.big} x 20 MiB "
          f"({sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(src) for f in fs) / 2**20:.0f} MiB), "
          f"median ms of {args.repeat} ({max(2, args.repeat // 2)} for initial)")
    peers = ["rsync -a", "rsync daemon", "xmesh 1 host", "xmesh 4 hosts"]
    print(f"  {'':<20}" + "".join(f"{p:>15}" for p in peers) + f"{'xmesh/rsync -a':>16}")
    for name, by_peer in rows.items():
        med = {p: statistics.median(v) for p, v in by_peer.items()}
        print(f"  {name:<20}" + "".join(f"{med[p]:>15.1f}" for p in peers) +
              f"{med['xmesh 1 host'] / med['rsync -a']:>16.2f}")
    print("  bytes per host agent, 4 hosts (changed content; what each agent counted, manifest included):")
    for label, content, per_host, rep in received[-2:] + received[:1]:
        print(f"    {label}: content {content} B; received {per_host}")
    # This controller goes first (so it does not report the agents going quiet), then the agents.
    from xmesh._runtime.process import runtime_if_started

    if runtime_if_started() is not None:
        runtime_if_started().shutdown()
    for d in dirs:
        subprocess.run([sys.executable, "-m", "xmesh.cli", "shutdown", "--runtime-dir", d], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
