"""Hosts over TCP (issue 20), their links and what goes over them: a link cut for good or for
less than the timeout, ranks declared lost fenced when it heals, the debugger and `xmesh debug`
on remote ranks, remote output and logs read through the agents, agents restarted at their
address, TCP lanes to procs on their own ports and behind the agent's port, a normal stop that
says nothing of its lanes, and RDMA buffers streamed between hosts. Skipped, saying why, only
where namespaces cannot be made."""
import json
import os
import socket
import subprocess
import threading
import time

import pytest
from netns_hosts import unavailable
from xmesh_testing import run_program, wait_until

import xmesh

from actors_for_tests import Pinger, Ponger, WorkspaceUser
from tcp_cluster import Where, cluster, controller_program  # noqa: F401 (cluster: the fixture)

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"namespace hosts unavailable: {WHY_NOT}")


def test_a_link_cut_for_good_fails_that_hosts_ranks_others_go_on(cluster):
    hm = xmesh.hosts([cluster.locator(i) for i in range(3)], key_file=cluster.key)
    procs = hm.spawn_procs({"gpus": 1})
    a = procs.spawn("w", Where)
    a.where.call().get(timeout=60)
    cluster.net.hosts[0].cut()
    try:
        with pytest.raises(xmesh.SupervisionError) as e:
            a.slice(hosts=0).where.call_one().get(timeout=60)
        assert "node-a" in str(e.value) and cluster.net.hosts[0].addr in str(e.value), str(e.value)
        assert [v["host"] for v in a.slice(hosts=1).where.call().get(timeout=30).values()] == ["node-b"]
    finally:
        cluster.net.hosts[0].restore()
        procs.stop()


class Ticker(xmesh.Actor):
    """Prints a numbered tick every 0.1 s for `seconds`, from a thread (the endpoint returns)."""

    @xmesh.endpoint
    def start(self, seconds: float) -> None:
        def tick() -> None:
            for i in range(int(seconds * 10)):
                print(f"tick {i} on {socket.gethostname()}", flush=True)
                time.sleep(0.1)

        threading.Thread(target=tick, daemon=True).start()


def test_ranks_declared_lost_are_fenced_when_the_link_heals(cluster, capfd):
    """Invariant hosts.1 (docs/architecture/04-hosts-and-jobs.md):
    a host cut off past the timeout has its ranks declared lost; when the link heals,
    nothing they still send reaches the program, their output included (no split brain); the
    other host's ranks go on."""
    # node-a's agent here keeps a silent controller's procs past the test (as by default, 60 s,
    # longer than the controller's timeout): with the tests' 3 s it would stop them as the loss is
    # declared, and nothing would be left to fence.
    patient = cluster.start_agent(0, port=7004, env={"XMESH_ORPHAN_GRACE": "120"})
    hm = xmesh.hosts([cluster.locator(0, 7004), cluster.locator(1)], key_file=cluster.key)
    procs = hm.spawn_procs({"gpus": 1})
    try:
        t = procs.spawn("ticker", Ticker)
        t.start.call(25).get(timeout=60)
        assert wait_until(lambda: "on node-a" in capfd.readouterr().out, timeout=30)
        cluster.net.hosts[0].cut()
        try:
            with pytest.raises(xmesh.SupervisionError, match="node-a"):
                t.slice(hosts=0).start.call_one(0).get(timeout=60)
        finally:
            cluster.net.hosts[0].restore()
        before = capfd.readouterr()  # what came before the loss was declared
        seen = {"out": "", "err": before.err}  # the notice may come before that capture ended

        def notice_came() -> bool:
            got = capfd.readouterr()
            seen["out"] += got.out
            seen["err"] += got.err
            return "declared lost earlier" in seen["err"]

        # The link is made again (after a cut TCP's own connect retries may take seconds) and
        # node-a's agent forwards what its rank printed meanwhile: dropped, and said once.
        assert wait_until(notice_came, timeout=20), seen["err"] + seen["out"][-3000:] + "\nnode-a's agent:\n" + open(cluster.log("0-7004")).read()
        time.sleep(1)
        notice_came()
        assert "on node-b" in seen["out"], seen["out"]  # the other host goes on
        assert "on node-a" not in seen["out"], seen["out"]  # the lost rank is not heard again
        assert seen["err"].count("declared lost earlier") == 1, seen["err"]
    finally:
        procs.stop()
        patient.terminate()
        patient.wait(timeout=30)


