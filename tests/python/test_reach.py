"""How a controller reaches its hosts (issue 45): host agents on IPv6-only namespace hosts, reached
by address and by a name that resolves to IPv6 only; calls, output, procs calling each other
across hosts (relayed through each agent's port, and over TCP lanes), a proc's death. Skipped,
saying why, only where namespaces cannot be made."""
import os
import socket
import subprocess
import textwrap

import pytest
from netns_hosts import AgentCluster, NetnsHosts, unavailable
from xmesh_testing import PYTHON, private_tmpdir

import xmesh
from actors_for_tests import Pinger, Ponger
from xmesh import _core

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"namespace hosts unavailable: {WHY_NOT}")


class Where(xmesh.Actor):
    @xmesh.endpoint
    def where(self) -> str:
        print(f"on {socket.gethostname()}", flush=True)
        return socket.gethostname()

    @xmesh.endpoint
    def die(self) -> None:
        os._exit(3)


@pytest.fixture(scope="module")
def v6_cluster():
    tmp = private_tmpdir("xmesh-v6-")
    with NetnsHosts(3, hidden=[_core.runtime_dir()], ipv6=True) as net:
        c = AgentCluster(net, tmp, hosts=[0, 1])
        try:
            yield c
        finally:
            c.close()


def test_ipv6_hosts_by_address(v6_cluster, capfd):
    """Agents serving on tcp://[fd13:...]:7000: the controller listens on its IPv6 interface
    towards them; calls, printed output, proc-to-proc calls across the two hosts and a proc's
    death work as over IPv4."""
    c = v6_cluster
    assert all(":" in c.net.hosts[i].addr for i in (0, 1))
    hm = xmesh.hosts([c.locator(0), c.locator(1)], key_file=c.key)
    assert hm.initialized.get(timeout=30) is True
    procs = hm.spawn_procs({"gpus": 2})
    try:
        w = procs.spawn("where", Where)
        assert list(w.where.call().get(timeout=60).values()) == ["node-a"] * 2 + ["node-b"] * 2
        pongers = procs.slice(hosts=1).spawn("pongers", Ponger)
        pingers = procs.slice(hosts=0).spawn("pingers", Pinger, pongers)
        got = pingers.ping_all.call(5).get(timeout=60)
        assert list(got.values()) == [["pong 5 from 0", "pong 5 from 1"]] * 2
        assert all(a.startswith(f"tcp://[{c.net.hosts[h].addr}]:7000/") for h, a in
                   zip([0, 0, 1, 1], procs.proc_addrs().values())), procs.proc_addrs()
        with pytest.raises(xmesh.SupervisionError, match="exited with code 3"):
            w.slice(hosts=1, gpus=0).die.call_one().get(timeout=60)
    finally:
        procs.stop().get()
    out = capfd.readouterr().out
    assert "on node-a" in out and "on node-b" in out, out


NAMED_PROGRAM = """
import socket, sys, xmesh
hm = xmesh.hosts({locators!r}, key_file={key!r})
procs = hm.spawn_procs({{"gpus": 1}})

class Where(xmesh.Actor):
    @xmesh.endpoint
    def where(self):
        return socket.gethostname()

print(sorted(procs.spawn("w", Where).where.call().get(timeout=60).values()), flush=True)
procs.stop().get()
"""


def test_ipv6_hosts_by_a_name_that_resolves_to_ipv6_only(v6_cluster):
    """A controller on the third namespace host, whose /etc/hosts names the other two by their
    IPv6 addresses only (ip netns exec mounts /etc/netns/NS/hosts there): `node-a:7000` works."""
    c = v6_cluster
    ctl = c.net.hosts[2]
    etc = f"/etc/netns/{ctl.netns}"
    os.makedirs(etc, exist_ok=True)
    try:
        with open(f"{etc}/hosts", "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{c.net.hosts[i].addr} {c.net.hosts[i].hostname}\n"
                                                      for i in (0, 1)))
        source = textwrap.dedent(NAMED_PROGRAM.format(locators=["node-a:7000", "node-b:7000"], key=c.key))
        env = dict(os.environ, XMESH_RUNTIME_DIR=os.path.join(c.tmp, "ctl-run"))
        r = subprocess.run(ctl.command([PYTHON, "-c", source]), env=env, capture_output=True, text=True,
                           timeout=100)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "['node-a', 'node-b']", r.stdout + r.stderr
    finally:
        subprocess.run(["rm", "-rf", etc], check=False)


@pytest.fixture(scope="module")
def v4_cluster():
    tmp = private_tmpdir("xmesh-reach-")
    with NetnsHosts(3, hidden=[_core.runtime_dir()]) as net:
        c = AgentCluster(net, tmp, hosts=[0, 1])
        try:
            yield c
        finally:
            c.close()


CONNECT_PROGRAM = """
import xmesh
from xmesh._runtime.process import get_runtime
hm = xmesh.hosts({locators!r}, key_file={key!r})
try:
    hm.initialized.get(timeout=60)
    print("CONNECTED", get_runtime().node.tcp_addr)
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""


def run_controller_on(c: AgentCluster, host: int, **env: str) -> subprocess.CompletedProcess:
    """CONNECT_PROGRAM run on namespace host `host` towards the agents of hosts 0 and 1."""
    source = textwrap.dedent(CONNECT_PROGRAM.format(locators=[c.locator(0), c.locator(1)], key=c.key))
    full_env = dict(os.environ, XMESH_RUNTIME_DIR=os.path.join(c.tmp, f"ctl-{host}"), **env)
    return subprocess.run(c.net.hosts[host].command([PYTHON, "-c", source]), env=full_env, capture_output=True,
                          text=True, timeout=100)


def test_a_controller_the_nodes_cannot_reach_is_told_which_way_failed(v4_cluster):
    """A controller whose machine takes no inbound connection (a laptop behind NAT, here a
    firewall): the agents receive its requests (their acknowledgements come back on its own
    connections) but cannot connect back; the error says that, not "is the agent running?".
    With XMESH_CONTROLLER_PORT the controller listens on the one port the firewall opens."""
    c = v4_cluster
    ctl = c.net.hosts[2]
    ctl.firewall([])
    try:
        out = run_controller_on(c, 2).stdout
        assert "received this controller's request but its answer did not come back" in out, out
        assert f"cannot connect to this controller at tcp://{ctl.addr}:" in out and "ERROR ConnectionError" in out
        ctl.open_firewall()
        ctl.firewall([7123])
        out = run_controller_on(c, 2, XMESH_CONTROLLER_PORT="7123").stdout
        assert out.strip() == f"CONNECTED tcp://{ctl.addr}:7123", out
        r = run_controller_on(c, 2, XMESH_CONTROLLER_PORT="port 7")
        assert r.returncode == 1 and "XMESH_CONTROLLER_PORT='port 7' is not a port (1-65535)" in r.stderr, r.stderr
    finally:
        ctl.open_firewall()
