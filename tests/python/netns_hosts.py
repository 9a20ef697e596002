"""Test hosts on one machine (issue 20): network namespaces joined by veth pairs to a bridge the
test creates in the root namespace, each with its own address and, for the processes started in
it, its own hostname (a UTS namespace). Only addresses these tests create are used (10.231.N.0/24,
or fd13:231:N::/64 for IPv6 hosts, on links that exist only while the test runs); everything is
torn down afterwards, the veth from the root side before its namespace (PLATFORM-NOTES). Root is
needed; `unavailable()` says why namespaces cannot be made here, for a skip with a clear message.
`AgentCluster`: a host agent listening on TCP on each of them, with one cluster key."""
import os
import shlex
import subprocess
import time
from typing import List, Optional, Sequence

from xmesh_testing import wait_until

from xmesh import _core


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> Optional[str]:
    """Why namespace hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"xmprobe{os.getpid()}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _free_subnet(net: int, ipv6: bool) -> int:
    """A subnet number no address of this machine is in now, tried from one that depends on this
    process: two test processes at once (ctest -j), or links a killed test left, never share one
    (a shared subnet routes one test's traffic to the other's bridge)."""
    used = _ip("-o", "addr", "show", check=False).stdout
    start = os.getpid() % 250
    for k in range(250):
        subnet = 1 + (start + k) % 250
        prefix = f"fd13:{net}:{subnet}::" if ipv6 else f"10.{net}.{subnet}."
        if prefix not in used:
            return subnet
    raise RuntimeError(f"every 10.{net}.N.0/24 is in use on this machine: remove the links tests left (ip link)")


class Host:
    """One namespace host: its namespace, hostname, address and the root-side end of its link."""

    def __init__(self, netns: str, hostname: str, addr: str, link: str, hidden: Sequence[str] = ()) -> None:
        self.netns = netns
        self.hostname = hostname
        self.addr = addr
        self.link = link  # the veth end in the root namespace (down: the host is cut off)
        self.hidden = list(hidden)

    def command(self, argv: List[str], keep_sys: bool = False) -> List[str]:
        """argv run inside this host: its network namespace, a UTS namespace named hostname and a
        mount namespace in which the `hidden` directories are empty (as another machine would not
        have this one's files there: a unix socket under them is out of reach). keep_sys: the
        machine's /sys stays (with its cgroup mounts, which slurmd needs) instead of the
        namespace's own that `ip netns exec` mounts."""
        hide = "".join(f'mount -t tmpfs -o mode=700 xmesh-hidden {shlex.quote(d)} && ' for d in self.hidden)
        script = hide + 'hostname "$0" && exec "$@"'
        enter = ["nsenter", f"--net=/run/netns/{self.netns}"] if keep_sys else ["ip", "netns", "exec", self.netns]
        return [*enter, "unshare", "--uts", "--mount", "sh", "-c", script, self.hostname, *argv]

    def popen(self, argv: List[str], keep_sys: bool = False, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv, keep_sys), **kwargs)

    def cut(self) -> None:
        _ip("link", "set", self.link, "down")

    def restore(self) -> None:
        _ip("link", "set", self.link, "up")

    def firewall(self, open_ports: List[int], only_from: Optional[List[str]] = None) -> None:
        """Inside this host, new inbound TCP connections are dropped except to open_ports (as a
        node whose firewall opens one port; none: a laptop behind NAT): replies and its own
        connections out still flow. only_from: only connections from these (IPv4) addresses are
        dropped (a node the controller's network has no route to)."""
        source = f"ip saddr {{ {', '.join(only_from)} }} " if only_from else ""
        rules = "\n".join([
            "table inet xmesh_test {",
            "  chain input {",
            "    type filter hook input priority 0; policy accept;",
            "    iif lo accept",
            "    ct state established,related accept",
            f"    tcp dport {{ {', '.join(str(p) for p in open_ports)} }} accept" if open_ports else "",
            f"    {source}tcp flags syn drop",
            "  }",
            "}",
        ])
        subprocess.run(["ip", "netns", "exec", self.netns, "nft", "-f", "-"], input=rules, text=True, check=True,
                       capture_output=True, timeout=30)

    def open_firewall(self) -> None:
        subprocess.run(["ip", "netns", "exec", self.netns, "nft", "delete", "table", "inet", "xmesh_test"],
                       capture_output=True, timeout=30)


