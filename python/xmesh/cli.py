"""`xmesh` command line: inspect and control this user's host agent."""
import argparse
import json
import os
import signal
import sys
import time


def _status(args):
    from ._hostd import agent

    st = agent(args.runtime_dir).status()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"host agent pid {st['pid']} on {st['host']} (xmesh {st['version']}, protocol {st['protocol']})")
    print(f"runtime directory {st['runtime_dir']}")
    allocs = st.get("allocations", [])
    if not allocs:
        print("no allocations")
    for a in allocs:
        alive = sum(p["alive"] for p in a["procs"])
        name = a["name"] or "(unnamed)"
        age = time.time() - a["created"]
        print(f"  {a['alloc']}  {name:<16} shape {a['shape']}  {alive}/{len(a['procs'])} procs alive  "
              f"age {age:.0f} s  controller {a['controller']}")
    return 0


def _shutdown(args):
    from . import _core

    rundir = os.path.abspath(args.runtime_dir or _core.runtime_dir())
    try:
        pid = int(open(os.path.join(rundir, "hostd.pid")).read())
    except (FileNotFoundError, ValueError):
        print(f"no host agent runs for {rundir}")
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"no host agent runs for {rundir}")
        return 0
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(f"stopped host agent {pid}")
            return 0
        time.sleep(0.05)
    print(f"host agent {pid} did not stop within 5 s", file=sys.stderr)
    return 1


def main(argv=None):
    from . import _core

    parser = argparse.ArgumentParser(prog="xmesh", description="xmesh: meshes of processes and actors")
    parser.add_argument("--version", action="version",
                        version=f"xmesh {_core.version()} (protocol {_core.protocol_version()}, build {_core.build_id()})")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("status", help="show this user's host agent and its allocations")
    p.add_argument("--runtime-dir", help="runtime directory of the agent (default: this user's)")
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.set_defaults(func=_status)
    p = sub.add_parser("shutdown", help="stop this user's host agent and every proc it owns")
    p.add_argument("--runtime-dir")
    p.set_defaults(func=_shutdown)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (RuntimeError, PermissionError, OSError) as e:
        print(f"xmesh: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
