#!/usr/bin/python3
"""Calls across hosts over TCP (issue 20) beside the raw ZeroMQ TCP floor between the same
network namespaces, in one run. Four namespace hosts (tests/python/netns_hosts.py; root needed),
each running two host agents: `xmesh-hostd --listen tcp://ADDR:7000 --key-file K` (procs reached
through the agent's one port: the default; their ZeroMQ links relayed twice, their TCP lanes
handed to them by the agent) and one on port 7001 with
`--ports 7600-7699` (procs listening on ports of their own, reached directly), and a third on
port 7002 that this controller reaches back (reach="outbound": the nodes use only connections it
opens to their agents' ports, as for a controller behind a NAT; issue 45); this process the
controller in the root namespace:

- `call_one` no-op round trip to an actor on one host, both ways, beside `zmq_pingpong` REQ/REP
  between the root namespace and that host (plaintext TCP: the floor, no encryption);
- `call()` to 4 actors (one per host) and to 16 (four per host), both ways, beside
  `zmq_pingpong fanout` to 4 and 16 REP servers placed the same way.

Rounds alternate xmesh and the floor; each figure is the median of the rounds' medians. Each
measure counts which path carried its calls (the controller node's counts of messages over TCP
lanes): the run ends by naming every measure whose calls ZeroMQ carried in part, or during which
a lane broke (issue 47: no figure may measure the slow path by accident), or saying that none did.

    sudo PYTHONPATH=build/python /usr/bin/python3 bench/tcp_hosts.py [--rounds 5] [--n 500]

Targets: call_one within 3x of the TCP floor (issue 20), within 1.5x (issue 23); reached back
within 1.2x of the same call when the nodes can connect to the controller (relayed: procs behind
the agent's port, as a controller reached back gets them; issue 45).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import xmesh  # noqa: E402
from xmesh import _core  # noqa: E402
from xmesh._runtime.agents import hostd_environment, hostd_executable  # noqa: E402
from xmesh._runtime.process import get_runtime  # noqa: E402
from netns_hosts import NetnsHosts, unavailable  # noqa: E402


def zmq_exe() -> str:
    return os.environ.get("XMESH_BENCH_ZMQ") or os.path.join(HERE, "..", "build", "bench", "xmesh_bench_zmq_pingpong")


class Noop(xmesh.Actor):
    @xmesh.endpoint
    def noop(self) -> None:
        return None


def start_agents(net: NetnsHosts, tmp: str, key: str, port: int = 7000, *extra: str) -> list:
    agents = []
    for i, h in enumerate(net.hosts):
        rd = os.path.join(tmp, f"rt{i}-{port}")
        os.makedirs(rd, mode=0o700)
        log = os.path.join(tmp, f"agent{i}-{port}.log")
        with open(log, "w") as f:
            # The agent of the xmesh this process imported (a build's, or a venv's install).
            agents.append(h.popen([hostd_executable(), "--runtime-dir", rd, "--listen", f"tcp://{h.addr}:{port}",
                                   "--key-file", key, *extra], stdout=f, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, **hostd_environment())))
        deadline = time.monotonic() + 20
        while "serving" not in open(log).read():
            if time.monotonic() > deadline or agents[-1].poll() is not None:
                raise RuntimeError(f"the agent of {h.hostname} did not start: {open(log).read()}")
            time.sleep(0.02)
    return agents


def floor_servers(net: NetnsHosts, per_host: int) -> tuple[list, list[str]]:
    """per_host REP servers on every host (ports 7500...); their addresses, host-major."""
    servers, addrs = [], []
    for h in net.hosts:
        for j in range(per_host):
            addr = f"tcp://{h.addr}:{7500 + j}"
            servers.append(h.popen([zmq_exe(), "serve", addr]))
            addrs.append(addr)
    time.sleep(0.3)
    return servers, addrs


def floor(net: NetnsHosts, per_host: int, command, requests: int) -> tuple:
    """One zmq_pingpong run (command(addrs) its arguments) against fresh servers: its median (us)
    and the servers' CPU per request (us; requests: how many they answered in all)."""
    servers, addrs = floor_servers(net, per_host)
    try:
        before = cpu_ns(s.pid for s in servers)
        out = subprocess.run([zmq_exe(), *command(addrs)], capture_output=True, text=True, timeout=300).stdout
        cpu = (cpu_ns(s.pid for s in servers) - before) / 1000 / requests
    finally:
        for s in servers:
            s.kill()
            s.wait()
    return statistics.median(float(x) for x in out.split()), cpu


def cpu_ns(pids) -> int:
    """CPU time of these processes, every thread, in ns (/proc/PID/task/*/schedstat: precise,
    where /proc/PID/stat counts clock ticks)."""
    total = 0
    for pid in pids:
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


class PathCount:
    """Which path carried one measure's calls: the controller node's counts of messages sent and
    received, and of those over TCP lanes. Each call is two messages (the call, its answer); what
    else ZeroMQ carries meanwhile is upkeep (acknowledgements, heartbeats). A call over ZeroMQ
    means the figure measures the slow path by accident."""

    def __init__(self) -> None:
        self.node = get_runtime().node
        self.before = self.node.stats()

    def done(self, calls: int) -> Optional[dict]:
        """None where this build counts no lanes (one before them: compare_builds' base)."""
        after, b = self.node.stats(), self.before
        if not hasattr(after, "lane_sent"):
            return None
        moved = (after.sent - b.sent) + (after.received - b.received)
        lanes = (after.lane_sent - b.lane_sent) + (after.lane_received - b.lane_received)
        return {"calls": calls, "off_lanes": max(0, 2 * calls - lanes), "upkeep": max(0, moved - 2 * calls),
                "breaks": after.lane_breaks - b.lane_breaks}


