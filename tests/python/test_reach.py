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
        out = run_controller_on(c, 2, XMESH_CONTROLLER_REACH="inbound").stdout
        assert "received this controller's request but its answer did not come back" in out, out
        assert f"cannot connect to this controller at tcp://{ctl.addr}:" in out and "ERROR ConnectionError" in out
        ctl.open_firewall()
        ctl.firewall([7123])
        out = run_controller_on(c, 2, XMESH_CONTROLLER_PORT="7123", XMESH_CONTROLLER_REACH="inbound").stdout
        assert out.strip() == f"CONNECTED tcp://{ctl.addr}:7123", out
        r = run_controller_on(c, 2, XMESH_CONTROLLER_PORT="port 7")
        assert r.returncode == 1 and "XMESH_CONTROLLER_PORT='port 7' is not a port (1-65535)" in r.stderr, r.stderr
    finally:
        ctl.open_firewall()


OUTBOUND_PROGRAM = """
import os, socket, sys, xmesh
{prelude}
from xmesh._runtime.process import get_runtime
sys.path.insert(0, {workspace!r})
hm = xmesh.hosts({locators!r}, key_file={key!r}{reach})
hm.initialized.get(timeout=60)
procs = hm.spawn_procs({{"gpus": 2}})

class Where(xmesh.Actor):
    @xmesh.endpoint
    def where(self):
        print("printed on", socket.gethostname(), flush=True)
        return socket.gethostname()

    @xmesh.endpoint
    def echo(self, data):
        return data

    @xmesh.endpoint
    def synced(self):
        import synced_module
        return synced_module.VALUE

w = procs.spawn("w", Where)
print("WHERE", sorted(w.where.call().get(timeout=60).values()), flush=True)
blob = os.urandom(1 << 20)
for _ in range(300):  # enough for lanes to come up both ways and carry the rest
    assert w.slice(hosts=1, gpus=1).echo.call_one(b"x").get(timeout=60) == b"x"
assert all(v == blob for v in w.echo.call(blob).get(timeout=60).values())
from actors_for_tests import Pinger, Ponger
pongers = procs.slice(hosts=1).spawn("pongers", Ponger)
pingers = procs.slice(hosts=0).spawn("pingers", Pinger, pongers)
print("PING", list(pingers.ping_all.call(5).get(timeout=60).values()), flush=True)
from actors_for_tests import BufferPeer, crc, make_memory
from xmesh.rdma import RDMABuffer
peers = procs.spawn("peers", BufferPeer)
mine = make_memory("bytearray", 3 << 20, 5)  # the controller's memory, streamed to procs elsewhere
print("READ_MINE", set(peers.read.call(RDMABuffer(mine), "bytearray").get(timeout=60).values()) == {{crc(mine)}},
      flush=True)
theirs = peers.slice(hosts=1, gpus=1).lend.call_one("b", "bytearray", 2 << 20, 7).get(timeout=60)
got = make_memory("bytearray", 2 << 20, 0)
theirs.read_into(got).get(timeout=60)  # a proc's memory, streamed to the controller
print("READ_THEIRS", crc(got) == crc(make_memory("bytearray", 2 << 20, 7)), flush=True)
hm.sync_workspace({workspace!r}, auto_reload=True)
print("SYNCED", sorted(w.synced.call().get(timeout=60).values()), flush=True)
node = get_runtime().node
stats = node.stats()
print("REACHES_BACK", node.reaches_back, flush=True)
print("BACK", node.back_stats(), flush=True)
print("LANES", stats.lanes_in > 0, stats.lanes_out > 0, flush=True)
{epilogue}
procs.stop().get(timeout=60)
print("DONE", flush=True)
"""


def run_outbound(c: AgentCluster, tmp: str, reach: str = "", prelude: str = "", options: str = "",
                 epilogue: str = "", **env: str) -> subprocess.CompletedProcess:
    workspace = os.path.join(tmp, f"ws-{reach or options or 'auto'}".replace("'", "").replace(" ", ""))
    os.makedirs(workspace, exist_ok=True)
    with open(os.path.join(workspace, "synced_module.py"), "w") as f:
        f.write("VALUE = 'synced'\n")
    source = textwrap.dedent(OUTBOUND_PROGRAM.format(
        locators=[c.locator(0), c.locator(1)], key=c.key, workspace=workspace, prelude=prelude, epilogue=epilogue,
        reach=f", reach={reach!r}" if reach else options))
    full_env = dict(os.environ, XMESH_RUNTIME_DIR=os.path.join(c.tmp, f"ctl-out-{os.path.basename(workspace)}"),
                    PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]), **env)
    return subprocess.run(c.net.hosts[2].command([PYTHON, "-c", source]), env=full_env, capture_output=True,
                          text=True, timeout=110)


