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
