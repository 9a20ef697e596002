#!/usr/bin/python3
"""A chaos soak (issue 41): calls keep going to a mesh on this host and to a mesh on two namespace
hosts over TCP while a chaos thread, at random (seeded) every 0.3-1.5 s, does one of:

- SIGKILL a proc (local or remote); SIGSTOP a proc for 0.2-2 s;
- SIGSTOP this host's agent for 0.2-2 s; SIGKILL a namespace host's agent (restarted at once at
  its address: its procs are lost with it);
- ring corruption: a local proc writes over the shared headers of every ring it maps (its writer
  and reader positions, as a buggy native library could);
- a link cut: a namespace host's veth down for 0.5-4 s (past XMESH_LINK_TIMEOUT_MS, so links
  reconnect and resend).

Each round calls `call()` on both meshes with a timeout. A round's outcome per mesh: answered
(every rank), failed (an error naming a rank: the proc died, a broken link, a lost host) or hung
(no answer within the round's limit: never acceptable). A mesh with dead ranks is stopped and
spawned again (a restart). At the end everything is stopped and leaks are counted: worker
processes left, files in /dev/shm, the controller's open files and threads against the start,
the local agent's open files against the start (once its allocations are gone).

    sudo PYTHONPATH=build/python /usr/bin/python3 bench/chaos_soak.py [--seconds 600] [--seed 1]

Target: 0 hung, 0 leaked. Not run by CI (it takes minutes); tests/ cover each fault on its own.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import xmesh  # noqa: E402
from xmesh import _core  # noqa: E402
from xmesh._base.pids import running_agent_pid  # noqa: E402
from netns_hosts import NetnsHosts, unavailable  # noqa: E402

ROUND_LIMIT_S = 60.0  # a call not answered by then is hung (chaos pauses last 4 s at most)


class Worker(xmesh.Actor):
    @xmesh.endpoint
    def work(self, n: int) -> int:
        return sum(range(n % 1000))

    @xmesh.endpoint
    def pid(self) -> int:
        return os.getpid()

    @xmesh.endpoint
    def scribble(self, seed: int) -> int:
        """Writes over the positions in every ring header this process maps (ring corruption)."""
        import ctypes

        rng, hit = random.Random(seed), 0
        with open("/proc/self/maps") as maps:
            starts = [int(line.split("-", 1)[0], 16) for line in maps if "memfd:xmesh-link" in line]
        for start in starts:
            offset = rng.choice((64, 128))  # the writer's or the reader's position
            ctypes.c_uint64.from_address(start + offset).value = rng.choice((1 << 62, 1 << 40, 0))
            hit += 1
        return hit


def hostd_exe() -> str:
    return os.environ.get("XMESH_HOSTD") or os.path.join(HERE, "..", "build", "runtime", "xmesh-hostd")


def fds_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def workers_left() -> list:
    """Worker processes (not fork servers) still running."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{p}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "xmesh._proc.worker" in cmd and "--fork-server" not in cmd and state != "Z":
            out.append(int(p))
    return out


class RemoteAgents:
    """A host agent per namespace host, restartable at the same address after a SIGKILL."""

    def __init__(self, net: NetnsHosts, tmp: str, key: str) -> None:
        self.net, self.tmp, self.key = net, tmp, key
        self.procs: dict = {}
        for i in range(len(net.hosts)):
            self.start(i)

    def start(self, i: int) -> None:
        h = self.net.hosts[i]
        rd = os.path.join(self.tmp, f"rt{i}-{time.monotonic_ns()}")  # a fresh directory: the dead one's lock stays
        os.makedirs(rd, mode=0o700)
        log = os.path.join(self.tmp, f"agent{i}-{time.monotonic_ns()}.log")
        with open(log, "w") as f:
            p = h.popen([hostd_exe(), "--runtime-dir", rd, "--listen", f"tcp://{h.addr}:7000", "--key-file", self.key],
                        stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, XMESH_HOSTD_IDLE="0"))
        self.procs[i] = p
        deadline = time.monotonic() + 20
        while "serving" not in open(log).read():
            if time.monotonic() > deadline or p.poll() is not None:
                raise RuntimeError(f"the agent of {h.hostname} did not start: {open(log).read()[-2000:]}")
            time.sleep(0.05)

    def locators(self) -> list:
        return [f"{h.addr}:7000" for h in self.net.hosts]

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


