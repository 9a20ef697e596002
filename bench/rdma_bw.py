#!/usr/bin/python3
"""RDMA buffers' read_into (issue 24), 4 KiB to 1 GiB, beside its peers in the same run:

- same host: a controller reads a proc's buffer (cross-memory attach), beside `memcpy` of the
  same bytes in one process (numpy.copyto: the one-copy ceiling), beside the stream path forced
  on this host (XMESH_DATA_TRANSPORT=stream: what hosts use between them, over loopback), and
  beside Monarch 0.7's RDMABuffer on this machine (its TCP fallback: no ibverbs device here),
  run in a torchmonarch venv (--monarch-python; bench/monarch_compat.py --make-venv makes one);
- across hosts (--hosts, root: two network namespace hosts, tests/python/netns_hosts.py): a
  proc on one host reads a buffer of a proc on the other, beside a raw TCP stream between the
  same two namespaces (one connection, sendall / recv_into of the same sizes: iperf-style, no
  encryption).

Every figure is the median of its repetitions, timed in the reading process (the Future's
get() included); destinations are touched first (no page faults in the timing).

    PYTHONPATH=build/python /usr/bin/python3 bench/rdma_bw.py [--monarch-python /tmp/monvenv/bin/python] [--hosts]

Targets: same-host large transfers >= 50% of memcpy; across hosts >= 70% of the raw TCP stream;
both >= 5x Monarch's fallback.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]


def reps_for(n: int) -> int:
    return 3 if n >= 1 << 30 else 5 if n >= 256 << 20 else 20 if n >= 16 << 20 else 100


def fmt(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


# -- the reading side, run in whichever process reads --------------------------------------------
READER = textwrap.dedent("""
    def time_reads(buf, n, reps):
        import time
        import numpy as np
        dst = np.ones(n, dtype=np.uint8)  # touched: no page faults in the timing
        buf.read_into(dst).get()
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            buf.read_into(dst).get()
            out.append(time.perf_counter() - t)
        return out
""")
exec(READER)


def memcpy_times(n: int, reps: int) -> list:
    import numpy as np

    src, dst = np.ones(n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        out.append(time.perf_counter() - t)
    return out


def xmesh_same_host() -> dict:
    """{size: [seconds]} of a controller reading a proc's buffer (this process's transport)."""
    import xmesh

    class Owner(xmesh.Actor):
        @xmesh.endpoint
        def lend(self, n: int):
            import numpy as np
            from xmesh.rdma import RDMABuffer

            self.mem = np.ones(n, dtype=np.uint8)
            self.buf = RDMABuffer(self.mem)
            return self.buf

    procs = xmesh.this_host().spawn_procs({"gpus": 1})
    owner = procs.spawn("owner", Owner)
    out = {}
    for n in SIZES:
        buf = owner.lend.call_one(n).get()
        out[n] = time_reads(buf, n, reps_for(n))  # noqa: F821 (exec'd above)
        buf.drop().get()
    procs.stop()
    return out


MONARCH = textwrap.dedent("""
    import json, sys, time
    from monarch.config import configure
    configure(rdma_allow_tcp_fallback=True)
    from monarch.actor import Actor, endpoint, this_host
    from monarch.rdma import RDMABuffer
    SIZES = json.loads(sys.argv[1])

    class Owner(Actor):
        @endpoint
        def lend(self, n):
            self.mem = bytearray(b"\\x01") * n
            self.buf = RDMABuffer(memoryview(self.mem))
            return self.buf

    def reps_for(n):
        return 3 if n >= 1 << 30 else 5 if n >= 256 << 20 else 20 if n >= 16 << 20 else 100

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    owner = procs.spawn("owner", Owner)
    out = {}
    for n in SIZES:
        buf = owner.lend.call_one(n).get()
        dst = memoryview(bytearray(n))
        buf.read_into(dst).get()
        times = []
        for _ in range(reps_for(n)):
            t = time.perf_counter()
            buf.read_into(dst).get()
            times.append(time.perf_counter() - t)
        out[n] = times
    print("RESULT " + json.dumps(out), flush=True)
""")


def monarch_same_host(python: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(MONARCH)
    try:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not xmesh's monarch shim
        r = subprocess.run([python, f.name, json.dumps(SIZES)], capture_output=True, text=True, timeout=900, env=env)
    finally:
        os.unlink(f.name)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return {int(k): v for k, v in json.loads(line[7:]).items()}
    raise RuntimeError(f"Monarch's run gave no result (exit {r.returncode}): {r.stderr[-3000:]}")


def in_subprocess(part: str, env: dict) -> dict:
    r = subprocess.run([sys.executable, __file__, "--part", part], capture_output=True, text=True, timeout=900,
                       env={**os.environ, **env})
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return {int(k): v for k, v in json.loads(line[7:]).items()}
    raise RuntimeError(f"{part} gave no result (exit {r.returncode}): {r.stderr[-3000:]}")


# -- across hosts -----------------------------------------------------------------------------------
TCP_RECEIVER = textwrap.dedent("""
    import json, socket, sys, time
    sizes = json.loads(sys.argv[2]); reps = json.loads(sys.argv[3])
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 7400)); s.listen(1); print("listening", flush=True)
    c, _ = s.accept()
    out = {}
    for n in sizes:
        buf = bytearray(b"\\x01") * n
        mv = memoryview(buf)
        times = []
        for _ in range(reps[str(n)] + 1):
            c.sendall(b"g")  # ask for the next n bytes: each timed from its request
            t = time.perf_counter()
            got = 0
            while got < n:
                k = c.recv_into(mv[got:], n - got)
                if not k:
                    raise SystemExit("the sender closed")
                got += k
            times.append(time.perf_counter() - t)
        out[n] = times[1:]
    print("RESULT " + json.dumps(out), flush=True)