def check_outbound_run(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0 and "DONE" in r.stdout, r.stdout + r.stderr
    assert "WHERE ['node-a', 'node-a', 'node-b', 'node-b']" in r.stdout, r.stdout
    assert r.stdout.count("printed on node-") == 4 or r.stderr.count("printed on node-") == 4, r.stdout + r.stderr
    assert "PING [['pong 5 from 0', 'pong 5 from 1'], ['pong 5 from 0', 'pong 5 from 1']]" in r.stdout, r.stdout
    assert "SYNCED ['synced', 'synced', 'synced', 'synced']" in r.stdout, r.stdout
    assert "READ_MINE True" in r.stdout and "READ_THEIRS True" in r.stdout, r.stdout
    assert "REACHES_BACK True" in r.stdout
    assert "LANES True True" in r.stdout, r.stdout  # the fast path both ways, over connections it opened


def test_a_controller_the_nodes_cannot_connect_to_works_through_connections_it_opens(v4_cluster):
    """Invariant transport.4 (docs/architecture/03-transport-and-links.md): a laptop behind NAT
    (a namespace whose firewall drops every inbound connection): in the
    automatic mode the controller finds its agents' answers cannot come back, says so once, and
    goes on through connections it opens to their ports: calls both ways with their output,
    procs calling each other across hosts, a megabyte each way, the data plane both ways (procs
    stream the controller's memory over connections it opened), a workspace synced and reloaded,
    TCP lanes both ways. reach="outbound" does the same without the probe."""
    c = v4_cluster
    ctl = c.net.hosts[2]
    tmp = private_tmpdir("xmesh-outbound-")
    ctl.firewall([])
    try:
        auto = run_outbound(c, tmp)
        check_outbound_run(auto)
        assert auto.stderr.count("cannot connect to this controller at") == 1, auto.stderr
        assert "it is reached through connections this controller opens (reach='outbound'" in auto.stderr
        explicit = run_outbound(c, tmp, reach="outbound")
        check_outbound_run(explicit)
        assert "cannot connect to this controller" not in explicit.stderr, explicit.stderr
        by_env = run_controller_on(c, 2, XMESH_CONTROLLER_REACH="outbound")
        assert by_env.stdout.startswith("CONNECTED"), by_env.stdout + by_env.stderr
        bad = run_controller_on(c, 2, XMESH_CONTROLLER_REACH="sideways")
        assert "XMESH_CONTROLLER_REACH='sideways': use one of auto, inbound, outbound" in bad.stdout + bad.stderr
    finally:
        ctl.open_firewall()


# `ssh -L 17000:node-a:7000` in the controller's namespace: a plain TCP forward.
FORWARD_PRELUDE = """
from test_tcp_links import Relay
forward = Relay(7000, target_host={gateway_host!r}, port=17000)
"""

# `xmesh status` from the same machine, through the same forward.
CLI_EPILOGUE = """
import subprocess
cli = subprocess.run([sys.executable, "-m", "xmesh.cli", "status", "--host", {host!r}, "--gateway", "localhost:17000",
                      "--key-file", {key!r}], capture_output=True, text=True, timeout=60)
print("CLI", cli.returncode, "on node-b" in cli.stdout, "relayed to other agents" in cli.stdout, cli.stdout,
      cli.stderr.strip()[-300:], flush=True)
"""


def test_a_controller_outside_the_cluster_reaches_every_host_through_one_forwarded_port(v4_cluster):
    """Invariant transport.4 (docs/architecture/03-transport-and-links.md): the controller's
    network reaches node-a's agent port only, through a forward on its own loopback (as `ssh -L
    17000:node-a:7000`), node-b drops every connection from it, and nothing can connect to the
    controller: with gateway="localhost:17000" every connection it opens goes through node-a's
    agent, which lets it through to node-b's port only once told over its authenticated link;
    calls, output, procs across the hosts, sync, lanes and the data plane all work, and `xmesh
    status --host node-b:7000 --gateway localhost:17000` from the same machine."""
    c = v4_cluster
    ctl, a, b = c.net.hosts[2], c.net.hosts[0], c.net.hosts[1]
    tmp = private_tmpdir("xmesh-gateway-")
    ctl.firewall([])
    b.firewall([], only_from=[ctl.addr])
    try:
        r = run_outbound(c, tmp, prelude=FORWARD_PRELUDE.format(gateway_host=a.addr),
                         options=", gateway='localhost:17000'",
                         epilogue=CLI_EPILOGUE.format(host=c.locator(1), key=c.key))
        check_outbound_run(r)
        assert "CLI 0 True True" in r.stdout, r.stdout  # the command line through the gateway too
        assert "cannot connect to this controller" not in r.stderr, r.stderr  # outbound from the start
    finally:
        b.open_firewall()
        ctl.open_firewall()


def test_reach_and_gateway_arguments_are_checked_before_anything_connects():
    """A reach= or gateway= that does not read is refused naming it, before any connection."""
    with pytest.raises(ValueError, match="reach='sideways': use one of auto, inbound, outbound"):
        xmesh.hosts(["127.0.0.1:7999"], key_file="/nonexistent.key", reach="sideways")
    with pytest.raises(ValueError, match="gateway='no port': give the host:port of a host agent"):
        xmesh.hosts(["127.0.0.1:7999"], key_file="/nonexistent.key", gateway="no port")
    with pytest.raises(ValueError, match="a gateway is for hosts over TCP"):
        xmesh.hosts([private_tmpdir("xmesh-local-")], gateway="127.0.0.1:7999")
    from xmesh._runtime.agents import controller_reach
    assert controller_reach() == os.environ.get("XMESH_CONTROLLER_REACH", "auto")  # nothing set by a refused call
