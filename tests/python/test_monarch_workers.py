"""Monarch's manual bootstrap and ProcessJob on xmesh (issue 44): `run_worker_loop_forever(address)`
makes a process a host agent, `attach_to_workers(workers=[...])` a HostMesh of them (ipc:// on this
machine, tcp:// with xmesh's key file), and `monarch.job.ProcessJob` hosts of its own on this
machine; bad addresses and missing keys are refused naming the problem."""
import os
import socket
import subprocess
import sys
import time

import pytest

import monarch.actor
from monarch.actor import Actor, attach_to_workers, endpoint
from xmesh import _core
from xmesh._runtime.process import report_fault

# These tests kill the agents they started: say such losses, do not stop pytest (the shim's default).
monarch.actor.unhandled_fault_hook = report_fault


class WhereAmI(Actor):
    @endpoint
    def where(self) -> tuple:
        return os.environ.get("XMESH_HOSTD_PID"), os.environ.get("XMESH_TEST_MARK")


def _worker(address: str, ca: str = "trust_all_connections") -> subprocess.Popen:
    code = f"from monarch.actor import run_worker_loop_forever; run_worker_loop_forever({address!r}, ca={ca!r})"
    return subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ), start_new_session=True)


def _stop(procs: "list[subprocess.Popen]") -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_workers_on_this_machine_make_a_host_mesh(tmp_path):
    workers = [f"ipc://{tmp_path}/w{i}" for i in range(2)]
    procs = [_worker(w) for w in workers]
    try:
        hosts = attach_to_workers(workers=workers, ca="trust_all_connections")
        assert dict(hosts.extent) == {"hosts": 2}
        where = hosts.spawn_procs({"gpus": 1}).spawn("where", WhereAmI).where.call().get(timeout=60)
        agents = {pid for pid, _ in where.values()}
        assert agents == {str(p.pid) for p in procs}  # each worker process is the agent of its host
    finally:
        _stop(procs)


def test_a_worker_over_tcp_needs_the_key_and_serves_with_it(tmp_path):
    address = f"tcp://127.0.0.1:{_free_port()}"
    with pytest.raises(ValueError, match="always encrypts and authenticates with a shared key file"):
        env_key = os.environ.pop("XMESH_KEY_FILE", None)
        try:
            attach_to_workers(workers=[address], ca="trust_all_connections")
        finally:
            if env_key is not None:
                os.environ["XMESH_KEY_FILE"] = env_key
    key = str(tmp_path / "cluster.key")
    _core.write_new_key_file(key)
    procs = [_worker(address, ca=key)]
    try:
        hosts = attach_to_workers(workers=[address], ca=key)
        where = hosts.spawn_procs({"gpus": 1}).spawn("where", WhereAmI).where.call_one().get(timeout=60)
        assert where[0] == str(procs[0].pid)
    finally:
        _stop(procs)


def test_attach_refuses_bad_addresses_and_absent_workers(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="worker address 'http://x:1': xmesh's workers are tcp://HOST:PORT or ipc"):
        attach_to_workers(workers=["http://x:1"])
    with pytest.raises(TypeError, match="non-empty list of worker addresses"):
        attach_to_workers(workers="ipc:///tmp/x")
    import monarch._workers as workers_module

    monkeypatch.setattr(workers_module, "WORKER_WAIT_S", 0.5)
    absent = f"ipc://{tmp_path}/nobody"
    with pytest.raises(RuntimeError, match=f"attach failed: no worker serves {absent}"):
        attach_to_workers(workers=[absent])


def test_process_job_gives_hosts_of_their_own_and_kill_stops_them():
    from monarch.job import ProcessJob

    job = ProcessJob({"trainers": 2, "loaders": 1}, env={"XMESH_TEST_MARK": "from the job"})
    try:
        state = job.state(cached_path=None)
        assert dict(state.trainers.extent) == {"hosts": 2} and dict(state.loaders.extent) == {"hosts": 1}
        where = state.trainers.spawn_procs({"gpus": 1}).spawn("where", WhereAmI).where.call().get(timeout=60)
        assert len({pid for pid, _ in where.values()}) == 2  # two agents, one per host
        assert {mark for _, mark in where.values()} == {"from the job"}
        loader_pid = state.loaders.spawn_procs().spawn("where", WhereAmI).where.call_one().get(timeout=60)[0]
        assert loader_pid not in {pid for pid, _ in where.values()}
        assert job.active and job.can_run(ProcessJob({"trainers": 2, "loaders": 1},
                                                     env={"XMESH_TEST_MARK": "from the job"}))
        pids = list(job._pids)
    finally:
        job.kill()
    assert not job.active
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)
    with pytest.raises(ValueError, match="meshes must map mesh names to numbers of hosts"):
        ProcessJob({"trainers": 0})