""")
TCP_SENDER = textwrap.dedent("""
    import json, socket, sys
    sizes = json.loads(sys.argv[2]); reps = json.loads(sys.argv[3])
    c = socket.create_connection((sys.argv[1], 7400))
    for n in sizes:
        data = bytes(n)
        for _ in range(reps[str(n)] + 1):
            c.recv(1)
            c.sendall(data)
""")


def raw_tcp(net) -> dict:
    a, b = net.hosts
    reps = json.dumps({str(n): reps_for(n) for n in SIZES})
    recv = b.popen([sys.executable, "-c", TCP_RECEIVER, b.addr, json.dumps(SIZES), reps], stdout=subprocess.PIPE, text=True)
    assert recv.stdout.readline().strip() == "listening"
    send = a.popen([sys.executable, "-c", TCP_SENDER, b.addr, json.dumps(SIZES), reps])
    for line in recv.stdout:
        if line.startswith("RESULT "):
            send.wait(timeout=60)
            recv.wait(timeout=60)
            return {int(k): v for k, v in json.loads(line[7:]).items()}
    raise RuntimeError("the raw TCP receiver gave no result")


def xmesh_across_hosts(net, tmp: str) -> dict:
    import xmesh
    from xmesh import _core
    from tcp_hosts import start_agents  # bench/tcp_hosts.py

    key = os.path.join(tmp, "cluster.key")
    _core.write_new_key_file(key)
    agents = start_agents(net, tmp, key)
    try:
        hm = xmesh.hosts([f"{h.addr}:7000" for h in net.hosts], key_file=key)
        procs = hm.spawn_procs({"gpus": 1})

        class Peer(xmesh.Actor):
            @xmesh.endpoint
            def lend(self, n: int):
                import numpy as np
                from xmesh.rdma import RDMABuffer

                self.mem = np.ones(n, dtype=np.uint8)
                self.buf = RDMABuffer(self.mem)
                return self.buf

            @xmesh.endpoint
            def time_reads(self, buf, n: int, reps: int) -> list:
                scope: dict = {}
                exec(READER, scope)
                return scope["time_reads"](buf, n, reps)

        peers = procs.spawn("peers", Peer)
        out = {}
        for n in SIZES:
            buf = peers.slice(hosts=0).lend.call_one(n).get()
            out[n] = peers.slice(hosts=1).time_reads.call_one(buf, n, reps_for(n)).get(timeout=600)
            buf.drop().get()
        procs.stop()
        return out
    finally:
        for p in agents:
            p.terminate()
            p.wait(timeout=10)


# -- report ---------------------------------------------------------------------------------------
def table(title: str, columns: "dict[str, dict]", base: str, others: "list[tuple[str, str]]") -> None:
    print(f"\n{title}")
    names = list(columns)
    print("| size | " + " | ".join(f"{c} GB/s" for c in names) + " | " + " | ".join(f"{a} / {b}" for a, b in others) + " |")
    print("|" + " --- |" * (1 + len(names) + len(others)))
    for n in SIZES:
        med = {c: statistics.median(columns[c][n]) for c in names if n in columns[c]}
        bw = [f"{n / med[c] / 1e9:.2f} ({med[c] * 1e6:.0f} us)" if c in med else "-" for c in names]
        ratios = [f"{med[b] / med[a]:.2f}" if a in med and b in med else "-" for a, b in others]
        print(f"| {fmt(n)} | " + " | ".join(bw) + " | " + " | ".join(ratios) + " |")
    print(f"(ratios: bandwidth of the first over the second; {base} is the reference)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--monarch-python", help="a python with torchmonarch 0.7 (Monarch's side)")
    ap.add_argument("--hosts", action="store_true", help="also across two namespace hosts (root)")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part == "xmesh":
        print("RESULT " + json.dumps(xmesh_same_host()), flush=True)
        return
    cols = {"memcpy": {n: memcpy_times(n, reps_for(n)) for n in SIZES},
            "xmesh": in_subprocess("xmesh", {}),
            "xmesh stream": in_subprocess("xmesh", {"XMESH_DATA_TRANSPORT": "stream"})}
    others = [("xmesh", "memcpy"), ("xmesh stream", "memcpy")]
    if args.monarch_python:
        cols["monarch"] = monarch_same_host(args.monarch_python)
        others += [("xmesh", "monarch"), ("xmesh stream", "monarch")]
    table("Same host: read_into of a proc's buffer by the controller", cols, "memcpy", others)
    if args.hosts:
        from netns_hosts import NetnsHosts, unavailable

        why = unavailable()
        if why:
            print(f"\nacross hosts: skipped ({why})")
            return
        tmp = tempfile.mkdtemp(prefix="xmesh-rdma-bench-")
        with NetnsHosts(2) as net:
            cross = {"raw TCP": raw_tcp(net), "xmesh": xmesh_across_hosts(net, tmp)}
        table("Across namespace hosts: a proc reads a buffer of a proc on the other host", cross, "raw TCP",
              [("xmesh", "raw TCP")])


if __name__ == "__main__":
    main()
