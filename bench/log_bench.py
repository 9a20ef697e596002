#!/usr/bin/python3
"""Remote output, xmesh beside its peers in one run on this machine: how many lines per second
8 procs can push into the controller with none lost, and how long a print() in an actor takes
to reach the controller's output. Prints one table and the ratios.

    /usr/bin/python3 bench/log_bench.py [--quick]

Uses the installed xmesh (or PYTHONPATH=build/python). Peers:
- plain pipes: 8 child processes writing into pipes that the benchmark reads itself, with no
  framing, attribution or forwarding (the ceiling for this machine);
- ipyparallel (python3-ipyparallel): 8 engines, their output streamed to the client as
  `%px --stream` does (iopub stream messages, one callback per message).
Every line of every run is checked afterwards: each rank's lines must arrive complete, in order,
exactly once; a run that lost or reordered a line says so in the table.
"""
import argparse
import os
import re
import selectors
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # bench_actors is importable by the procs and the engines too
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
# get() waits for the output its calls wrote; under a flood that may take longer than the
# default 5 s, and the benchmark wants to see every line rather than give up.
os.environ.setdefault("XMESH_LOG_BARRIER_S", "120")

import bench_actors  # noqa: E402
from bench_stats import samples_row  # noqa: E402

PROCS = 8
LINE = re.compile(r"step (\d+) loss ")


def check_lines(text_by_rank, n):
    """Problems with what arrived: every rank must have steps 0..n-1, in order, once each."""
    problems = []
    for rank, text in sorted(text_by_rank.items()):
        steps = [int(m.group(1)) for m in LINE.finditer(text)]
        if steps != list(range(n)):
            missing = n - len(set(steps))
            problems.append(f"rank {rank}: {len(steps)} lines, {missing} missing, "
                            f"{'in order' if steps == sorted(steps) else 'out of order'}")
    if len(text_by_rank) != PROCS:
        problems.append(f"output from {len(text_by_rank)} ranks, not {PROCS}")
    return problems


class FloodResult:
    def __init__(self, lines, seconds, writer_seconds, problems):
        self.lines, self.seconds, self.writer_seconds, self.problems = lines, seconds, writer_seconds, problems

    @property
    def rate(self):
        return self.lines / self.seconds


# ---- plain pipes (the ceiling) -------------------------------------------------------------------
def pipes_flood(n, mode):
    code = ("import sys, bench_actors; sys.stderr.write('r'); sys.stderr.flush(); sys.stdin.read(1); "
            f"t = bench_actors.flood_lines({n}, {mode!r}); sys.stderr.write(repr(t))")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env) for _ in range(PROCS)]
    for p in procs:  # the clock starts once all have imported and are told to write
        p.stderr.read(1)
    sel = selectors.DefaultSelector()
    chunks = {}
    for rank, p in enumerate(procs):
        sel.register(p.stdout, selectors.EVENT_READ, rank)
        chunks[rank] = []
    t0 = time.perf_counter()
    for p in procs:
        p.stdin.write(b"g")
        p.stdin.close()
    open_pipes = PROCS
    while open_pipes:
        for key, _ in sel.select():
            data = os.read(key.fileobj.fileno(), 1 << 16)
            if data:
                chunks[key.data].append(data)
            else:
                sel.unregister(key.fileobj)
                open_pipes -= 1
    seconds = time.perf_counter() - t0
    writer_seconds = max(float(p.stderr.read() or 0) for p in procs)
    for p in procs:
        p.wait()
    text = {r: b"".join(c).decode() for r, c in chunks.items()}
    return FloodResult(sum(t.count("\n") for t in text.values()), seconds, writer_seconds, check_lines(text, n))


# ---- xmesh -----------------------------------------------------------------------------------------
class CapturedDisplay:
    """Replaces the controller's display sink (its stdout in a script) for one measurement:
    keeps every chunk, and the arrival time of each stamped line."""

    def __init__(self, logs):
        self.logs = logs
        self.texts = []
        self.delays = []

    def __enter__(self):
        self.saved = self.logs.sink
        self.logs.sink = self.sink
        return self

    def __exit__(self, *exc):
        self.logs.sink = self.saved

    def sink(self, chunks):
        now = time.time()
        for _cell, _stream, text in chunks:
            self.texts.append(text)
            if "@" in text:
                self.delays += stamp_delays(text, now)

    def text_by_rank(self):
        out = {}
        for line in "".join(self.texts).splitlines():
            prefix, _, rest = line.partition("] ")
            out.setdefault(prefix.lstrip("["), []).append(rest)
        return {r: "\n".join(lines) + "\n" for r, lines in out.items()}


def stamp_delays(text, now):
    """Milliseconds from each `@<time>` stamp in text to now."""
    return [(now - float(m.group(1))) * 1000 for m in re.finditer(r"@(\d+\.\d+) ", text)]


def xmesh_mesh():
    from xmesh import this_host

    pm = this_host().spawn_procs({"gpus": PROCS})
    mesh = pm.spawn("logbench", bench_actors.LogFlood)
    mesh.initialized.get()
    return pm, mesh