class Mesh:
    """One mesh under test: spawned again whenever chaos left it with dead ranks."""

    def __init__(self, label: str, make_hosts, per_host: int) -> None:
        self.label, self.make_hosts, self.per_host = label, make_hosts, per_host
        self.procs = self.actors = None
        self.pids: list = []
        self.restarts = 0
        self.spawn()

    def spawn(self) -> None:
        self.procs = self.make_hosts().spawn_procs({"gpus": self.per_host})
        self.actors = self.procs.spawn("w", Worker)
        self.pids = list(self.actors.pid.call().get(timeout=ROUND_LIMIT_S).values())

    def restart(self) -> None:
        self.restarts += 1
        try:
            self.procs.stop()
        except Exception:  # noqa: BLE001 - a mesh whose host is gone stops what it can
            pass
        for attempt in range(5):
            try:
                self.spawn()
                return
            except Exception:  # noqa: BLE001 - chaos may strike the new mesh too: try again
                time.sleep(0.5 * (attempt + 1))
        raise RuntimeError(f"the {self.label} mesh could not be spawned again")


class Chaos(threading.Thread):
    def __init__(self, rng: random.Random, meshes: dict, remote: RemoteAgents, net: NetnsHosts,
                 local_agent: int) -> None:
        super().__init__(name="chaos", daemon=True)
        self.rng, self.meshes, self.remote, self.net, self.local_agent = rng, meshes, remote, net, local_agent
        self.stop_event = threading.Event()
        self.counts: dict = {}
        self.lock = threading.Lock()  # meshes are restarted by the main thread

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def pause(self, pid: int, seconds: float, what: str) -> None:
        try:
            os.kill(pid, signal.SIGSTOP)
            self.count(what)
            time.sleep(seconds)
        except ProcessLookupError:
            return
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def act(self) -> None:
        action = self.rng.choice(["kill_proc", "stop_proc", "stop_proc", "stop_local_agent", "kill_remote_agent",
                                  "corrupt_ring", "corrupt_ring", "cut_link"])
        with self.lock:
            mesh = self.meshes["local" if action == "corrupt_ring" else self.rng.choice(list(self.meshes))]
            pid = self.rng.choice(mesh.pids) if mesh.pids else None
        if action == "kill_proc" and pid:
            try:
                os.kill(pid, signal.SIGKILL)
                self.count("SIGKILL proc")
            except ProcessLookupError:
                pass
        elif action == "stop_proc" and pid:
            self.pause(pid, self.rng.uniform(0.2, 2.0), "SIGSTOP proc")
        elif action == "stop_local_agent":
            self.pause(self.local_agent, self.rng.uniform(0.2, 2.0), "SIGSTOP local agent")
        elif action == "kill_remote_agent":
            i = self.rng.randrange(len(self.net.hosts))
            self.remote.procs[i].kill()
            self.remote.procs[i].wait()
            self.count("SIGKILL remote agent")
            self.remote.start(i)
        elif action == "corrupt_ring":
            try:  # the proc's own code does it: a call like any other, which may itself fail
                mesh.actors.slice(gpus=self.rng.randrange(mesh.per_host)).scribble.call_one(
                    self.rng.randrange(1 << 30)).get(timeout=10)
                self.count("ring corrupted")
            except Exception:  # noqa: BLE001 - counted by its outcome in the rounds
                pass
        elif action == "cut_link":
            h = self.rng.choice(self.net.hosts)
            h.cut()
            self.count("link cut")
            time.sleep(self.rng.uniform(0.5, 4.0))
            h.restore()

    def run(self) -> None:
        while not self.stop_event.wait(self.rng.uniform(0.3, 1.5)):
            try:
                self.act()
            except Exception as e:  # noqa: BLE001 - chaos never ends the soak
                self.count(f"chaos error: {type(e).__name__}")