def xmesh_times(fn, n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=500, help="round trips per round")
    args = ap.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"tcp_hosts.py needs namespace hosts: {why}")
    tmp = tempfile.mkdtemp(prefix="xmesh-tcpbench-")
    key = os.path.join(tmp, "cluster.key")
    _core.write_new_key_file(key)
    with NetnsHosts(4) as net:
        agents = (start_agents(net, tmp, key, 7000) + start_agents(net, tmp, key, 7001, "--ports", "7600-7699")
                  + start_agents(net, tmp, key, 7002))
        try:
            meshes = {}
            for way, port, reach in (("relayed", 7000, "inbound"), ("direct", 7001, "inbound"),
                                     ("outbound", 7002, "outbound")):
                hm = xmesh.hosts([f"{h.addr}:{port}" for h in net.hosts], key_file=key, reach=reach)
                procs = hm.spawn_procs({"gpus": 4})
                a = procs.spawn("noop", Noop)
                a.initialized.get(timeout=60)
                meshes[way] = (procs, a)
            figures: dict[str, list[float]] = {}
            paths: list[str] = []

            def add(name: str, value: float) -> None:
                figures.setdefault(name, []).append(value)

            upkeep = []

            def measure(name: str, fn, n: int, targets: int, pids: list) -> None:
                xmesh_times(fn, 0, warmup=20)  # lanes up before the count starts
                count = PathCount()
                callee_cpu = cpu_ns(pids)
                add(name, statistics.median(xmesh_times(fn, n, warmup=0)))
                add(f"{name} cpu", (cpu_ns(pids) - callee_cpu) / 1000 / (n * targets))
                c = count.done(n * targets)
                upkeep.append(c["upkeep"])
                if c["off_lanes"] or c["breaks"]:
                    paths.append(f"round {len(figures[name])}, {name}: {c['off_lanes']} of {2 * c['calls']} calls' "
                                 f"messages went over ZeroMQ, {c['breaks']} lane(s) broke: this figure is "
                                 "(partly) the ZeroMQ path")

            for _ in range(args.rounds):
                for way, (procs, a) in meshes.items():
                    one, four = a.slice(hosts=1, gpus=0), a.slice(gpus=0)
                    pids = procs.pids
                    measure(f"call_one {way}", lambda: one.noop.call_one().get(), args.n, 1, pids)
                    measure(f"call_4 {way}", lambda: four.noop.call().get(), args.n // 2, 4, pids)
                    measure(f"call_16 {way}", lambda: a.noop.call().get(), args.n // 4, 16, pids)
                for name, per_host, command, requests in (
                        ("floor_1", 1, lambda addrs: ["ping", addrs[1], str(args.n)], args.n),
                        ("floor_4", 1, lambda addrs: ["fanout", ",".join(addrs), "4", str(args.n // 2)], args.n // 2 * 4),
                        ("floor_16", 4, lambda addrs: ["fanout", ",".join(addrs), "16", str(args.n // 4)],
                         args.n // 4 * 16)):
                    median, cpu = floor(net, per_host, command, requests)
                    add(name, median)
                    add(f"{name} cpu", cpu)
            for procs, _ in meshes.values():
                procs.stop()
        finally:
            for p in agents:
                p.terminate()
                p.wait(timeout=15)
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"4 namespace hosts, CURVE links; median of {args.rounds} rounds' medians (us)")
    print(f"{'':14}{'relayed':>10}{'direct':>10}{'outbound':>10}{'ZeroMQ TCP':>12}{'relayed':>9}{'direct':>8}"
          f"{'outbound / relayed':>20}")
    for name, x, f in (("call_one", "call_one", "floor_1"), ("call() to 4", "call_4", "floor_4"),
                       ("call() to 16", "call_16", "floor_16")):
        r, d, o = med[f"{x} relayed"], med[f"{x} direct"], med[f"{x} outbound"]
        print(f"{name:14}{r:>10.1f}{d:>10.1f}{o:>10.1f}{med[f]:>12.1f}{r / med[f]:>8.2f}x{d / med[f]:>7.2f}x"
              f"{o / r:>19.2f}x")
    print("callee CPU per call (us, every thread of the procs / of the floor's REP servers; all hosts share this "
          f"machine's {os.cpu_count()} cores):")
    for name, x, f in (("call_one", "call_one", "floor_1"), ("call() to 4", "call_4", "floor_4"),
                       ("call() to 16", "call_16", "floor_16")):
        r, d, o = (med[f"{x} {w} cpu"] for w in ("relayed", "direct", "outbound"))
        print(f"{name:14}{r:>10.1f}{d:>10.1f}{o:>10.1f}{med[f + ' cpu']:>12.1f}{r / med[f + ' cpu']:>8.1f}x"
              f"{d / med[f + ' cpu']:>7.1f}x")
    print("worst round, outbound / relayed call_one:",
          f"{max(o / r for o, r in zip(figures['call_one outbound'], figures['call_one relayed'])):.2f}x")
    print("\n".join(paths) if paths else
          f"every call and answer of every measure went over TCP lanes and none broke ({args.rounds} rounds; "
          f"ZeroMQ carried only upkeep, acknowledgements and heartbeats: {statistics.median(upkeep):.0f} "
          "messages per measure, median)")


if __name__ == "__main__":
    main()
