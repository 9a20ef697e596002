#!/usr/bin/python3
"""The compatibility suite on both runtimes: each program of examples/monarch/ (Monarch's
documented style, `from monarch.actor import ...`) run unchanged on xmesh and on the real
Monarch (torchmonarch 0.7, CPU) in alternating rounds; whether their outputs are the same, and
each program's wall time on both (start-up included: what a user waits for), as a ratio.

    /usr/bin/python3 bench/monarch_compat.py --make-venv /tmp/monvenv     # once: pip from PyPI
    /usr/bin/python3 bench/monarch_compat.py --monarch-python /tmp/monvenv/bin/python [--rounds 3]
    ... --record   # also writes Monarch's outputs to examples/monarch/expected/ (the tests' truth)

xmesh runs with /usr/bin/python3 and PYTHONPATH=<build>/python (--build, default build/). A
ratio below 1 means xmesh finished sooner. Exits 1 if any output differs.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROGRAMS = os.path.join(ROOT, "examples", "monarch")


def make_venv(path: str) -> None:
    subprocess.run(["/usr/bin/python3", "-m", "venv", path], check=True)
    subprocess.run([os.path.join(path, "bin", "pip"), "install", "-q", "torchmonarch==0.7.0"], check=True)


def run(python: str, program: str, env: dict) -> "tuple[float, subprocess.CompletedProcess]":
    start = time.monotonic()
    r = subprocess.run([python, program], env=env, capture_output=True, text=True, timeout=300,
                       cwd=PROGRAMS)
    return time.monotonic() - start, r


def environments(build: str) -> "tuple[dict, dict]":
    base = {k: v for k, v in os.environ.items() if not k.startswith("XMESH_") and k != "PYTHONPATH"}
    xmesh = dict(base, PYTHONPATH=os.path.join(build, "python"),
                 XMESH_HOSTD=os.path.join(build, "runtime", "xmesh-hostd"),
                 XMESH_RUNTIME_DIR=tempfile.mkdtemp(prefix="xmcompat-"))
    return xmesh, dict(base)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--monarch-python", help="the python of a venv with torchmonarch 0.7 installed")
    ap.add_argument("--make-venv", metavar="DIR", help="create such a venv (pip install torchmonarch==0.7.0)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true", help="write Monarch's outputs as the expected ones")
    args = ap.parse_args()
    if args.make_venv:
        make_venv(args.make_venv)
        args.monarch_python = args.monarch_python or os.path.join(args.make_venv, "bin", "python")
    if not args.monarch_python:
        ap.error("--monarch-python (or --make-venv) is needed")
    xmesh_env, monarch_env = environments(os.path.abspath(args.build))
    names = sorted(f[:-3] for f in os.listdir(PROGRAMS) if f.endswith(".py"))
    rows, differ = [], 0
    for name in names:
        program = os.path.join(PROGRAMS, f"{name}.py")
        times: "dict[str, list[float]]" = {"xmesh": [], "monarch": []}
        outputs: "dict[str, str]" = {}
        for i in range(args.rounds):
            order = [("xmesh", "/usr/bin/python3", xmesh_env), ("monarch", args.monarch_python, monarch_env)]
            for side, python, env in (order if i % 2 == 0 else order[::-1]):
                seconds, r = run(python, program, env)
                if r.returncode != 0:
                    print(f"{name}: {side} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}", file=sys.stderr)
                    return 1
                times[side].append(seconds)
                outputs.setdefault(side, r.stdout)
        same = outputs["xmesh"] == outputs["monarch"]
        differ += not same
        if args.record:
            with open(os.path.join(PROGRAMS, "expected", f"{name}.out"), "w") as f:
                f.write(outputs["monarch"])
        x, m = statistics.median(times["xmesh"]), statistics.median(times["monarch"])
        rows.append((name, "same" if same else "DIFFERS", x, m, x / m))
        if not same:
            print(f"{name}: outputs differ\n--- xmesh\n{outputs['xmesh']}--- monarch\n{outputs['monarch']}",
                  file=sys.stderr)
    print(f"examples/monarch on xmesh and torchmonarch 0.7, {os.cpu_count()} cores, {args.rounds} rounds "
          "(median wall time of each program, start-up included)")
    print(f"{'program':<18}{'output':<10}{'xmesh s':>10}{'monarch s':>12}{'xmesh / monarch':>18}")
    for name, same, x, m, ratio in rows:
        print(f"{name:<18}{same:<10}{x:>10.2f}{m:>12.2f}{ratio:>17.2f}x")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