def test_the_debugger_shows_remote_host_names_and_attaches_to_a_remote_rank(cluster, tmp_path):
    import pexpect

    prog = tmp_path / "dbg.py"
    prog.write_text(controller_program(cluster, [0, 1], """
        from actors_for_tests import Stopper
        s = hm.spawn_procs({"gpus": 2}).spawn("stopper", Stopper)
        s.initialized.get()
        print("values", list(s.step.call(10, stop_ranks=(3,), sleep=0.5).get().values()))
    """))
    term = pexpect.spawn("/usr/bin/python3", [str(prog)], env=dict(os.environ), encoding="utf-8", timeout=60,
                         dimensions=(50, 200))
    try:
        term.expect("xmesh_dbg> ")
        table = term.before
        assert "node-b" in table and "stopper" in table, table  # rank 3 runs on the second host
        term.sendline("attach stopper 3")
        term.expect(r"\[stopper 3\] \(Pdb\) ")
        term.sendline("p socket.gethostname() if 'socket' in dir() else __import__('socket').gethostname()")
        term.expect(r"\[stopper 3\] \(Pdb\) ")
        assert "node-b" in term.before
        term.sendline("p y")
        term.expect(r"\[stopper 3\] \(Pdb\) ")
        assert "23" in term.before
        term.sendline("continue")
        term.expect("values")
        term.expect(pexpect.EOF)
        assert "[20, 21, 22, 23]" in term.before
    finally:
        term.close(force=True)