def one_round(mesh: Mesh, n: int, tally: dict) -> bool:
    """One call() to every rank of mesh, its outcome counted; False when a rank is gone (the
    mesh is then spawned again)."""
    fut = mesh.actors.work.call(n)
    try:
        values = fut.get(timeout=ROUND_LIMIT_S)
        ok = len(list(values.values())) == len(mesh.pids)
        tally["answered" if ok else "failed"] += 1
        return True
    except TimeoutError:
        tally["hung"] += 1
        tally["hung_rounds"].append((mesh.label, n, time.time()))
        return False
    except Exception as e:  # noqa: BLE001 - a failure naming why is an outcome, counted
        tally["failed"] += 1
        kind = type(e).__name__
        tally["errors"][kind] = tally["errors"].get(kind, 0) + 1
        seen = {s.split(":", 2)[1] for s in tally["samples"]}
        if len(tally["samples"]) < 12 and f" {kind}" not in seen or len(tally["samples"]) < 4:
            tally["samples"].append(f"{mesh.label}: {kind}: {str(e)[:240]}")
        return kind != "SupervisionError"  # a broken link's calls fail, the procs live on


def snapshot() -> dict:
    me = os.getpid()
    return {"controller_fds": fds_of(me), "controller_threads": len(os.listdir(f"/proc/{me}/task")),
            "dev_shm": len(os.listdir("/dev/shm")),
            "ring_mappings": sum("memfd:xmesh-link" in line for line in open(f"/proc/{me}/maps"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"chaos_soak.py needs namespace hosts: {why}")
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="xmesh-soak-")
    key = os.path.join(tmp, "cluster.key")
    _core.write_new_key_file(key)
    start_workers = set(workers_left())
    with NetnsHosts(2) as net:
        remote = RemoteAgents(net, tmp, key)
        tally: dict = {"rounds": 0, "answered": 0, "failed": 0, "hung": 0, "errors": {}, "samples": [],
                       "hung_rounds": []}
        try:
            make = {"local": (xmesh.this_host, 4),
                    "remote": (lambda: xmesh.hosts(remote.locators(), key_file=key), 2)}
            # The baseline: the runtime up, both kinds of mesh spawned and stopped once.
            for label, (hosts, per_host) in make.items():
                Mesh(label, hosts, per_host).procs.stop()
            time.sleep(3)
            before = snapshot()
            local_agent = running_agent_pid(_core.runtime_dir())
            agent_fds_before = fds_of(local_agent)
            meshes = {label: Mesh(label, hosts, per_host) for label, (hosts, per_host) in make.items()}
            chaos = Chaos(rng, meshes, remote, net, local_agent)
            chaos.start()
            end = time.monotonic() + args.seconds
            n = 0
            while time.monotonic() < end:
                for mesh in meshes.values():
                    n += 1
                    tally["rounds"] += 1
                    if not one_round(mesh, n, tally):
                        with chaos.lock:
                            mesh.restart()
            chaos.stop_event.set()
            chaos.join(timeout=30)
            for mesh in meshes.values():
                try:
                    mesh.procs.stop()
                except Exception:  # noqa: BLE001
                    pass
            time.sleep(3)  # stops are asynchronous: the agents reap and report
            agent_fds_after = fds_of(local_agent)
        finally:
            remote.stop()
    time.sleep(1)
    after = snapshot()
    left = sorted(set(workers_left()) - start_workers)
    leaks = {"workers left": left, "/dev/shm entries": after["dev_shm"] - before["dev_shm"],
             "controller fds": after["controller_fds"] - before["controller_fds"],
             "ring mappings": after["ring_mappings"] - before["ring_mappings"],
             "local agent fds": agent_fds_after - agent_fds_before}
    restarts = {m.label: m.restarts for m in meshes.values()}
    report = {"seconds": args.seconds, "seed": args.seed, "rounds": tally["rounds"], "answered": tally["answered"],
              "failed": tally["failed"], "hung": tally["hung"], "errors": tally["errors"], "chaos": chaos.counts,
              "mesh restarts": restarts, "leaks": leaks, "failure samples": tally["samples"],
              "hung rounds": tally["hung_rounds"],
              "controller threads": [before["controller_threads"], after["controller_threads"]]}
    print(json.dumps(report, indent=1))
    leaked = bool(left) or any(v > 0 for k, v in leaks.items() if k != "workers left")
    print(f"\n{tally['rounds']} call rounds: {tally['answered']} answered, {tally['failed']} failed naming why, "
          f"{tally['hung']} hung; chaos: {chaos.counts}; restarts: {restarts}; "
          f"{'LEAKED: ' + json.dumps(leaks) if leaked else 'nothing leaked'}")
    sys.exit(1 if tally["hung"] or leaked else 0)


if __name__ == "__main__":
    main()
