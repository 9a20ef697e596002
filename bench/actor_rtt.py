#!/usr/bin/python3
"""xmesh beside its peers, measured in one run on this machine: round-trip latency of a no-op
endpoint, fan-out of call() to N actors, time to spawn 8 ready procs, and time from kill -9 of
a busy proc to the caller's error. Prints one table (medians, p99, ratios).

    /usr/bin/python3 bench/actor_rtt.py [--quick]

Uses the installed xmesh (or PYTHONPATH=build/python). Peers: a raw C++ ZeroMQ ping-pong (the
floor), multiprocessing Pipes, ipyparallel (python3-ipyparallel), dask.distributed.
"""
import argparse
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # bench_actors is importable by the procs too

import bench_actors  # noqa: E402
from bench_stats import pct  # noqa: E402


def summary(samples_us):
    return statistics.median(samples_us), pct(samples_us, 99)


# ---- the floor ------------------------------------------------------------------------------
def _zmq_exe():
    return os.environ.get("XMESH_BENCH_ZMQ") or shutil.which("xmesh_bench_zmq_pingpong") or os.path.join(
        HERE, "..", "build", "bench", "xmesh_bench_zmq_pingpong")


def zmq_fanout(k, reps):
    """Raw ZeroMQ: k server processes, send to all then receive from all."""
    exe = _zmq_exe()
    prefix = f"ipc://{tempfile.mkdtemp(prefix='xf-')}/s"
    servers = [subprocess.Popen([exe, "serve", f"{prefix}{i}"]) for i in range(k)]
    try:
        out = subprocess.run([exe, "fanout", prefix, str(k), str(reps)], capture_output=True, text=True,
                             timeout=300).stdout
    finally:
        for s in servers:
            s.wait(timeout=10)
    return [float(x) for x in out.split()]


def ring_floor(n):
    """Two processes over two shared-memory rings (bench/ring_pingpong.cpp): issue 23's floor."""
    exe = os.environ.get("XMESH_BENCH_RING") or shutil.which("xmesh_bench_ring_pingpong") or os.path.join(
        HERE, "..", "build", "bench", "xmesh_bench_ring_pingpong")
    out = subprocess.run([exe, str(n)], capture_output=True, text=True, timeout=120).stdout
    return [float(x) for x in out.split()]


def zmq_floor(n):
    exe = _zmq_exe()
    addr = f"ipc://{tempfile.mkdtemp(prefix='xb-')}/pp"
    server = subprocess.Popen([exe, "serve", addr])
    try:
        out = subprocess.run([exe, "ping", addr, str(n)], capture_output=True, text=True, timeout=120).stdout
    finally:
        server.wait(timeout=10)
    return [float(x) for x in out.split()]


# ---- multiprocessing ----------------------------------------------------------------------------
def _echo(conn):
    while True:
        m = conn.recv()
        if m is None:
            return
        conn.send(m)


def mp_pingpong(n):
    a, b = mp.Pipe()
    p = mp.Process(target=_echo, args=(b,))
    p.start()
    for _ in range(100):
        a.send(1)
        a.recv()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        a.send(1)
        a.recv()
        out.append((time.perf_counter() - t0) * 1e6)
    a.send(None)
    p.join()
    return out


def mp_fanout(k, reps):
    pipes, procs = [], []
    for _ in range(k):
        a, b = mp.Pipe()
        p = mp.Process(target=_echo, args=(b,))
        p.start()
        pipes.append(a)
        procs.append(p)
    out = []
    for i in range(reps + 20):
        t0 = time.perf_counter()
        for a in pipes:
            a.send(1)
        for a in pipes:
            a.recv()
        if i >= 20:
            out.append((time.perf_counter() - t0) * 1e6)
    for a in pipes:
        a.send(None)
    for p in procs:
        p.join()
    return out


def mp_spawn8(reps, method):
    """Seconds to start 8 multiprocessing workers (`method`: "spawn", a fresh interpreter each as
    xmesh's procs are, or "fork", a copy of this process) and get a reply from each."""
    ctx = mp.get_context(method)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pipes, procs = [], []
        for _ in range(8):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_echo, args=(b,))
            p.start()
            pipes.append(a)
            procs.append(p)
        for a in pipes:
            a.send(1)
        for a in pipes:
            a.recv()
        out.append(time.perf_counter() - t0)
        for a in pipes:
            a.send(None)
        for p in procs:
            p.join()
    return out


# ---- xmesh ----------------------------------------------------------------------------------------
def xmesh_rtt_batch(ep, n):
    return timed_us(lambda: ep.call_one().get(), n, 0)