def test_xmesh_debug_finds_a_controller_by_an_allocation_on_remote_hosts(cluster, tmp_path):
    """`xmesh debug NAME --host ... --key-file ...` on the controller's machine: the allocation is
    found on the agents elsewhere, the debugger of its controller here is driven."""
    import pexpect

    go = str(tmp_path / "go")
    prog = tmp_path / "prog.py"
    prog.write_text(controller_program(cluster, [1], f"""
        from actors_for_tests import Stopper
        procs = hm.spawn_procs({{"gpus": 2}}, name="dbg-tcp")
        s = procs.spawn("stopper", Stopper)
        s.initialized.get()
        print("READY", flush=True)
        import time
        while not os.path.exists({go!r}):
            time.sleep(0.05)
        print("RESULT", sorted(s.step.call(5, stop_ranks=(1,)).get().values()), flush=True)
        procs.stop()
    """))
    p = subprocess.Popen(["/usr/bin/python3", str(prog)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "READY"
        client = pexpect.spawn("/usr/bin/python3", ["-m", "xmesh.cli", "debug", "dbg-tcp", "--host", cluster.locator(1),
                                                    "--key-file", cluster.key],
                               env=dict(os.environ), encoding="utf-8", timeout=60, dimensions=(50, 200))
        client.expect("xmesh_dbg> ")
        open(go, "w").close()
        client.expect(r"\[xmesh\] stopped in pdb:")
        client.expect("xmesh_dbg> ")
        assert "node-b" in client.before, client.before
        client.sendline("c")
        client.expect("continued 1 session")
        out, _ = p.communicate(timeout=60)
        assert "RESULT [10, 11]" in out, out
        client.close()
    finally:
        p.kill()
        p.wait()


def test_proc_output_reaches_the_controller_with_its_rank(cluster):
    prog = controller_program(cluster, [1, 2], """
        a = hm.spawn_procs({"gpus": 1}).spawn("w", Where)
        a.echo.call("from-afar").get()
        print("done", flush=True)
    """)
    r = run_program(prog, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = (r.stdout + r.stderr).splitlines()
    # The mesh spans two hosts: each line's prefix names its rank's host.
    assert any("echo from-afar" in line and "[0@node-b]" in line for line in lines), lines
    assert any("echo from-afar" in line and "[1@node-c]" in line for line in lines), lines


class Sequence(xmesh.Actor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @xmesh.endpoint
    def take(self, i: int) -> int:
        self.seen.append(i)
        return i

    @xmesh.endpoint
    def taken(self) -> list[int]:
        return self.seen


def test_a_link_cut_shorter_than_the_timeout_loses_and_duplicates_nothing(cluster):
    """The cut outlasts the links' heartbeat timeout (XMESH_LINK_TIMEOUT_MS, 600 ms under the
    tests), so ZeroMQ drops the TCP connections and what they held: it is sent again after they
    are made again, once and in order, within the hosts' grace (XMESH_HOSTD_TIMEOUT_MS, 3 s);
    calls that travel on TCP lanes are retransmitted by the kernel, or sent again the same way
    if their lane breaks."""
    from xmesh._runtime.process import get_runtime

    assert int(os.environ.get("XMESH_LINK_TIMEOUT_MS", "3000")) < 1200 < int(os.environ["XMESH_HOSTD_TIMEOUT_MS"])
    hm = xmesh.hosts([cluster.locator(i) for i in range(3)], key_file=cluster.key)
    procs = hm.spawn_procs({"gpus": 1})
    try:
        a = procs.spawn("seq", Sequence)
        a.initialized.get(timeout=60)
        before = get_runtime().node.stats()
        host = cluster.net.hosts[0]
        timer = threading.Timer(0.3, host.cut)
        restore = threading.Timer(1.5, host.restore)  # down for 1.2 s
        timer.start()
        restore.start()
        futures = []
        for i in range(200):  # over about 2 s: before, during and after the cut
            futures.append(a.take.call(i))
            time.sleep(0.01)
        timer.join()
        restore.join()
        for i, f in enumerate(futures):
            assert list(f.get(timeout=30).values()) == [i, i, i]
        # Every actor took every message once, in order, the cut host's included.
        assert [list(s) for s in a.taken.call().get(timeout=30).values()] == [list(range(200))] * 3
        after = get_runtime().node.stats()
        # The calls to node-a rode the cut out: over its TCP lane (plain TCP, retransmitted by
        # the kernel) or, when a lane broke or ZeroMQ made a connection again, sent again from
        # what the link kept (test_resend.cpp covers both mechanisms one by one).
        assert after.lane_sent > before.lane_sent or after.resent > before.resent, (after.lane_sent, after.resent)
        assert after.gaps == before.gaps
    finally:
        cluster.net.hosts[0].restore()
        procs.stop()


def test_logs_of_remote_procs_are_read_through_their_agents(cluster):
    hm = xmesh.hosts([cluster.locator(0), cluster.locator(2)], key_file=cluster.key)
    procs = hm.spawn_procs({"gpus": 2})
    try:
        a = procs.spawn("w", Where)
        a.echo.call("first").get(timeout=60)
        a.slice(hosts=1).echo.call("x" * 300_000).get(timeout=60)  # a long line, in pieces on disk
        wait_until(lambda: len([r for r in procs.logs() if "echo" in r.text]) == 6, 15)
        records = procs.logs(grep="echo")
        assert sorted((r.rank, r.host) for r in records if r.text == "echo first") == \
            [(0, "node-a"), (1, "node-a"), (2, "node-c"), (3, "node-c")]
        long_lines = [r for r in records if r.text.startswith("echo xxx")]
        assert sorted(r.rank for r in long_lines) == [2, 3] and all(len(r.text) == 300_005 for r in long_lines)
        # The files are kept by the hosts' agents (in their runtime directories), not here.
        assert any(f == "rank3.log" for _, _, fs in os.walk(cluster.rundir(2)) for f in fs)
        assert not any(f == "rank3.log" for _, _, fs in os.walk(cluster.rundir(0)) for f in fs)
        assert [r.rank for r in procs.logs(rank=3, grep="first")] == [3]
    finally:
        procs.stop()


def test_a_log_read_outside_the_log_directories_is_refused(cluster):
    from xmesh._runtime.agents import HostdError, agent
    from xmesh._runtime.process import Kind, get_runtime
    from xmesh._runtime.wait import request

    xmesh.hosts([cluster.locator(0)], key_file=cluster.key)
    a = agent(f"tcp://{cluster.locator(0)}")
    with pytest.raises(ValueError, match="'dir' must name a log directory"):  # said before sending
        a.log_reader("..")("", 0, 0)
    # The agent checks too, whatever a peer sends.
    for body, why in (({"dir": ".."}, "'dir' must name a log directory"),
                      ({"dir": "x", "file": "../../hostd.cookie"}, "'file' must be a file name"),
                      ({"dir": "x", "file": "hostd.cookie"}, "not a log file"),
                      ({"dir": "x", "offset": -1, "file": "rank0.log"}, "'offset' is negative")):
        ok, reply, _ = request(get_runtime().node, [a.addr], Kind.ReadLog, body, timeout=15,
                               description="a bad log read")[0]
        assert not ok and why in reply["text"], (body, reply)
    with pytest.raises(HostdError, match="no log directory 'nowhere' on node-a"):
        a.log_reader("nowhere")("", 0, 0)


def test_xmesh_logs_reads_remote_hosts_through_their_agents(cluster):
    hm = xmesh.hosts([cluster.locator(0), cluster.locator(1)], key_file=cluster.key)
    procs = hm.spawn_procs({"gpus": 1}, name="tcp-logs")
    try:
        a = procs.spawn("w", Where)
        a.echo.call("via-cli").get(timeout=60)
        wait_until(lambda: len(procs.logs(grep="via-cli")) == 2, 15)
        cmd = ["/usr/bin/python3", "-m", "xmesh.cli", "logs", "tcp-logs", "--json", "--grep", "via-cli",
               "--host", cluster.locator(0), "--host", cluster.locator(1), "--key-file", cluster.key]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        got = sorted((rec["rank"], rec["host"], rec["text"]) for rec in map(json.loads, r.stdout.splitlines()))
        assert got == [(0, "node-a", "echo via-cli"), (1, "node-b", "echo via-cli")]
        r = subprocess.run(cmd[:4] + ["nothing-such"] + cmd[5:], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "no logs of an allocation named 'nothing-such'" in r.stderr
        # ls and status reach the same agents.
        hosts = ["--host", cluster.locator(0), "--host", cluster.locator(1), "--key-file", cluster.key]
        r = subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "ls", "--json", *hosts], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        (row,) = [a for a in json.loads(r.stdout) if a["name"] == "tcp-logs"]
        assert row["hosts"] == ["node-a", "node-b"] and row["procs_alive"] == 2
        r = subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "status", *hosts], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "on node-a" in r.stdout and "on node-b" in r.stdout and r.stdout.count("tcp-logs") == 2
        assert r.stdout.count("lanes handed to procs") == 2, r.stdout  # what each agent's port did
        # sync from another machine's command line: the workspace reaches both hosts' procs.
        src = os.path.join(cluster.tmp, "cli-space")
        os.makedirs(src, exist_ok=True)
        with open(os.path.join(src, "xm_cli_synced.py"), "w") as f:
            f.write("def value():\n    return 'synced by the command line'\n")
        r = subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "sync", "tcp-logs", src, *hosts],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "-> 2 hosts: 1 added" in r.stdout, r.stdout + r.stderr
        assert "node-a [tcp-logs]" in r.stdout and "node-b [tcp-logs]" in r.stdout, r.stdout
        users = procs.spawn("users", WorkspaceUser, "xm_cli_synced")
        assert list(users.value.call().get(timeout=60).values()) == ["synced by the command line"] * 2
        # stop from another machine's command line: the procs end.
        r = subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "stop", "tcp-logs", *hosts], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and "stopping tcp-logs" in r.stdout, r.stderr
        wait_until(lambda: not [a for a in xmesh.allocations([f"tcp://{cluster.locator(0)}"])
                                if a["name"] == "tcp-logs"], 20)
    finally:
        procs.stop()


def test_an_agent_restarted_at_its_address_is_known_at_once_and_used(cluster):
    hm = xmesh.hosts([cluster.locator(2)], key_file=cluster.key)
    procs = hm.spawn_procs({"gpus": 1})
    a = procs.spawn("w", Where)
    a.where.call().get(timeout=60)
    cluster.agents[2].kill()
    cluster.agents[2].wait(timeout=10)
    cluster.start_agent(2)
    # Its new process answers the heartbeats: the old one is lost for that reason, not for silence.
    with pytest.raises(xmesh.SupervisionError) as e:
        a.where.call_one().get(timeout=60)
    assert "restarted" in str(e.value), str(e.value)
    # And new work goes to the new agent.
    again = xmesh.hosts([cluster.locator(2)], key_file=cluster.key).spawn_procs({"gpus": 1})
    try:
        assert again.spawn("w2", Where).where.call_one().get(timeout=60)["host"] == "node-c"
    finally:
        again.stop()


def test_an_agent_let_go_and_started_again_at_its_address_is_used_anew(cluster):
    """A job's release lets its agents go (their address marked dead with why, as SLURM and SSH
    jobs do); a later agent at the same address (a port the system hands out again) is connected
    to anew, not refused with the old agent's end."""
    from xmesh._runtime.agents import release_agent

    locator = cluster.locator(1)
    procs = xmesh.hosts([locator], key_file=cluster.key).spawn_procs({"gpus": 1})
    a = procs.spawn("w", Where)
    a.where.call().get(timeout=60)
    release_agent(f"tcp://{locator}", "the test's job was released")
    with pytest.raises(xmesh.SupervisionError, match="the test's job was released"):
        a.where.call_one().get(timeout=30)
    cluster.agents[1].kill()
    cluster.agents[1].wait(timeout=10)
    cluster.start_agent(1)
    again = xmesh.hosts([locator], key_file=cluster.key).spawn_procs({"gpus": 1})
    try:
        assert again.spawn("w2", Where).where.call_one().get(timeout=60)["host"] == "node-b"
    finally:
        again.stop()


def test_calls_to_procs_on_their_own_ports_go_over_tcp_lanes_both_ways(cluster):
    """Procs listening on ports of --ports take a second one there for their TCP lanes
    (docs/architecture/03-transport-and-links.md, "TCP lanes between hosts"): calls go to them over lanes and their answers come back
    over the controller's; the range keeps a port for each proc's own address first."""
    from xmesh._runtime.process import get_runtime

    cluster.start_agent(0, "--ports", "7700-7703", port=7002)
    hm = xmesh.hosts([cluster.locator(0, 7002)], key_file=cluster.key)
    procs = hm.spawn_procs({"gpus": 2})
    try:
        ports = sorted(int(a.rsplit(":", 1)[1]) for a in procs.proc_addrs().values())
        assert ports == [7700, 7701]  # their lanes listen on 7703 and 7702
        a = procs.spawn("w", Where)
        before = get_runtime().node.stats()
        for _ in range(50):
            assert [v["host"] for v in a.where.call().get(timeout=60).values()] == ["node-a", "node-a"]
        after = get_runtime().node.stats()
        assert after.lanes_out >= 2, after.lanes_out
        assert after.lane_sent - before.lane_sent >= 90  # nearly all 100 calls (the first ones ask)
        assert after.lane_received - before.lane_received >= 90  # and their answers
        assert after.lane_breaks == before.lane_breaks
    finally:
        procs.stop()


def test_calls_to_procs_behind_their_agents_port_go_over_lanes_through_it(cluster):
    """A proc behind its agent's one port listens for lanes on a loopback port of its own that
    the agent's PortMux lets through (SOCKS5, as for its ZeroMQ link): calls reach it over a
    lane too, through the agent's port and nothing else. The agent hands each lane's connection
    to its proc (SCM_RIGHTS) rather than relay its bytes."""
    from xmesh._runtime.agents import agent
    from xmesh._runtime.process import get_runtime

    procs = xmesh.hosts([cluster.locator(1)], key_file=cluster.key).spawn_procs({"gpus": 2})
    try:
        assert all("/" in a.split("://", 1)[1] for a in procs.proc_addrs().values())  # relayed
        port_before = agent(f"tcp://{cluster.locator(1)}").status().port
        a = procs.spawn("w", Where)
        before = get_runtime().node.stats()
        for _ in range(50):
            assert [v["host"] for v in a.where.call().get(timeout=60).values()] == ["node-b", "node-b"]
        after = get_runtime().node.stats()
        assert after.lane_sent - before.lane_sent >= 90, (before.lane_sent, after.lane_sent)
        assert after.lane_received - before.lane_received >= 90
        assert after.lane_breaks == before.lane_breaks
        port_after = agent(f"tcp://{cluster.locator(1)}").status().port
        assert port_after.lanes_handed_over - port_before.lanes_handed_over == 2, (port_before, port_after)
    finally:
        procs.stop()


class Exiter(xmesh.Actor):
    @xmesh.endpoint
    def ping(self) -> int:
        return os.getpid()

    @xmesh.endpoint
    def exit_soon(self) -> None:
        threading.Timer(0.05, os._exit, args=(3,)).start()


def test_a_proc_that_ends_is_reported_once_not_as_a_broken_lane(cluster, capfd):
    """A proc behind its agent's port ends while its lane carries calls: its callers hear that it
    ended (supervision), and its lane's break, which comes first, is not reported besides."""
    from xmesh._runtime.process import get_runtime

    procs = xmesh.hosts([cluster.locator(1)], key_file=cluster.key).spawn_procs({"gpus": 1})
    try:
        e = procs.spawn("e", Exiter)
        for _ in range(30):
            e.ping.call_one().get(timeout=60)
        assert get_runtime().node.stats().lanes_out >= 1
        capfd.readouterr()
        e.exit_soon.call_one().get(timeout=60)
        with pytest.raises(xmesh.SupervisionError):
            for _ in range(10000):
                e.ping.call_one().get(timeout=60)
        time.sleep(2.5)  # past the lane note's grace
        got = capfd.readouterr()
        assert "given up" not in got.out + got.err, got.out + got.err
    finally:
        procs.stop()


@pytest.mark.parametrize("how", ["stop", "by their agents"])
def test_a_normal_stop_says_nothing_of_the_lanes_it_ends(cluster, capfd, how):
    """Procs on two hosts with TCP lanes up both ways, to the controller and to each other: a
    normal stop, by their mesh or by their agents, ends their lanes with them, and nobody
    reports that as a lane given up (issue 45: every stop printed 1-3 such lines)."""
    from xmesh._runtime.agents import agent
    from xmesh._runtime.process import get_runtime

    hm = xmesh.hosts([cluster.locator(0), cluster.locator(1)], key_file=cluster.key)
    procs = hm.spawn_procs({"gpus": 2})
    a = procs.spawn("w", Where)
    for _ in range(30):
        a.where.call().get(timeout=60)
    pongers = procs.slice(hosts=1).spawn("pongers", Ponger)
    pingers = procs.slice(hosts=0).spawn("pingers", Pinger, pongers)
    for _ in range(10):
        pingers.ping_all.call(5).get(timeout=60)
    assert get_runtime().node.stats().lanes_out >= 4
    capfd.readouterr()
    if how == "stop":
        procs.stop().get(timeout=60)
    else:  # as `xmesh stop`, a job's kill() or another controller would: the agents stop them
        for h in (0, 1):
            agent(f"tcp://{cluster.locator(h)}").stop_procs(alloc=procs.allocation.id)
    time.sleep(3)  # what would come late
    got = capfd.readouterr()
    assert "given up" not in got.out + got.err, got.out + got.err


def test_rdma_buffers_stream_between_hosts(cluster):
    """RDMA buffers across namespace hosts (issue 24): the controller's memory read and written
    by procs on two hosts, one host's memory read and written by the other's procs and by the
    controller, over sealed TCP streams (not cross-memory attach: the hosts differ)."""
    from actors_for_tests import BufferPeer, crc, make_memory
    from xmesh.rdma import RDMABuffer, _plane

    hm = xmesh.hosts([cluster.locator(0), cluster.locator(1)], key_file=cluster.key)
    procs = hm.spawn_procs({"gpus": 1})
    before = _plane.transfers().stats()
    try:
        peers = procs.spawn("peers", BufferPeer)
        n = (24 << 20) + 5
        mine = make_memory("numpy", n, 50)
        buf = RDMABuffer(mine)
        assert list(peers.read.call(buf, "torch").get(timeout=60).values()) == [crc(mine)] * 2
        assert peers.slice(hosts=1).write.call_one(buf, "numpy", n, 51).get(timeout=60) == crc(mine)
        theirs = peers.slice(hosts=0).lend.call_one("a", "bytearray", 3 << 20, 52).get()
        assert peers.slice(hosts=1).read.call_one(theirs, "numpy").get(timeout=60) == crc(make_memory("numpy", 3 << 20, 52))
        written = peers.slice(hosts=1).write.call_one(theirs, "numpy", 1 << 20, 53).get(timeout=60)
        dst = bytearray(3 << 20)
        theirs.read_into(dst).get(timeout=60)
        assert crc(dst[: 1 << 20]) == written
        assert dst[1 << 20:] == make_memory("bytearray", 3 << 20, 52)[1 << 20:]
        stats = _plane.transfers().stats()
        assert stats.streamed - before.streamed == 1 and stats.same_host == before.same_host
        peers.slice(hosts=0).drop.call_one("a").get()
        buf.drop()
    finally:
        procs.stop()

