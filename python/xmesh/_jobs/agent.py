"""The host agent of one node of a job (`SlurmJob`: started on every node by `srun`; `SSHJob`:
over ssh, with --detach).

It picks the address the controller reaches this node at (the interface that routes towards the
controller's machine), runs `xmesh-hostd` in the foreground on that address with the job's key
file and a runtime directory on this node, and says where it serves in the job directory, which
the controller reads (`nodes/<node>.json`; "failed" with the log's tail when the agent could not
start). Its output goes to `nodes/<node>.log`. It lives as long as the agent; SIGTERM (scancel,
the end of the allocation) is passed on, and the agent stops its procs.

    python -m xmesh._jobs.agent --job-dir DIR --towards CONTROLLER_ADDR --key-file KEY [--port P]
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

SERVING = re.compile(r"serving \S+ and tcp://(\S+)")


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


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


class Node:
    """This node's part of a job: its name, its files in the job directory, the agent's command."""

    def __init__(self, job_dir: str, towards: str, port: int, key_file: str, hostd: Optional[str] = None) -> None:
        from .._runtime.agents import hostd_environment, hostd_executable, local_ip_towards

        self.name = node_name()
        nodes_dir = os.path.join(job_dir, "nodes")
        os.makedirs(nodes_dir, exist_ok=True)
        self.status_file = os.path.join(nodes_dir, f"{self.name}.json")
        self.log_path = os.path.join(nodes_dir, f"{self.name}.log")
        tag = os.environ.get("SLURM_JOB_ID") or os.path.basename(job_dir.rstrip("/"))
        # On this node's own disk: a shared home would put every node's sockets in one place.
        self.rundir = f"/tmp/xmj-{os.getuid()}-{tag}-{self.name}"
        self.argv: list = []
        self.error = ""
        try:
            os.makedirs(self.rundir, mode=0o700, exist_ok=True)
            host = f"[{towards}]" if ":" in towards else towards
            ip = local_ip_towards(f"tcp://{host}:9")
            self.argv = [hostd or hostd_executable(), "--runtime-dir", self.rundir, "--listen", f"tcp://{ip}:{port}",
                         "--key-file", key_file]
        except Exception as e:  # no route, no xmesh-hostd: said where the controller looks
            self.error = f"xmesh: the agent of {self.name} cannot start: {e}"
        # It lives as long as the job, and runs its procs with this node's Python.
        self.env = dict(os.environ, XMESH_HOSTD_IDLE="0", **hostd_environment())
        if "SLURM_JOB_ID" in os.environ:  # named in what its procs' ends say when the job ends
            self.env["XMESH_JOB_DESCRIPTION"] = (f"SLURM job {os.environ['SLURM_JOB_ID']} "
                                                 f"({os.environ.get('SLURM_JOB_NAME', '')})")

    def serving(self, addr: str, pid: int) -> dict:
        status = {"node": self.name, "state": "serving", "addr": addr, "pid": pid, "runtime_dir": self.rundir}
        write_json_atomic(self.status_file, status)
        return status

    def failed(self, rc: Optional[int]) -> dict:
        if self.error:
            with open(self.log_path, "a") as log:
                log.write(self.error + "\n")
        status = {"node": self.name, "state": "failed", "exit": rc, "log": log_tail(self.log_path)}
        write_json_atomic(self.status_file, status)
        return status


def run(node: Node) -> int:
    """Under srun: the agent in the foreground, its output teed to the node's log, signals passed on."""
    if node.error:
        node.failed(1)
        return 1
    with open(node.log_path, "ab") as log:
        agent = subprocess.Popen(node.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=node.env)
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
                node.serving(m.group(1), agent.pid)
        rc = agent.wait()
    if not served:
        node.failed(rc)
    return rc


def detach(node: Node, timeout: float = 30.0) -> int:
    """Over ssh: the agent in a session of its own (it outlives the connection); once it serves
    (or failed) its status is printed as one JSON line, which the controller reads."""
    status = None
    if not node.error:
        with open(node.log_path, "ab") as log:
            agent = subprocess.Popen(node.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     env=node.env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while status is None:
            m = SERVING.search(log_tail(node.log_path, 4096))
            if m:
                status = node.serving(m.group(1), agent.pid)
            elif agent.poll() is not None or time.monotonic() > deadline:
                status = node.failed(agent.poll())
            else:
                time.sleep(0.02)
    print(json.dumps(status or node.failed(1)), flush=True)
    return 0 if status and status["state"] == "serving" else 1


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xmesh._jobs.agent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-dir", required=True)
    ap.add_argument("--towards", required=True, help="an address of the controller's machine")
    ap.add_argument("--port", type=int, default=0, help="the agent's one TCP port (0: any free one)")
    ap.add_argument("--key-file", required=True, help="the cluster's key file (mode 0600)")
    ap.add_argument("--detach", action="store_true", help="start the agent in a session of its own and print its "
                                                         "status (over ssh)")
    args = ap.parse_args(argv)
    node = Node(os.path.abspath(args.job_dir), args.towards, args.port, os.path.abspath(args.key_file))
    return detach(node) if args.detach else run(node)


if __name__ == "__main__":
    sys.exit(main())