def rtt_side_by_side(n, rounds=5):
    """The floor, xmesh and multiprocessing measured in alternating batches, so that noise on
    this shared machine falls on all of them alike."""
    from xmesh import this_host

    pm = this_host().spawn_procs({"gpus": 1})
    ep = pm.spawn("noop", bench_actors.Noop).noop
    for _ in range(200):
        ep.call_one().get()
    floor, xm, mpp = [], [], []
    for _ in range(rounds):
        floor += zmq_floor(n // rounds)
        xm += xmesh_rtt_batch(ep, n // rounds)
        mpp += mp_pingpong(n // rounds)
    pm.stop()
    return floor, xm, mpp


def xmesh_fanout(k, reps, pm_cache={}):
    from xmesh import this_host

    if "pm" not in pm_cache:
        pm_cache["pm"] = this_host().spawn_procs({"gpus": 16})
        pm_cache["mesh"] = pm_cache["pm"].spawn("noop16", bench_actors.Noop)
        pm_cache["mesh"].initialized.get()
    mesh = pm_cache["mesh"].slice(gpus=slice(0, k))
    return timed_us(lambda: mesh.noop.call().get(), reps, 20)


def xmesh_spawn8(reps):
    from xmesh import this_host

    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pm = this_host().spawn_procs({"gpus": 8})
        pm.initialized.get()
        out.append(time.perf_counter() - t0)
        pm.stop()
    return out


def _memory_kib(pid):
    """(RSS, PSS) of a process in KiB: PSS counts pages it shares (a fork server's) in part."""
    with open(f"/proc/{pid}/status") as f:
        rss = int(next(line for line in f if line.startswith("VmRSS")).split()[1])
    with open(f"/proc/{pid}/smaps_rollup") as f:
        pss = int(next(line for line in f if line.startswith("Pss:")).split()[1])
    return rss, pss


def idle_proc_memory():
    """{forked: (RSS, PSS) median MiB} of 8 idle procs, forked by the host agent's fork server
    and started from their command line (XMESH_FORK_SERVER=0, read at each spawn)."""
    from xmesh import this_host

    out = {}
    saved = os.environ.get("XMESH_FORK_SERVER")
    try:
        for forked in (True, False):
            os.environ["XMESH_FORK_SERVER"] = "1" if forked else "0"
            pm = this_host().spawn_procs({"gpus": 8})
            pm.initialized.get()
            time.sleep(1.0)  # settled: what an idle proc holds
            mem = [_memory_kib(pid) for pid in pm.pids]
            out[forked] = (statistics.median(r for r, _ in mem) / 1024, statistics.median(p for _, p in mem) / 1024)
            pm.stop()
    finally:
        if saved is None:
            os.environ.pop("XMESH_FORK_SERVER", None)
        else:
            os.environ["XMESH_FORK_SERVER"] = saved
    return out


def xmesh_kill_to_error(reps):
    from xmesh import ActorError, this_host

    out = []
    for _ in range(reps):
        pm = this_host().spawn_procs({"gpus": 1})
        a = pm.spawn("busy", bench_actors.Noop)
        pid = a.pid.call_one().get()
        fut = a.busy.call_one(30)
        time.sleep(0.2)
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        try:
            fut.get(timeout=30)
        except ActorError:
            pass
        out.append(time.perf_counter() - t0)
        pm.stop()
    return out


# ---- ipyparallel and dask --------------------------------------------------------------------------
def _ipp_noop():
    return None


def ipp_cluster(n):
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=n, log_level=40)
    t0 = time.perf_counter()
    rc = cluster.start_and_connect_sync()
    rc.wait_for_engines(n, timeout=120)
    return cluster, rc, time.perf_counter() - t0


def timed_us(fn, n, warmup):
    """Runs fn warmup times, then n times; returns each run's time in microseconds."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def ipp_rtt(rc, n):
    v = rc[0]
    return timed_us(lambda: v.apply_sync(_ipp_noop), n, 20)


def ipp_fanout(rc, k, reps):
    v = rc[list(range(k))]
    return timed_us(lambda: v.apply_sync(_ipp_noop), reps, 5)


def dask_spawn8():
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    cluster = LocalCluster(n_workers=8, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    client.wait_for_workers(8)
    elapsed = time.perf_counter() - t0
    client.close()
    cluster.close()
    return elapsed


# ---- main -------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer samples, no 16-engine ipyparallel cluster")
    args = ap.parse_args()
    n = 500 if args.quick else 3000
    reps = 50 if args.quick else 200
    rows = []

    floor_s, xm_s, mp_s = rtt_side_by_side(n)
    floor, xm, mpp = summary(floor_s), summary(xm_s), summary(mp_s)
    cluster1, rc1, _ = ipp_cluster(1)
    ipr = summary(ipp_rtt(rc1, max(100, n // 10)))
    cluster1.stop_cluster_sync()
    rows.append(("round trip, no-op endpoint (us)", "median", "p99"))
    rows.append(("  raw C++ ZeroMQ ping-pong (floor)", floor[0], floor[1]))
    ring = summary(ring_floor(n))
    rows.append(("  C++ shared-memory rings (issue 23's floor)", ring[0], ring[1]))
    rows.append(("  xmesh call_one().get()", xm[0], xm[1]))
    rows.append(("  multiprocessing Pipe", mpp[0], mpp[1]))
    rows.append(("  ipyparallel apply_sync", ipr[0], ipr[1]))
    ratios = [f"xmesh / multiprocessing Pipe = {xm[0] / mpp[0]:.2f}x (issue 23's target <= 2x)",
              f"xmesh / ZeroMQ floor = {xm[0] / floor[0]:.2f}x (target <= 3x)",
              f"ipyparallel / xmesh = {ipr[0] / xm[0]:.1f}x (target >= 10x)"]

    sizes = [1, 2, 4, 8, 16]
    ipp_n = 4 if args.quick else 16
    cluster, rc, ipp_start16 = ipp_cluster(ipp_n)
    rows.append(("call() fan-out to N actors (us, median)", "xmesh", "mp", "ipyparallel", "raw ZeroMQ"))
    fan = {}
    for k in sizes:
        x = statistics.median(xmesh_fanout(k, reps))
        m = statistics.median(mp_fanout(k, reps))
        i = statistics.median(ipp_fanout(rc, k, max(20, reps // 5))) if k <= ipp_n else float("nan")
        z = statistics.median(zmq_fanout(k, reps))
        fan[k] = (x, m, i, z)
        rows.append((f"  N={k}", x, m, i, z))
    cluster.stop_cluster_sync()
    x16, m16, i16, z16 = fan[16]
    ratios.append(f"call() to 16: xmesh / multiprocessing = {x16 / m16:.2f}x (issue 23's target <= 1.5x); "
                  f"ipyparallel / xmesh = {i16 / x16:.1f}x (target >= 20x); "
                  f"raw ZeroMQ / multiprocessing = {z16 / m16:.2f}x, xmesh / raw ZeroMQ = {x16 / z16:.2f}x")

    xs = statistics.median(xmesh_spawn8(3 if args.quick else 5))
    ms = statistics.median(mp_spawn8(3 if args.quick else 5, "spawn"))
    mf = statistics.median(mp_spawn8(3 if args.quick else 5, "fork"))
    ds = dask_spawn8()
    c8, rc8, ipp8 = ipp_cluster(8)
    c8.stop_cluster_sync()
    rows.append(("8 procs ready (s)", "xmesh", "mp spawn", "mp fork", "dask", "ipyparallel"))
    rows.append(("  spawn to ready", xs, ms, mf, ds, ipp8))
    ratios.append(f"spawn 8: xmesh {xs:.3f} s = {xs / ms:.2f}x multiprocessing's spawn (target <= 0.75x), "
                  f"{xs / mf:.2f}x its fork; dask / xmesh = {ds / xs:.1f}x")

    mem = idle_proc_memory()
    rows.append(("idle proc memory (MiB, median of 8)", "RSS", "PSS"))
    rows.append(("  forked by the fork server", *mem[True]))
    rows.append(("  started from its command line", *mem[False]))

    k = xmesh_kill_to_error(3 if args.quick else 5)
    rows.append(("kill -9 of a busy proc to the caller's error (s)", "median", "max"))
    rows.append(("  xmesh", statistics.median(k), max(k)))
    ratios.append(f"kill-to-error: {statistics.median(k):.3f} s (target < 2 s)")

    print(f"xmesh benchmark on {os.uname().nodename}, {os.cpu_count()} cores, {'quick' if args.quick else 'full'} run")
    for row in rows:
        cells = [f"{c:>12.1f}" if isinstance(c, float) and c >= 1 else
                 (f"{c:>12.3f}" if isinstance(c, float) else f"{c:>12}") for c in row[1:]]
        print(f"{row[0]:<48}" + "".join(cells))
    print()
    for r in ratios:
        print(r)


if __name__ == "__main__":
    main()