def xmesh_flood(mesh, n, mode):
    from xmesh._runtime.process import get_runtime

    logs = get_runtime().logs
    before = logs.router.stats()["lines"]
    with CapturedDisplay(logs) as shown:
        t0 = time.perf_counter()
        writer = mesh.flood.call(n, mode).get()  # get() returns once every line it wrote is shown
        seconds = time.perf_counter() - t0
    received = logs.router.stats()["lines"] - before
    problems = check_lines(shown.text_by_rank(), n)
    if received != PROCS * n:
        problems.append(f"the controller received {received} lines, not {PROCS * n}")
    return FloodResult(received, seconds, max(writer.values()), problems)


def xmesh_latency(mesh, k, gap):
    from xmesh._runtime.process import get_runtime

    with CapturedDisplay(get_runtime().logs) as shown:
        mesh.stamped.call(k, gap).get()
    return shown.delays


# ---- ipyparallel (%px --stream) --------------------------------------------------------------------
def ipp_cluster():
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=PROCS, log_level=40)
    rc = cluster.start_and_connect_sync()
    rc.wait_for_engines(PROCS, timeout=120)
    return cluster, rc


def ipp_streamed(rc, fn, *args):
    """Runs fn(*args) on every engine with its output streamed to the client as `%px --stream`
    does (a callback per iopub stream message); returns (text by engine, arrival delays of
    stamped lines in ms, the results, seconds until every output message arrived)."""
    view = rc[list(range(PROCS))]
    texts, delays, lock = {}, [], threading.Lock()
    t0 = time.perf_counter()
    ar = view.apply_async(fn, *args)

    def on_message(eid, msg):
        if msg["header"]["msg_type"] == "stream":
            now, text = time.time(), msg["content"]["text"]
            with lock:
                texts.setdefault(eid, []).append(text)
                if "@" in text:
                    delays.extend(stamp_delays(text, now))

    for eid, child in zip(ar._targets, ar._children):
        child.iopub_callbacks.append(lambda msg, eid=eid: on_message(eid, msg))
    results = ar.get(timeout=300)
    ar.wait_for_output(timeout=300)
    seconds = time.perf_counter() - t0
    return {e: "".join(t) for e, t in texts.items()}, delays, results, seconds


def ipp_flood(rc, n, mode):
    text, _, writer, seconds = ipp_streamed(rc, bench_actors.flood_lines, n, mode)
    return FloodResult(sum(t.count("\n") for t in text.values()), seconds, max(writer), check_lines(text, n))


def ipp_latency(rc, k, gap):
    return ipp_streamed(rc, bench_actors.stamped_lines, k, gap)[1]


# ---- main -------------------------------------------------------------------------------------------
def flood_row(name, r):
    status = "complete" if not r.problems else "LOST: " + "; ".join(r.problems)
    return f"  {name:<14}{r.lines:>10,}{r.seconds:>9.2f}{r.rate:>12,.0f}{r.writer_seconds:>10.2f}   {status}"


def latency_row(name, delays):
    return samples_row(name, delays, 99)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer lines and samples")
    args = ap.parse_args()
    sizes = {"print": 20_000, "block": 50_000} if args.quick else {"print": 100_000, "block": 250_000}
    stamps, gap = (50, 0.01) if args.quick else (200, 0.005)

    pm, mesh = xmesh_mesh()
    cluster, rc = ipp_cluster()
    out, ratios = [], []
    try:
        for mode, n in sizes.items():
            out.append(f"{PROCS} procs x {n:,} lines, written with {'print() per line' if mode == 'print' else 'a write per 1000 lines'}")
            out.append(f"  {'':<14}{'lines':>10}{'seconds':>9}{'lines/s':>12}{'writing':>10}   check")
            pipes = pipes_flood(n, mode)
            xm = xmesh_flood(mesh, n, mode)
            ipp = ipp_flood(rc, n, mode)
            out += [flood_row("plain pipes", pipes), flood_row("xmesh", xm), flood_row("ipyparallel", ipp)]
            ratios.append(f"{mode}: xmesh {xm.rate:,.0f} lines/s (target >= 200,000 without loss), "
                          f"{xm.rate / ipp.rate:.1f}x ipyparallel, {xm.rate / pipes.rate:.2f} of plain pipes")
        out.append("")
        out.append(f"print() in an actor to the controller's output, {stamps} lines {gap * 1000:.0f} ms apart per proc (ms)")
        out.append(f"  {'':<14}{'lines':>8}{'median':>10}{'p99':>10}{'max':>10}")
        xm1 = xmesh_latency(mesh.slice(gpus=0), stamps, gap)
        xm8 = xmesh_latency(mesh, stamps, gap)
        ip8 = ipp_latency(rc, stamps, gap)
        out += [latency_row("xmesh, 1 proc", xm1), latency_row("xmesh, 8 procs", xm8),
                latency_row("ipyparallel, 8", ip8)]
        ratios.append(f"latency: xmesh median {statistics.median(xm1):.2f} ms (1 proc), "
                      f"{statistics.median(xm8):.2f} ms (8 procs) (target < 5 ms); "
                      f"ipyparallel / xmesh = {statistics.median(ip8) / statistics.median(xm8):.0f}x")
    finally:
        pm.stop()
        cluster.stop_cluster_sync()
    print(f"xmesh log benchmark on {os.uname().nodename}, {os.cpu_count()} cores, "
          f"{'quick' if args.quick else 'full'} run")
    print("\n".join(out))
    print()
    print("\n".join(ratios))


if __name__ == "__main__":
    main()
