"""A large tree synced to one host agent beside rsync, in one run: time and peak memory of
each side, and how the agent answers a `status` request while it commits (its main loop must
stay free: output forwarding, spawns and heartbeats go on during a long sync).

    /usr/bin/python3 bench/sync_large.py [--files N] [--per-dir N]
(run from the build tree: PYTHONPATH=build/python, or after installing). The tree is N files of
a few bytes in directories of --per-dir; a fresh agent runs it so its peak is this sync's."""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import xmesh
from xmesh._runtime.agents import agent


def make_tree(root: str, files: int, per_dir: int) -> None:
    for i in range(files):
        d = os.path.join(root, f"d{i // per_dir:05d}")
        if i % per_dir == 0:
            os.makedirs(d)
        with open(os.path.join(d, f"f{i % per_dir:05d}.txt"), "w") as f:
            f.write(f"{i}\n")


def kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class StatusProbe:
    """Asks the agent for its status every 50 ms while a sync runs; keeps the slowest answer."""

    def __init__(self, runtime_dir: str):
        self.client, self.worst_ms, self.asked = agent(runtime_dir), 0.0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.05):
            t = time.perf_counter()
            self.client.status(timeout=600)
            self.worst_ms = max(self.worst_ms, (time.perf_counter() - t) * 1000)
            self.asked += 1

    def __enter__(self) -> "StatusProbe":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def rsync_peak(src: str, dst: str) -> tuple:
    t = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run(["rsync", "-a", "--delete", src + "/", dst + "/"], check=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the largest child so far: only a new maximum is this run's.
    return time.perf_counter() - t, peak if peak > before else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--per-dir", type=int, default=1000)
    ap.add_argument("--no-probe", action="store_true", help="do not ask the agent for its status during the sync")
    args = ap.parse_args()
    if not shutil.which("rsync"):
        sys.exit("sync_large needs rsync (scripts/setup.sh installs it)")
    base = tempfile.mkdtemp(prefix="xmesh-sync-large-")
    os.chmod(base, 0o700)
    src, rt = os.path.join(base, "src"), os.path.join(base, "rt")
    os.makedirs(rt, mode=0o700)
    t = time.perf_counter()
    make_tree(src, args.files, args.per_dir)
    print(f"tree: {args.files} files in {args.files // args.per_dir} directories, made in {time.perf_counter() - t:.1f} s")
    rs_s, rs_kib = rsync_peak(src, os.path.join(base, "rsync-dst"))
    hosts = xmesh.hosts([rt])
    pid = agent(rt).status().pid
    me = os.getpid()
    agent_before, ctl_before = kib(pid, "VmRSS"), kib(me, "VmRSS")
    probe = StatusProbe(rt)
    t = time.perf_counter()
    if args.no_probe:
        report = hosts.sync_workspace(src, dest="big")
    else:
        with probe:
            report = hosts.sync_workspace(src, dest="big")
    xm_s = time.perf_counter() - t
    agent_peak, agent_after, ctl_peak = kib(pid, "VmHWM"), kib(pid, "VmRSS"), kib(me, "VmHWM")
    time.sleep(1.1)  # past the racy window
    t = time.perf_counter()
    hosts.sync_workspace(src, dest="big")
    noop_s = time.perf_counter() - t
    # A proc rewrites a file of its copy (same content): the agent's watch saw it, so the next sync
    # checks the whole copy against its saved manifest (stat, a re-hash of that file): its memory.
    copy = report.hosts[0]["dirs"][0]
    touched = os.path.join(copy, "d00000", "f00000.txt")
    with open(touched, "r+") as f:
        data = f.read()
        f.seek(0)
        f.write(data)  # the same bytes again: seen by the watch, the digest unchanged
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets the agent's VmHWM to its RSS now
    check_before = kib(pid, "VmRSS")
    t = time.perf_counter()
    again = hosts.sync_workspace(src, dest="big")
    check_s, check_peak = time.perf_counter() - t, kib(pid, "VmHWM")
    assert again.up_to_date, again
    print(f"rsync -a:           {rs_s:7.1f} s, peak RSS of its largest process "
          f"{(rs_kib or 0) / 1024:6.0f} MiB")
    print(f"xmesh initial sync: {xm_s:7.1f} s ({xm_s / rs_s:.2f}x rsync), {report!r}")
    # The agent's peak does not grow with the tree (compare two --files): said in MiB, not per file.
    print(f"  agent RSS {agent_before / 1024:.0f} -> peak {agent_peak / 1024:.0f} -> after {agent_after / 1024:.0f} MiB"
          f" (the largest rsync process: {(rs_kib or 0) / 1024:.0f} MiB)")
    print(f"  controller RSS {ctl_before / 1024:.0f} -> peak {ctl_peak / 1024:.0f} MiB"
          f" ({(ctl_peak - ctl_before) * 1024 / args.files:.0f} B/file at peak)")
    print(f"  agent status answered {probe.asked} times during the sync, slowest {probe.worst_ms:.0f} ms")
    print(f"xmesh no-op sync:   {noop_s:7.2f} s")
    print(f"xmesh no-op sync after a file of the host copy was rewritten: {check_s:.2f} s, agent RSS "
          f"{check_before / 1024:.0f} -> peak {check_peak / 1024:.0f} MiB (the copy checked against its manifest)")
    from xmesh._runtime.process import runtime_if_started

    if runtime_if_started() is not None:
        runtime_if_started().shutdown()
    subprocess.run([sys.executable, "-m", "xmesh.cli", "shutdown", "--runtime-dir", rt], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
