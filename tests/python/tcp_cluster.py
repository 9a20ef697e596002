"""What the tests of hosts over TCP share (test_tcp_hosts*.py): a module's cluster of three
namespace hosts, each with its host agent and the cluster's key; an actor saying where it runs;
and controller programs run against the cluster."""
import os
import socket
import textwrap
import time

import pytest
from netns_hosts import AgentCluster, NetnsHosts
from xmesh_testing import private_tmpdir

import xmesh
from xmesh import _core


@pytest.fixture(scope="module")
def cluster():
    tmp = private_tmpdir("xmesh-tcp-")
    # The namespace hosts do not see this process's runtime directory (its unix sockets), as
    # other machines would not.
    with NetnsHosts(3, hidden=[_core.runtime_dir()]) as net:
        c = AgentCluster(net, tmp)
        try:
            yield c
        finally:
            c.close()


class Where(xmesh.Actor):
    @xmesh.endpoint
    def where(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "rank": xmesh.context().actor_instance.rank.rank}

    @xmesh.endpoint
    def echo(self, value):
        print(f"echo {value}")
        return value

    @xmesh.endpoint
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)


def controller_program(cluster: AgentCluster, hosts: list[int], body: str, key: str = "") -> str:
    """A controller program whose `hm` is a HostMesh of these namespace hosts (the cluster's key
    unless another is given), with this file's actors importable, then body."""
    locators = [cluster.locator(i) for i in hosts]
    return textwrap.dedent(f"""
        import os, sys, xmesh
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from tcp_cluster import Where
        hm = xmesh.hosts({locators!r}, key_file={key or cluster.key!r})
    """) + textwrap.dedent(body)
