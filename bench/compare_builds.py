#!/usr/bin/python3
"""Two builds of xmesh side by side in one run: the call path of each (call_one round trip,
call() to 16 actors, a stream over 16, `await` of call_one, spawn of 8 ready procs), measured
in alternating rounds so that both see the same machine, and the ratios new / base.

    /usr/bin/python3 bench/compare_builds.py --base /tmp/xmesh-base/build --new build [--rounds 4]
    /usr/bin/python3 bench/compare_builds.py --base build --new ENV/bin/python   # a venv's install
    sudo /usr/bin/python3 bench/compare_builds.py --base B --new build --hosts 4   # and across hosts

With --hosts N (root: network namespaces, tests/python/netns_hosts.py) each side also measures
the cross-host call path (issue 47, goal 6): N namespace hosts, each side's own host agents there
listening on TCP with a cluster key (procs behind the agent's port, CURVE links, TCP lanes), four
procs per host; `call_one` to one host, `call()` to N actors (one per host) and to 4N. Each such
measure counts which path carried its calls (tcp_hosts.PathCount): a figure that ZeroMQ carried
in part is named at the end, since it measures the slow path by accident.

A side is a build directory (run by Debian's Python with PYTHONPATH=<build>/python and that
build's xmesh-hostd) or an interpreter whose environment has xmesh installed (a venv holding the
wheel: run as it is, nothing of a build tree in its environment). Each side runs in a process
of its own with a runtime directory of its own. A ratio above 1 means the new side is slower.
Build a base with `git worktree add /tmp/xmesh-base <commit>` and `cmake --build` of `_core
xmesh-hostd xmesh_python` there.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# What one side measures; prints one JSON object of medians (microseconds, spawn in seconds).
PROBE = r"""
import asyncio, json, statistics, sys, time
sys.path.insert(0, {here!r})
import bench_actors
from actor_rtt import timed_us
from xmesh import this_host

def timed(fn, n, warmup):
    return statistics.median(timed_us(fn, n, warmup))

pm = this_host().spawn_procs({{"gpus": 16}})
mesh = pm.spawn("noop16", bench_actors.Noop)
mesh.initialized.get()
one = mesh.slice(gpus=0)
result = {{}}
result["call_one_us"] = timed(lambda: one.noop.call_one().get(), {n}, 200)
result["call16_us"] = timed(lambda: mesh.noop.call().get(), {reps}, 20)
# A stream yields a Future per reply since issue 19 (values before): read either.
result["stream16_us"] = timed(lambda: [getattr(r, "get", lambda: r)() for r in mesh.noop.stream()], {reps}, 20)

async def awaited():
    return await one.noop.call_one()

loop = asyncio.new_event_loop()
result["await_call_one_us"] = timed(lambda: loop.run_until_complete(awaited()), {n}, 100)
pm.stop()
spawns = []
for _ in range(3):
    t0 = time.perf_counter()
    p8 = this_host().spawn_procs({{"gpus": 8}})
    p8.initialized.get()
    spawns.append(time.perf_counter() - t0)
    p8.stop()
result["spawn8_s"] = statistics.median(spawns)
print(json.dumps(result))
"""


# The cross-host measures of one side (--hosts): prints one JSON object of medians (us) and, under
# "paths", the measures ZeroMQ carried in part. The actor is defined here, in __main__, so that
# procs on other hosts get it by value.
HOSTS_PROBE = r"""
import json, os, statistics, sys, tempfile
sys.path.insert(0, {here!r})
import tcp_hosts
import xmesh
from xmesh import _core

class Noop(xmesh.Actor):
    @xmesh.endpoint
    def noop(self) -> None:
        return None

hosts = {hosts}
tmp = tempfile.mkdtemp(prefix="xcmp-hosts-", dir="/tmp")
key = os.path.join(tmp, "cluster.key")
_core.write_new_key_file(key)
result, paths = {{}}, []
with tcp_hosts.NetnsHosts(hosts) as net:
    agents = tcp_hosts.start_agents(net, tmp, key, 7000)
    try:
        procs = xmesh.hosts([f"{{h.addr}}:7000" for h in net.hosts], key_file=key).spawn_procs({{"gpus": 4}})
        mesh = procs.spawn("noop", Noop)
        mesh.initialized.get(timeout=60)
        one, per_host = mesh.slice(hosts=hosts - 1, gpus=0), mesh.slice(gpus=0)
        for name, fn, n, targets in (("hosts call_one_us", lambda: one.noop.call_one().get(), {n}, 1),
                                     (f"hosts call{{hosts}}_us", lambda: per_host.noop.call().get(), {reps}, hosts),
                                     (f"hosts call{{4 * hosts}}_us", lambda: mesh.noop.call().get(), {reps}, 4 * hosts)):
            tcp_hosts.xmesh_times(fn, 0, warmup=50)  # lanes up before the count starts
            count = tcp_hosts.PathCount()
            result[name] = statistics.median(tcp_hosts.xmesh_times(fn, n, warmup=0))
            c = count.done(n * targets)
            if c is not None and (c["off_lanes"] or c["breaks"]):
                paths.append(f"{{name[6:-3]}}: {{c['off_lanes']}} of {{2 * c['calls']}} messages over ZeroMQ, "
                             f"{{c['breaks']}} lane break(s)")
        procs.stop()
    finally:
        for p in agents:
            p.terminate()
            p.wait(timeout=15)
