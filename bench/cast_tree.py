#!/usr/bin/python3
"""Casting to large meshes (issue 23): call() and broadcast to N actors (one per proc) through
cast trees (fan-out 16: the controller sends at most 16 messages, relay procs forward and gather
the answers) beside direct sends (one message per actor from the controller), alternated on the
same procs in the same run (the node's cast_fanout / cast_local switch between them):

- this host: N procs here, N up to 256 (trees over this host's procs: XMESH_CAST_TREE=all),
  with multiprocessing's fan-out to N Pipe workers as the plain Python reference;
- namespace hosts (root needed; tests/python/netns_hosts.py): 4 hosts, N/4 procs on each,
  reached over TCP with the cluster's key (the default: trees over other hosts' procs).

    sudo PYTHONPATH=build/python /usr/bin/python3 bench/cast_tree.py [--sizes 16,64,256] [--reps 60]

Prints medians, p99 and the ratios tree/direct and tree(N)/tree(16).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import bench_actors  # noqa: E402
from actor_rtt import mp_fanout, timed_us  # noqa: E402
from bench_stats import pct  # noqa: E402


def measure(node, mesh, tree: bool, local: bool, reps: int):
    """call() round trips and 10-broadcasts-then-a-call times (us), through trees or direct."""
    node.cast_fanout = 16 if tree else 0
    node.cast_local = local
    mesh.noop.call().get(timeout=120)  # warm: links and rings up along this shape

    def burst():
        for _ in range(10):
            mesh.noop.broadcast()
        mesh.noop.call().get(timeout=120)

    return timed_us(lambda: mesh.noop.call().get(timeout=120), reps, 0), timed_us(burst, max(5, reps // 5), 0)


def compare(node, mesh, sizes, rounds, reps, local, slicer, with_mp):
    """{N: (tree calls, direct calls, tree bursts, direct bursts, mp)}: rounds alternate the two
    ways, so that the machine's drift hits both alike."""
    results = {}
    for n in sizes:
        sub = slicer(mesh, n)
        tc, dc, tb, db = [], [], [], []
        for _ in range(rounds):
            c, b = measure(node, sub, True, local, reps // rounds)
            tc, tb = tc + c, tb + b
            c, b = measure(node, sub, False, local, reps // rounds)
            dc, db = dc + c, db + b
        mp = mp_fanout(n, max(20, reps // 2)) if with_mp else []
        results[n] = (tc, dc, tb, db, mp)
        print(f"  N={n} done", flush=True)
    node.cast_fanout, node.cast_local = 16, False
    return results


def table(title, sizes, results):
    print(f"\n{title}\ncall() to N actors, us (median / p99); 10 broadcasts + a call, us (median)")
    print(f"{'N':>5} {'tree':>17} {'direct':>17} {'tree/direct':>12} {'mp':>7} {'tree/mp':>8}"
          f" {'bcast tree':>11} {'bcast direct':>13}")
    base = statistics.median(results[sizes[0]][0])
    for n in sizes:
        tc, dc, tb, db, mp = results[n]
        t, d = statistics.median(tc), statistics.median(dc)
        m = statistics.median(mp) if mp else float("nan")
        print(f"{n:>5} {t:>8.0f} / {pct(tc, 99):<7.0f} {d:>8.0f} / {pct(dc, 99):<7.0f} {t / d:>12.2f} {m:>7.0f}"
              f" {t / m:>8.2f} {statistics.median(tb):>11.0f} {statistics.median(db):>13.0f}")
    print("tree latency from N=%d: " % sizes[0] +
          ", ".join(f"N={n} {statistics.median(results[n][0]) / base:.2f}x" for n in sizes) +
          "; direct: " + ", ".join(f"N={n} {statistics.median(results[n][1]) / statistics.median(results[sizes[0]][1]):.2f}x"
                                   for n in sizes))


def this_host(sizes, rounds, reps):
    import xmesh
    from xmesh._runtime.process import get_runtime

    t0 = time.perf_counter()
    pm = xmesh.this_host().spawn_procs({"gpus": max(sizes)})
    mesh = pm.spawn("cast_bench", bench_actors.Noop)
    mesh.initialized.get(timeout=300)
    print(f"{max(sizes)} procs ready here in {time.perf_counter() - t0:.1f} s", flush=True)
    try:
        return compare(get_runtime().node, mesh, sizes, rounds, reps, True,
                       lambda m, n: m.slice(gpus=slice(0, n)), True)
    finally:
        pm.stop()


def namespace_hosts(sizes, rounds, reps):
    import xmesh
    from netns_hosts import NetnsHosts, unavailable
    from tcp_hosts import start_agents
    from xmesh import _core
    from xmesh._runtime.process import get_runtime

    why = unavailable()
    if why:
        print(f"\n(namespace hosts skipped: {why})")
        return None
    tmp = tempfile.mkdtemp(prefix="xmesh-castbench-")
    key = os.path.join(tmp, "cluster.key")
    _core.write_new_key_file(key)
    with NetnsHosts(4) as net:
        agents = start_agents(net, tmp, key, 7000)
        try:
            t0 = time.perf_counter()
            hm = xmesh.hosts([f"{h.addr}:7000" for h in net.hosts], key_file=key)
            pm = hm.spawn_procs({"gpus": max(sizes) // 4})
            mesh = pm.spawn("cast_bench", bench_actors.Noop)
            mesh.initialized.get(timeout=300)
            print(f"{max(sizes)} procs ready on 4 namespace hosts in {time.perf_counter() - t0:.1f} s", flush=True)
            try:
                return compare(get_runtime().node, mesh, sizes, rounds, reps, False,
                               lambda m, n: m.slice(gpus=slice(0, n // 4)), False)
            finally:
                pm.stop()
        finally:
            for a in agents:
                a.terminate()
            for a in agents:
                try:
                    a.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    a.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="16,64,256")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=("here", "hosts"), help="one of the two parts")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    here = hosts = None
    if args.only != "hosts":
        here = this_host(sizes, args.rounds, args.reps)
    if args.only != "here":
        hosts = namespace_hosts(sizes, args.rounds, args.reps)
    if here:
        table("This host (trees over this host's procs, XMESH_CAST_TREE=all)", sizes, here)
    if hosts:
        table("4 namespace hosts over TCP with the cluster's key (trees by default)", sizes, hosts)


if __name__ == "__main__":
    main()