class Started:
    """A context manager over `_start()` and `close()`: whatever `_start` made goes at the end,
    also when `_start` itself fails half way."""

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class NetnsHosts(Started):
    """n hosts named node-a, node-b...; the root namespace reaches them at `.gateway`. Use as a
    context manager: everything it made goes when it ends, also after a failure. ipv6=True: the
    hosts and the gateway have IPv6 addresses only (fd13:231:<subnet>::/64, a unique local
    prefix; `Host.addr` is the bare address, without brackets)."""

    def __init__(self, n: int, hidden: Sequence[str] = (), ipv6: bool = False) -> None:
        self.tag = f"{os.getpid() % 10000}{int(time.monotonic() * 1000) % 1000:03d}"
        self.net = 231
        self.subnet = _free_subnet(self.net, ipv6)  # 10.231.<subnet>.0/24, on no link of this machine now
        self.bridge = f"xmb{self.tag}"
        self.ipv6 = ipv6
        self.gateway = f"fd13:{self.net}:{self.subnet}::1" if ipv6 else f"10.{self.net}.{self.subnet}.1"
        self._prefix = 64 if ipv6 else 24
        self.hosts: List[Host] = []
        self._n = n
        self._hidden = [d for d in hidden if os.path.isdir(d)]

    def _start(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self._prefix}", "dev", self.bridge, *self._nodad())
        _ip("link", "set", self.bridge, "up")
        for i in range(self._n):
            netns, link = f"xmn{self.tag}{i}", f"xmv{self.tag}{i}"
            addr = (f"fd13:{self.net}:{self.subnet}::{10 + i:x}" if self.ipv6
                    else f"10.{self.net}.{self.subnet}.{10 + i}")
            host = Host(netns, f"node-{chr(ord('a') + i)}", addr, link, self._hidden)
            _ip("netns", "add", netns)
            self.hosts.append(host)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
            _ip("link", "set", link, "master", self.bridge)
            _ip("link", "set", link, "up")
            _ip("-n", netns, "addr", "add", f"{host.addr}/{self._prefix}", "dev", "eth0", *self._nodad())
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("-n", netns, "route", "add", "default", "via", self.gateway)

    def _nodad(self) -> List[str]:
        """IPv6 addresses usable at once (no duplicate address detection: these links are ours)."""
        return ["nodad"] if self.ipv6 else []

    def close(self) -> None:
        for host in self.hosts:
            # Whatever still runs in the namespace goes with it.
            pids = _ip("netns", "pids", host.netns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("link", "del", host.link, check=False)
            _ip("netns", "del", host.netns, check=False)
        self.hosts = []
        _ip("link", "del", self.bridge, check=False)

    @staticmethod
    def leftovers(tag: str) -> List[str]:
        """Namespaces and links of a tag still present (a teardown check)."""
        names = _ip("netns", "list", check=False).stdout + _ip("-o", "link", "show", check=False).stdout
        return [line for line in names.splitlines() if tag in line]


PORT = 7000  # where the agents listen, on every namespace host


class AgentCluster:
    """A host agent on each namespace host, listening on TCP (PORT) with the cluster's key."""

    def __init__(self, net: NetnsHosts, tmp: str, hosts: Optional[Sequence[int]] = None) -> None:
        self.net = net
        self.tmp = tmp
        self.key = os.path.join(tmp, "cluster.key")
        _core.write_new_key_file(self.key)
        self.agents: dict = {}
        for i in range(len(net.hosts)) if hosts is None else hosts:
            self.start_agent(i)

    def rundir(self, i) -> str:
        return os.path.join(self.tmp, f"rt-{i}")

    def log(self, i) -> str:
        return os.path.join(self.tmp, f"agent-{i}.log")

    def locator(self, i: int, port: int = PORT) -> str:
        addr = self.net.hosts[i].addr
        return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"

    def start_agent(self, i: int, *extra: str, port: int = PORT, env: Optional[dict] = None) -> subprocess.Popen:
        """The agent of host i listening on port (another port: a second agent there, with a
        runtime directory of its own); env: variables set for it over this process's."""
        key = i if port == PORT else f"{i}-{port}"
        os.makedirs(self.rundir(key), mode=0o700, exist_ok=True)
        with open(self.log(key), "w") as log:
            p = self.agents[key] = self.net.hosts[i].popen(
                [os.environ["XMESH_HOSTD"], "--runtime-dir", self.rundir(key), "--listen",
                 f"tcp://{self.locator(i, port)}", "--key-file", self.key, *extra],
                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))
        wait_until(lambda: "serving" in open(self.log(key)).read() or p.poll() is not None, 20)
        assert p.poll() is None, open(self.log(key)).read()
        return p

    def close(self) -> None:
        for p in self.agents.values():
            if p.poll() is None:
                p.terminate()
        for p in self.agents.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