result["paths"] = paths
print(json.dumps(result))
"""


def side_of(path: str) -> tuple:
    """(interpreter, environment) of a side: a build directory or an installed interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XMESH_HOSTD")}
    if os.path.isdir(path):
        return sys.executable, dict(env, PYTHONPATH=os.path.join(path, "python"),
                                    XMESH_HOSTD=os.path.join(path, "runtime", "xmesh-hostd"))
    return path, env


def run_side(path: str, n: int, reps: int, hosts: int) -> dict:
    python, env = side_of(path)
    rundir = tempfile.mkdtemp(prefix="xcmp-", dir="/tmp")
    os.chmod(rundir, 0o700)
    env["XMESH_RUNTIME_DIR"] = rundir
    try:
        result = probe(path, python, env, PROBE.format(here=HERE, n=n, reps=reps))
        if hosts:
            result.update(probe(path, python, env, HOSTS_PROBE.format(here=HERE, n=n // 4, reps=reps // 2, hosts=hosts)))
        return result
    finally:
        subprocess.run([python, "-m", "xmesh.cli", "shutdown"], env=env, capture_output=True, timeout=60)
        shutil.rmtree(rundir, ignore_errors=True)


def probe(path: str, python: str, env: dict, script: str) -> dict:
    out = subprocess.run([python, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"the probe failed for {path}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="build directory (or installed interpreter) of the base")
    ap.add_argument("--new", required=True, help="build directory (or installed interpreter) to compare")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds (each side once per round)")
    ap.add_argument("--n", type=int, default=2000, help="samples of each round trip per round")
    ap.add_argument("--reps", type=int, default=300, help="samples of each fan-out per round")
    ap.add_argument("--hosts", type=int, default=0,
                    help="also measure calls across this many network-namespace hosts (root; 0: not)")
    args = ap.parse_args()
    if args.hosts and (os.geteuid() != 0 or args.hosts < 2):
        ap.error("--hosts needs root (network namespaces) and at least 2 hosts")
    for b in (args.base, args.new):
        if os.path.isdir(b) and not os.path.exists(os.path.join(b, "runtime", "xmesh-hostd")):
            ap.error(f"{b} is not an xmesh build directory (no runtime/xmesh-hostd)")
        if not os.path.isdir(b) and not os.access(b, os.X_OK):
            ap.error(f"{b} is neither a build directory nor an interpreter")
    runs = {"base": [], "new": []}
    for r in range(args.rounds):
        order = ("base", "new") if r % 2 == 0 else ("new", "base")  # neither side always goes first
        for side in order:
            runs[side].append(run_side(getattr(args, side), args.n, args.reps, args.hosts))
            print(f"round {r + 1} {side}: {runs[side][-1]}", file=sys.stderr, flush=True)
    report(runs, args.rounds)


def report(runs: dict, rounds: int) -> None:
    """The medians of each side's round medians and their ratio, and the median of the rounds'
    own ratios (each round's two sides ran back to back, so a machine that drifts slower or
    faster over the run moves both), with the spread of those ratios (quartiles): a ratio whose
    quartiles straddle 1.00 is within this machine's noise."""
    for side in ("base", "new"):
        for r, run in enumerate(runs[side]):
            for path in run.pop("paths", []):
                print(f"round {r + 1} {side}, {path}: that figure is (partly) the ZeroMQ path")
    keys = list(runs["base"][0])
    print(f"xmesh builds side by side on {os.uname().nodename}, {os.cpu_count()} cores, {rounds} rounds "
          "(medians of the rounds' medians; per-round ratios: median [quartiles])")
    print(f"{'':<22}{'base':>12}{'new':>12}{'new / base':>12}   per-round new / base")
    for k in keys:
        base = statistics.median(x[k] for x in runs["base"])
        new = statistics.median(x[k] for x in runs["new"])
        paired = [n[k] / b[k] for b, n in zip(runs["base"], runs["new"])]
        q = statistics.quantiles(paired, n=4) if len(paired) >= 2 else [paired[0]] * 3
        unit = "s" if k.endswith("_s") else "us"
        print(f"{k[:-3] if unit == 'us' else k[:-2]:<16}({unit:>2}) {base:>12.3f}{new:>12.3f}{new / base:>11.2f}x"
              f"   {statistics.median(paired):.2f}x [{q[0]:.2f}-{q[2]:.2f}]")


if __name__ == "__main__":
    main()
