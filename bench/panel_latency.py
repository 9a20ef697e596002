"""The xmesh panel's latency and idle cost (issue 22), in one run, with a real Jupyter server of
build/frontend (the panel's server extension and its sidecar) and a controller program:

- death latency: a controller owns a 64-rank mesh; each round kills one proc (SIGKILL) and times
  (a) the panel's API (`GET /xmesh/api/meshes`, read back to back: the server, the sidecar and the
  controller's snapshot) until it shows the rank dead, and (b) the panel in Chromium until it
  draws that rank's cell dead; median and p99 of each;
- stop latency: the same with a rank stopping in pdb (a call to one rank runs breakpoint());
- idle cost: the server part's CPU (the Jupyter server and its sidecar, user + system time from
  /proc) while a shown panel polls it with a mesh of `--idle-ranks` ranks listed, as a share of
  one core.

Targets: the panel shows a change within a second; the server part under 1% of a core idle.

    build/frontend/bin/python bench/panel_latency.py [--rounds 20] [--ranks 64] [--idle-ranks 512]
"""
import argparse
import json
import os
import pty
import random
import signal
import subprocess
import sys
import tempfile
import termios
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "browser"))
sys.path.insert(0, HERE)

from bench_stats import pct  # noqa: E402
from jupyter_ui import BUILD, CHROMIUM, CHROMIUM_ARGS, JupyterServer  # noqa: E402

MESH = "bench-mesh"
POLL_S = 0.8  # the shown panel's poll period (jupyter_ext/src/index.ts)
# The controller: spawns the mesh, prints its pids, then runs what its terminal asks ("halt R":
# a call to rank R that stops in breakpoint(), whose xmesh_dbg> prompt then reads "c" from the
# same terminal) until the end of its input.
CONTROLLER = """
import json, sys, xmesh

class Halter(xmesh.Actor):
    @xmesh.endpoint
    def halt(self) -> int:
        breakpoint()
        return 0

procs = xmesh.this_host().spawn_procs({"gpus": %d}, name=%r)
procs.initialized.get(timeout=600)
actors = procs.spawn("halter", Halter)
print(json.dumps({"pids": procs.pids}), flush=True)
for line in sys.stdin:
    word, _, arg = line.strip().partition(" ")
    if word == "halt":
        actors.slice(gpus=int(arg)).halt.call_one().get()
procs.stop()  # a named allocation outlives its controller otherwise
"""


class Controller:
    """A controller program owning a mesh of `ranks` procs. Its stdin is a terminal (its
    debugger prompt opens there, as for a user; a pipe would make it continue stopped ranks at
    once); its stdout a pipe read for the pids; its stderr a file."""

    def __init__(self, rundir: str, ranks: int, work: str) -> None:
        self.terminal, slave = pty.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[3] &= ~termios.ECHO
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        self.err_path = os.path.join(work, f"controller-{ranks}.err")
        self.proc = subprocess.Popen(["/usr/bin/python3", "-c", CONTROLLER % (ranks, MESH)],
                                     env=dict(os.environ, XMESH_RUNTIME_DIR=rundir), stdin=slave,
                                     stdout=subprocess.PIPE, stderr=open(self.err_path, "w"), text=True, cwd=work)
        os.close(slave)
        line = self.proc.stdout.readline()
        if not line:
            with open(self.err_path) as f:
                raise RuntimeError(f"the controller exited at start:\n{f.read()[-3000:]}")
        self.pids = json.loads(line)["pids"]

    def type(self, line: str) -> None:
        os.write(self.terminal, (line + "\n").encode())

    def close(self) -> None:
        self.type("\x04")  # end of input: the controller leaves its loop
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.terminal)


def mesh_ranks(server: JupyterServer) -> list:
    with urllib.request.urlopen(server.url("xmesh/api/meshes"), timeout=30) as r:
        reply = json.loads(r.read())
    return next((m["ranks"] for m in reply.get("meshes", []) if m["name"] == MESH), [])


def api_state(server: JupyterServer, rank: int) -> str:
    ranks = mesh_ranks(server)
    return ranks[rank]["state"] if rank < len(ranks) else "?"


def timed(act, seen, timeout: float = 30.0) -> float:
    """Seconds from act() until seen() is true. act() comes at a random moment of the panel's
    poll period: right after the panel's last read, rounds would all wait a whole period."""
    time.sleep(random.uniform(0, POLL_S))
    t0 = time.monotonic()
    act()
    while not seen():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("the panel did not show the change in time")
    return time.monotonic() - t0


def halt_continue(ctl: Controller):
    return lambda: ctl.type("c")


