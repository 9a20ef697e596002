"""The xmesh panel's latency and idle cost (issue 22), in one run, with a real Jupyter server of
build/frontend (the panel's server extension and its sidecar) and a controller program:

- death latency: a controller owns a 64-rank mesh; each round kills one proc (SIGKILL) and times
  (a) the panel's API (`GET /xmesh/api/meshes`, read back to back: the server path, sidecar and
  snapshots included) until it shows the rank dead, and (b) the panel in Chromium (its 1 s poll)
  until it draws the rank's cell dead; median and p99 of each, beside the poll interval;
- idle cost: the server part's CPU (the Jupyter server and its sidecar, user + system time from
  /proc) over 30 s while a panel polls every second with a 512-rank mesh listed, as a share of
  one core.

Targets: the panel shows a change within a second; the server part under 1% of a core idle.

    build/frontend/bin/python bench/panel_latency.py [--rounds 20] [--ranks 64] [--idle-ranks 512]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "browser"))

from jupyter_ui import CHROMIUM, CHROMIUM_ARGS, JupyterServer  # noqa: E402

# The controller: spawns the mesh, prints its pids, and keeps it until its stdin closes (the
# deaths it hears of go to its stderr, unread here).
CONTROLLER = """
import json, sys, xmesh
procs = xmesh.this_host().spawn_procs({"gpus": %d}, name="bench-mesh")
procs.initialized.get(timeout=600)
print(json.dumps({"pids": procs.pids}), flush=True)
sys.stdin.read()
"""


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def start_controller(rundir: str, ranks: int) -> tuple:
    env = dict(os.environ, XMESH_RUNTIME_DIR=rundir)
    prog = subprocess.Popen(["/usr/bin/python3", "-c", CONTROLLER % ranks], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first = json.loads(prog.stdout.readline())
    return prog, first["pids"]


def rank_state(server: JupyterServer, rank: int) -> str:
    with urllib.request.urlopen(server.url("xmesh/api/meshes"), timeout=30) as r:
        reply = json.loads(r.read())
    for mesh in reply.get("meshes", []):
        if mesh["name"] == "bench-mesh":
            return mesh["ranks"][rank]["state"]
    return "?"


def death_latency(server: JupyterServer, page, rundir: str, ranks: int, rounds: int) -> dict:
    prog, pids = start_controller(rundir, ranks)
    cell = '#xmesh-panel .xmesh-mesh[data-mesh="bench-mesh"] .xmesh-rank[data-rank="%d"]'
    page.goto(server.url("lab"))
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="xmesh-panel"]', timeout=60000)
    page.wait_for_selector(cell % (ranks - 1), timeout=60000)
    figures: dict = {"api": [], "panel": []}
    try:
        for rank in range(rounds):
            t0 = time.time()
            os.kill(pids[rank], signal.SIGKILL)
            page.wait_for_selector((cell % rank) + '[data-state="dead"]', timeout=10000, state="attached")
            figures["panel"].append(time.time() - t0)
        for rank in range(rounds, 2 * rounds):
            t0 = time.time()
            os.kill(pids[rank], signal.SIGKILL)
            while rank_state(server, rank) != "dead":
                pass
            figures["api"].append(time.time() - t0)
    finally:
        prog.stdin.close()
        prog.wait(timeout=60)
    return {k: (statistics.median(v) * 1000, percentile(v, 0.99) * 1000) for k, v in figures.items()}


def cpu_seconds(pid: int) -> float:
    """user + system time of a process and its children that ended, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def server_part_pids(server: JupyterServer) -> list:
    """The Jupyter server and its children (the sidecar; no kernel runs in this benchmark)."""
    pids = [server.proc.pid]
    for task in os.listdir(f"/proc/{server.proc.pid}/task"):
        with open(f"/proc/{server.proc.pid}/task/{task}/children") as f:
            pids += [int(p) for p in f.read().split()]
    return pids


def idle_cost(server: JupyterServer, rundir: str, ranks: int, seconds: float) -> float:
    prog, _ = start_controller(rundir, ranks)
    try:
        deadline = time.time() + 30
        while rank_state(server, ranks - 1) != "idle" and time.time() < deadline:
            time.sleep(0.5)
        pids = server_part_pids(server)
        before = sum(cpu_seconds(p) for p in pids)
        t0 = time.time()
        while time.time() - t0 < seconds:  # the panel's own pace: one read a second
            rank_state(server, 0)
            time.sleep(max(0.0, 1.0 - (time.time() - t0) % 1.0))
        used = sum(cpu_seconds(p) for p in pids) - before
        return used / (time.time() - t0) * 100
    finally:
        prog.stdin.close()
        prog.wait(timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--idle-ranks", type=int, default=512)
    ap.add_argument("--idle-seconds", type=float, default=30)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    work = tempfile.mkdtemp(prefix="xmesh-panelbench-")
    os.makedirs(os.path.join(work, "nb"))
    rundir = os.path.join(work, "run")
    os.makedirs(rundir)
    server = JupyterServer(os.path.join(work, "nb"), rundir, os.path.join(work, "server.log"))
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            lat = death_latency(server, page, rundir, args.ranks, args.rounds)
            browser.close()
        idle = idle_cost(server, rundir, args.idle_ranks, args.idle_seconds)
    finally:
        server.stop()
    print(f"a proc killed in a {args.ranks}-rank mesh, {args.rounds} rounds each (ms): median / p99")
    print(f"  the panel's API shows it dead (server path)    {lat['api'][0]:8.1f} / {lat['api'][1]:8.1f}")
    print(f"  the panel in Chromium draws it dead (1 s poll) {lat['panel'][0]:8.1f} / {lat['panel'][1]:8.1f}"
          f"   ({lat['panel'][1] / 1000:.2f}x the target's second at p99)")
    print(f"server part (Jupyter server + sidecar) polled each second, {args.idle_ranks} ranks listed: "
          f"{idle:.2f}% of a core")


if __name__ == "__main__":
    main()
