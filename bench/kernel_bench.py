#!/usr/bin/python3
"""The xmesh kernel beside ipykernel, measured in one run: `1+1` execute round trip (to
execute_reply and to the idle status), kernel start to ready and to the first `1+1` reply, and
in a fresh kernel, attaching to a named 8-proc allocation plus one call() against spawning 8
fresh procs plus one call(). Prints one table (medians, p90, ratios).

    /usr/bin/python3 bench/kernel_bench.py [--quick] [--xmesh NAME] [--ipykernel NAME]

Uses the kernelspecs Jupyter finds: by default "xmesh" (installed by scripts/setup.sh, or the
build tree's with JUPYTER_PATH=build/share/jupyter) and "python3" (Debian's python3-ipykernel).
For both kernels in a venv: `ENV/bin/python -m xmesh.kernel install --sys-prefix --name
xmesh-venv`, `ENV/bin/python -m ipykernel install --sys-prefix --name ipy-venv`, then
`JUPYTER_PATH=ENV/share/jupyter bench/kernel_bench.py --xmesh xmesh-venv --ipykernel ipy-venv`.
"""
import argparse
import os
import sys
import statistics
import tempfile
import time
from queue import Empty

from jupyter_client.manager import KernelManager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_stats import pct  # noqa: E402

ACTOR = '''
from xmesh import Actor, endpoint, this_host
class Worker(Actor):
    @endpoint
    def ping(self):
        return 1
'''


def start(name, env):
    t0 = time.perf_counter()
    km = KernelManager(kernel_name=name)
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc, time.perf_counter() - t0


def stop(km, kc):
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def execute(kc, code, timeout=120):
    """Returns (seconds to execute_reply, seconds to idle, reply content, stdout)."""
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    t_reply = t_idle = None
    reply = None
    out = []
    while t_reply is None or t_idle is None:
        try:
            msg = kc.get_shell_msg(timeout=0.0005) if t_reply is None else None
            if msg and msg["parent_header"].get("msg_id") == msg_id:
                t_reply = time.perf_counter() - t0
                reply = msg["content"]
        except Empty:
            pass
        try:
            msg = kc.get_iopub_msg(timeout=0.0005)
        except Empty:
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(code)
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            t_idle = time.perf_counter() - t0
    return t_reply, t_idle, reply, "".join(out)


# The kernelspecs measured (--xmesh, --ipykernel): {"xmesh": name, "python3": name}.
NAMES = {"xmesh": "xmesh", "python3": "python3"}


def bench_round_trip(env, n):
    kernels = {name: start(NAMES[name], env)[:2] for name in ("xmesh", "python3")}
    res = {name: ([], []) for name in kernels}
    for name, (km, kc) in kernels.items():
        for _ in range(20):  # warm up
            execute(kc, "1+1")
    for _ in range(n):  # interleaved, so that noise hits both alike
        for name, (km, kc) in kernels.items():
            r, i, _, _ = execute(kc, "1+1")
            res[name][0].append(r * 1e3)
            res[name][1].append(i * 1e3)
    for km, kc in kernels.values():
        stop(km, kc)
    return res


def bench_start(env, n):
    """Seconds from start to ready and to the first `1+1` reply, per kernel."""
    res = {"xmesh": ([], []), "python3": ([], [])}
    for _ in range(n):
        for name in res:
            km, kc, took = start(NAMES[name], env)
            first, _, _, _ = execute(kc, "1+1")
            res[name][0].append(took)
            res[name][1].append(took + first)
            stop(km, kc)
    return res


def timed_cell(kc, code):
    _, _, reply, out = execute(kc, code + "\nprint('took', time.perf_counter() - _t0)")
    if reply["status"] != "ok":
        raise RuntimeError(f"{code}: {reply.get('ename')}: {reply.get('evalue')}")
    return float(out.split("took")[-1])


def bench_attach(env, n):
    km, kc, _ = start(NAMES["xmesh"], env)
    execute(kc, ACTOR + "procs = this_host().spawn_procs({'gpus': 8}, name='bench-attach')\n"
                        "w = procs.spawn('w', Worker)\nw.ping.call().get()")
    stop(km, kc)
    attach, spawn = [], []
    for _ in range(n):
        km, kc, _ = start(NAMES["xmesh"], env)
        attach.append(timed_cell(kc, "import time, xmesh\n_t0 = time.perf_counter()\n"
                                     "w = xmesh.attach('bench-attach').actors('w')\nw.ping.call().get()"))
        stop(km, kc)
        km, kc, _ = start(NAMES["xmesh"], env)
        execute(kc, ACTOR)
        spawn.append(timed_cell(kc, "import time\n_t0 = time.perf_counter()\n"
                                    "w = this_host().spawn_procs({'gpus': 8}).spawn('w', Worker)\nw.ping.call().get()"))
        stop(km, kc)
    km, kc, _ = start(NAMES["xmesh"], env)
    execute(kc, "import xmesh\nxmesh.attach('bench-attach').stop()")
    stop(km, kc)
    return attach, spawn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--xmesh", default="xmesh", help="the xmesh kernel's kernelspec name")
    ap.add_argument("--ipykernel", default="python3", help="ipykernel's kernelspec name")
    args = ap.parse_args()
    NAMES.update(xmesh=args.xmesh, python3=args.ipykernel)
    n_rt, n_start, n_attach = (100, 3, 3) if args.quick else (500, 8, 6)
    rundir = tempfile.mkdtemp(prefix="xmb-", dir="/tmp")
    os.chmod(rundir, 0o700)
    env = dict(os.environ, XMESH_RUNTIME_DIR=rundir)

    rt = bench_round_trip(env, n_rt)
    st = bench_start(env, n_start)
    attach, spawn = bench_attach(env, n_attach)

    print(f"\n| `1+1` execute round trip (ms, {n_rt} each) | to execute_reply median | p90 | to idle median | p90 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in ("xmesh", "python3"):
        r, i = rt[name]
        print(f"| {NAMES[name]} | {statistics.median(r):.2f} | {pct(r, 90):.2f} | {statistics.median(i):.2f} | "
              f"{pct(i, 90):.2f} |")
    ratio = statistics.median(rt["xmesh"][1]) / statistics.median(rt["python3"][1])
    print(f"\nxmesh / ipykernel, to idle: {ratio:.2f}x")
    print(f"\n| kernel start (s, {n_start} each) | to ready median | max | to first `1+1` reply median | max |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in ("xmesh", "python3"):
        ready, first = st[name]
        print(f"| {NAMES[name]} | {statistics.median(ready):.2f} | {max(ready):.2f} | {statistics.median(first):.2f} | "
              f"{max(first):.2f} |")
    ratio = statistics.median(st["xmesh"][1]) / statistics.median(st["python3"][1])
    print(f"\nxmesh / ipykernel, start to first reply: {ratio:.2f}x")
    print(f"\n| in a fresh kernel (ms, {n_attach} each) | median | max |")
    print("| --- | ---: | ---: |")
    print(f"| attach to a named 8-proc allocation + one call() | {statistics.median(attach) * 1e3:.1f} | "
          f"{max(attach) * 1e3:.1f} |")
    print(f"| spawn 8 fresh procs + one call() | {statistics.median(spawn) * 1e3:.1f} | {max(spawn) * 1e3:.1f} |")
    print(f"\nattach is {statistics.median(spawn) / statistics.median(attach):.1f}x faster than a fresh spawn")


if __name__ == "__main__":
    main()
