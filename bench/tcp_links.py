#!/usr/bin/python3
"""What CURVE costs on a TCP link (issue 20): the round trip of one request between two of the
runtime's nodes, answered by the receiver's I/O thread in C++ (a DumpStacks to a node without a
stack dumper: no Python, no GIL on that side), over a unix socket (PLAIN, the cookie), loopback
TCP with PLAIN, and loopback TCP with the cluster's key (CURVE: authenticated and encrypted),
for a small payload and a 64 KiB one; alternating rounds, medians, ratios to plain TCP.

    PYTHONPATH=build/python /usr/bin/python3 bench/tcp_links.py [--rounds 5] [--n 2000]

Target (issue 20): CURVE under 20% over plaintext on small messages.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

from xmesh import _core
from xmesh._runtime.process import Kind


def pair(kind: str, rundir: str, key_file: str):
    if kind == "ipc":
        addrs = [f"ipc://{rundir}/a", f"ipc://{rundir}/b"]
    else:
        addrs = ["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"]
    key = key_file if kind == "tcp+curve" else ""
    a = _core.Node("controller", addrs[0], "bench", key)
    b = _core.Node("proc", addrs[1], "bench", key)
    for n in (a, b):
        n.set_default_cookie("bench")
        n.start()
    return a, b


def round_trip_us(a, b, payload: bytes, n: int) -> float:
    frames = [payload] if payload else None
    times = []
    for i in range(n + 100):
        start = time.perf_counter()
        call = a.call([(b.addr, "")], int(Kind.DumpStacks), "", None, frames, True)
        if not call.wait(10):
            raise RuntimeError("no answer within 10 s")
        call.take()
        if i >= 100:  # the first ones set up the connection
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    rundir = tempfile.mkdtemp(prefix="xmtcp-")
    key_file = os.path.join(rundir, "cluster.key")
    _core.write_new_key_file(key_file)
    kinds = ["ipc", "tcp", "tcp+curve"]
    sizes = {"small (100 B)": b"x" * 100, "64 KiB": os.urandom(65536)}
    nodes = {k: pair(k, rundir, key_file) for k in kinds}
    results: "dict[tuple[str, str], list[float]]" = {(k, s): [] for k in kinds for s in sizes}
    for r in range(args.rounds):
        order = kinds if r % 2 == 0 else kinds[::-1]
        for size, payload in sizes.items():
            for k in order:
                results[(k, size)].append(round_trip_us(*nodes[k], payload, args.n))
    for a, b in nodes.values():
        a.stop()
        b.stop()
    print(f"node-to-node round trip, answered in C++ by the receiver's I/O thread; {os.cpu_count()} cores, "
          f"{args.rounds} rounds of {args.n} (median of the rounds' medians, us)")
    print(f"{'payload':<16}{'ipc':>10}{'tcp':>10}{'tcp+curve':>12}{'curve / tcp':>14}")
    for size in sizes:
        m = {k: statistics.median(results[(k, size)]) for k in kinds}
        print(f"{size:<16}{m['ipc']:>10.1f}{m['tcp']:>10.1f}{m['tcp+curve']:>12.1f}{m['tcp+curve'] / m['tcp']:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
