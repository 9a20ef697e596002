"""The host agent of one node of a job (`SlurmJob`: started on every node by `srun`).

It picks the address the controller reaches this node at (the interface that routes towards the
controller's machine), runs `xmesh-hostd` in the foreground on that address with the job's key
file and a runtime directory on this node, and says where it serves in the job directory, which
the controller reads (`nodes/<node>.json`; "failed" with the log's tail when the agent could not
start). Its output goes to `nodes/<node>.log`. It lives as long as the agent; SIGTERM (scancel,
the end of the allocation) is passed on, and the agent stops its procs.

    python -m xmesh._job_agent --job-dir DIR --towards CONTROLLER_ADDR --key-file KEY [--port P]
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
from typing import Optional

SERVING = re.compile(r"serving \S+ and tcp://(\S+)")


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def local_ip_towards(host: str) -> str:
    """This node's address on the interface that routes to host (no packet is sent)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def write_json_atomic(path: str, value: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def log_tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def run(job_dir: str, towards: str, port: int, key_file: str, hostd: Optional[str] = None) -> int:
    from ._hostd import hostd_executable

    node = node_name()
    nodes_dir = os.path.join(job_dir, "nodes")
    os.makedirs(nodes_dir, exist_ok=True)
    status_file = os.path.join(nodes_dir, f"{node}.json")
    log_path = os.path.join(nodes_dir, f"{node}.log")
    job_id = os.environ.get("SLURM_JOB_ID", str(os.getpid()))
    # On this node's own disk: a shared home would put every node's sockets in one place.
    rundir = f"/tmp/xmj-{os.getuid()}-{job_id}-{node}"
    os.makedirs(rundir, mode=0o700, exist_ok=True)
    try:
        ip = local_ip_towards(towards)
        argv = [hostd or hostd_executable(), "--runtime-dir", rundir, "--listen", f"tcp://{ip}:{port}",
                "--key-file", key_file]
    except Exception as e:  # no route, no xmesh-hostd: said where the controller looks
        with open(log_path, "a") as log:
            log.write(f"xmesh: the agent of {node} cannot start: {e}\n")
        write_json_atomic(status_file, {"node": node, "state": "failed", "log": log_tail(log_path)})
        return 1
    env = dict(os.environ, XMESH_HOSTD_IDLE="0")  # it lives as long as the job
    if "SLURM_JOB_ID" in os.environ:  # named in what its procs' ends say when the job ends
        env["XMESH_JOB_DESCRIPTION"] = f"SLURM job {os.environ['SLURM_JOB_ID']} ({os.environ.get('SLURM_JOB_NAME', '')})"
    with open(log_path, "ab") as log:
        agent = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, _f: agent.send_signal(s))
        served = False
        assert agent.stdout is not None
        for line in agent.stdout:
            log.write(line)
            log.flush()
            m = SERVING.search(line.decode(errors="replace"))
            if m and not served:
                served = True
                write_json_atomic(status_file, {"node": node, "state": "serving", "addr": m.group(1),
                                                "pid": agent.pid, "runtime_dir": rundir})
        rc = agent.wait()
    if not served:
        write_json_atomic(status_file, {"node": node, "state": "failed", "exit": rc, "log": log_tail(log_path)})
    return rc


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xmesh._job_agent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-dir", required=True)
    ap.add_argument("--towards", required=True, help="an address of the controller's machine")
    ap.add_argument("--port", type=int, default=0, help="the agent's one TCP port (0: any free one)")
    ap.add_argument("--key-file", required=True, help="the cluster's key file (mode 0600)")
    args = ap.parse_args(argv)
    return run(os.path.abspath(args.job_dir), args.towards, args.port, os.path.abspath(args.key_file))


if __name__ == "__main__":
    sys.exit(main())