def latencies(server: JupyterServer, page, ctl: Controller, rounds: int) -> dict:
    cell = '#xmesh-panel .xmesh-mesh[data-mesh="%s"] .xmesh-rank[data-rank="%%d"][data-state="%%s"]' % MESH

    def drawn(rank: int, state: str):
        return lambda: page.query_selector(cell % (rank, state)) is not None

    def kill(rank: int):
        return lambda: os.kill(ctl.pids[rank], signal.SIGKILL)

    def halt(rank: int):
        return lambda: ctl.type(f"halt {rank}")

    out = {}
    ranks = iter(range(len(ctl.pids)))
    out["death, API"] = [timed(kill(r), lambda r=r: api_state(server, r) == "dead") for r in
                         [next(ranks) for _ in range(rounds)]]
    out["death, Chromium"] = [timed(kill(r), drawn(r, "dead")) for r in [next(ranks) for _ in range(rounds)]]
    # Stops: the halted rank's call waits in the controller's xmesh_dbg> prompt, which reads
    # the controller's stdin: "c" there continues it, and the next round starts once it is idle.
    out["pdb stop, Chromium"] = []
    for r in [next(ranks) for _ in range(rounds)]:
        out["pdb stop, Chromium"].append(timed(halt(r), drawn(r, "stopped")))
        timed(halt_continue(ctl), drawn(r, "idle"))
    return {k: [v * 1000 for v in vs] for k, vs in out.items()}


def cpu_seconds(pid: int) -> float:
    """User + system time of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def sidecar_pids(server: JupyterServer) -> list:
    """The Jupyter server's children: the panel's sidecar (no kernel runs in this benchmark)."""
    pids = []
    for task in os.listdir(f"/proc/{server.proc.pid}/task"):
        with open(f"/proc/{server.proc.pid}/task/{task}/children") as f:
            pids += [int(p) for p in f.read().split()]
    return pids


def machine_busy() -> tuple:
    """/proc/stat's (busy, total) jiffies of all CPUs."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple, after: tuple) -> float:
    """The machine's busy share (% of all its cores) between two machine_busy() readings."""
    return 100.0 * (after[0] - before[0]) / max(1, after[1] - before[1])


def settle(page, limit_s: float = 90.0, below: float = 15.0) -> float:
    """Waits (up to limit_s) until the machine is quiet over a second (busy < below % of its
    cores): 512 procs just spawned still import for a while, and a server measured meanwhile
    pays for the contention. Returns the last second's busy share."""
    deadline = time.monotonic() + limit_s
    while True:
        before = machine_busy()
        page.wait_for_timeout(1000)
        share = busy_share(before, machine_busy())
        if share < below or time.monotonic() > deadline:
            return share


def idle_cost(server: JupyterServer, page, seconds: float) -> tuple:
    """The server part's CPU while the shown panel polls (its own pace), as % of one core:
    (the Jupyter server, its sidecar, the machine's busy share meanwhile)."""
    settle(page)
    parts = ([server.proc.pid], sidecar_pids(server))
    machine = machine_busy()
    before, t0 = [sum(cpu_seconds(p) for p in part) for part in parts], time.monotonic()
    page.wait_for_timeout(seconds * 1000)
    elapsed = time.monotonic() - t0
    cost = [(sum(cpu_seconds(p) for p in part) - b) / elapsed * 100 for part, b in zip(parts, before)]
    return cost[0], cost[1], busy_share(machine, machine_busy())


def open_panel(server: JupyterServer, page, ranks: int) -> None:
    page.goto(server.url("lab"))
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="xmesh-panel"]', timeout=60000)
    page.wait_for_selector(f'#xmesh-panel .xmesh-mesh[data-mesh="{MESH}"] .xmesh-rank[data-rank="{ranks - 1}"]',
                           timeout=120000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--idle-ranks", type=int, default=512)
    ap.add_argument("--idle-seconds", type=float, default=30)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    work = tempfile.mkdtemp(prefix="xmesh-panelbench-")
    rundir = os.path.join(work, "run")
    os.makedirs(os.path.join(work, "nb"))
    os.makedirs(rundir, mode=0o700)
    server = JupyterServer(os.path.join(work, "nb"), rundir, os.path.join(work, "server.log"))
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            ctl = Controller(rundir, args.ranks, work)
            try:
                open_panel(server, page, args.ranks)
                lat = latencies(server, page, ctl, args.rounds)
            finally:
                ctl.close()
            ctl = Controller(rundir, args.idle_ranks, work)
            try:
                open_panel(server, page, args.idle_ranks)
                idle = idle_cost(server, page, args.idle_seconds)
                shot = os.path.join(work, f"panel-{args.idle_ranks}-ranks.png")
                page.screenshot(path=shot)  # is the grid readable at this size?
            finally:
                ctl.close()
            browser.close()
    finally:
        server.stop()
    print(f"panel latency, {args.ranks}-rank mesh (ms): {'count':>8}{'median':>10}{'p99':>10}{'max':>10}")
    for name, xs in lat.items():
        print(f"  {name:<22}{len(xs):>8}{sorted(xs)[len(xs) // 2]:>10.1f}{pct(xs, 99):>10.1f}{max(xs):>10.1f}")
    print(f"server part while a shown panel polls, {args.idle_ranks} ranks listed: {idle[0] + idle[1]:.2f}% of a "
          f"core (target < 1%): Jupyter server {idle[0]:.2f}%, sidecar {idle[1]:.2f}% (the machine meanwhile: "
          f"{idle[2]:.1f}% of its {os.cpu_count()} cores busy, the browser included)")
    print(f"(build {BUILD}; the panel with {args.idle_ranks} ranks: {shot})")


if __name__ == "__main__":
    main()
