"""Jobs on real schedulers (issue 21): a SLURM cluster on this machine (slurm_cluster.py:
munged, slurmctld, a slurmd in each of two namespace hosts), driven with SLURM's own commands.
Skipped, saying why, only where it cannot run (not root, the packages missing)."""
import json
import os
import socket
import subprocess
import textwrap
import threading
import time

import pytest
from netns_hosts import NetnsHosts
from netns_hosts import unavailable as netns_unavailable
from slurm_cluster import SlurmCluster
from slurm_cluster import unavailable as slurm_unavailable
from ssh_hosts import SshHosts
from ssh_hosts import unavailable as ssh_unavailable
from xmesh_testing import private_tmpdir, run_program

import xmesh

WHY_NOT = netns_unavailable() or slurm_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"a SLURM cluster cannot run here: {WHY_NOT}")


CLI = ["/usr/bin/python3", "-m", "xmesh.cli"]
# One state directory (so one key file) for every job here: a controller authenticates with one.
STATE = private_tmpdir("xmesh-jobs-state-")


@pytest.fixture(scope="module")
def net():
    with NetnsHosts(2) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def ssh_hosts(net):
    if ssh_unavailable():
        pytest.skip(f"SSH hosts cannot run here: {ssh_unavailable()}")
    with SshHosts(net, private_tmpdir("xmesh-ssh-")) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def slurm(net):
    tmp = private_tmpdir("xmesh-slurm-")
    with SlurmCluster(net, tmp) as cluster:
        os.environ["SLURM_CONF"] = cluster.conf  # for SlurmJob's sbatch, scontrol, scancel
        cluster.state_dir = STATE
        os.environ["XMESH_JOB_POLL_S"] = "0.5"
        try:
            yield cluster
        finally:
            os.environ.pop("SLURM_CONF", None)
            os.environ.pop("XMESH_JOB_POLL_S", None)


class Where(xmesh.Actor):
    @xmesh.endpoint
    def where(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid()}


def wait_gone(slurm: SlurmCluster, job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while slurm.run("squeue", "-h", "-j", job_id, check=False).stdout.strip():
        assert time.monotonic() < deadline, f"job {job_id} still queued"
        time.sleep(0.2)


def test_the_test_cluster_runs_a_job_step_on_both_nodes(slurm, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsrun -N2 -n2 hostname\n")
    out = tmp_path / "out"
    r = slurm.run("sbatch", "--parsable", "-N2", "-o", str(out), "-D", str(tmp_path), str(script))
    job_id = r.stdout.strip().split(";")[0]
    wait_gone(slurm, job_id)
    assert sorted(out.read_text().split()) == ["node-a", "node-b"]


def test_a_slurm_job_gives_hosts_that_a_restarted_kernel_finds_again(slurm, tmp_path, capfd):
    job = xmesh.SlurmJob(nodes=2, name="train", state_dir=slurm.state_dir, timeout=90)
    hm = job.host_mesh
    said = capfd.readouterr().out
    assert f"submitted SLURM job {job.job_id}" in said and "2/2 host agents up" in said, said
    assert hm.sizes == {"hosts": 2}
    procs = hm.spawn_procs({"gpus": 1}, name="job-procs")
    w = procs.spawn("where", Where)
    first = w.where.call().get(timeout=60)
    assert [v["host"] for v in first.values()] == ["node-a", "node-b"]
    # A new process (a restarted kernel) finds the same job and its named procs: no new submission.
    prog = textwrap.dedent(f"""
        import sys, xmesh
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_jobs import Where
        job = xmesh.SlurmJob(nodes=2, name="train", state_dir={slurm.state_dir!r}, timeout=60)
        procs = xmesh.attach("job-procs", hosts=job.host_mesh)
        print("JOB", job.job_id, sorted(v["pid"] for v in procs.spawn("w2", Where).where.call().get().values()))
    """)
    r = run_program(prog, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"JOB {job.job_id} {sorted(v['pid'] for v in first.values())}" in r.stdout, r.stdout
    assert "submitted" not in r.stdout and f"using SLURM job {job.job_id}" in r.stdout
    # `xmesh attach NAME` connects to it too, lists its named procs, and runs a prompt's lines.
    r = subprocess.run([*CLI, "attach", "train", "--state-dir", slurm.state_dir], capture_output=True, text=True,
                       input="print('SIZES', job.job_id, hosts.sizes)\n", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SIZES {job.job_id} {{'hosts': 2}}" in r.stdout and f"slurm {job.job_id}" in r.stdout, r.stdout
    assert "named allocation job-procs: hosts=2 x gpus=1, 2/2 procs alive" in r.stdout, r.stdout
    job_id = job.job_id
    capfd.readouterr()
    job.kill()
    assert slurm.run("squeue", "-h", "-j", job_id, check=False).stdout.strip() == ""
    assert not os.path.exists(os.path.join(slurm.state_dir, "jobs", "train.json"))
    time.sleep(1.0)  # past the delay of a death notice
    assert "[xmesh]" not in capfd.readouterr().err  # released on purpose: no failure to report
    r = subprocess.run([*CLI, "attach", "train", "--state-dir", slurm.state_dir, "-c", "print(1)"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"xmesh: no job 'train' is saved in {slurm.state_dir}" in r.stderr, r.stderr


def test_sbatch_errors_come_verbatim_and_a_bad_spec_is_refused_before(slurm, tmp_path):
    with pytest.raises(xmesh.JobError, match="sbatch failed: .*invalid partition"):
        xmesh.SlurmJob(nodes=1, partition="nowhere", name="bad", state_dir=slurm.state_dir).host_mesh
    with pytest.raises(ValueError, match="nodes"):
        xmesh.SlurmJob(nodes=0)
    with pytest.raises(ValueError, match="job name"):
        xmesh.SlurmJob(name="no spaces")
    with pytest.raises(ValueError, match="extra_args"):
        xmesh.SlurmJob(extra_args="--exclusive")
    with pytest.raises(ValueError, match="names a host twice"):
        xmesh.SSHJob(["node-a", "node-a"])
    with pytest.raises(ValueError, match="one host agent per node"):
        import monarch.job
        monarch.job.SlurmJob(meshes={"m": 1}, ntasks_per_node=2)
    with pytest.raises(ValueError, match="meshes must map"):
        monarch.job.SlurmJob(meshes={"m": 0})
    with pytest.raises(ValueError, match="add_mesh takes a mesh name and a number of nodes"):
        monarch.job.SlurmJob(meshes={"m": 1}).add_mesh("more", 0)


def test_a_job_cancelled_while_awaited_or_never_ready_says_so(slurm, tmp_path):
    # Held in the queue (it may begin only in an hour): the timeout says how far it got.
    job = xmesh.SlurmJob(nodes=1, name="later", extra_args=["--begin=now+3600"], state_dir=slurm.state_dir, timeout=2)
    with pytest.raises(xmesh.JobError, match=r"not ready after 2 s \(pending"):
        job.host_mesh
    # Cancelled from outside while awaited.
    job.timeout = 60
    timer = threading.Timer(1.0, lambda: slurm.run("scancel", job.job_id))
    timer.start()
    with pytest.raises(xmesh.JobError, match=rf"SLURM job {job.job_id} \(later\) ended while awaited: CANCELLED"):
        job.host_mesh
    timer.join()


def test_an_agent_that_cannot_start_is_named_with_its_log(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("XMESH_HOSTD", "/bin/false")  # sbatch passes the environment on to the nodes
    job = xmesh.SlurmJob(nodes=2, name="broken", state_dir=slurm.state_dir, timeout=60)
    with pytest.raises(xmesh.JobError, match="the host agent could not start on node-[ab] .*exited with code 1"):
        job.host_mesh
    job.kill()


def test_a_saved_job_with_another_spec_is_not_replaced_unasked(slurm, tmp_path):
    job = xmesh.SlurmJob(nodes=1, name="spec", state_dir=slurm.state_dir, timeout=60)
    job.host_mesh
    try:
        with pytest.raises(xmesh.JobError, match="still runs with another spec .*nodes: 1 there, 2 here"):
            xmesh.SlurmJob(nodes=2, name="spec", state_dir=slurm.state_dir, timeout=60).host_mesh
        again = xmesh.SlurmJob(nodes=2, name="spec", state_dir=slurm.state_dir, timeout=60, replace=True)
        assert again.host_mesh.sizes == {"hosts": 2} and again.job_id != job.job_id
        assert slurm.run("squeue", "-h", "-j", job.job_id, check=False).stdout.strip() == ""
        again.kill()
    finally:
        job.kill()


def test_a_job_cancelled_from_outside_while_in_use_fails_its_ranks_naming_it(slurm, capsys):
    job = xmesh.SlurmJob(nodes=2, name="cut", state_dir=slurm.state_dir, timeout=60)
    procs = job.host_mesh.spawn_procs({"gpus": 1})
    w = procs.spawn("where", Where)
    w.where.call().get(timeout=60)
    slurm.run("scancel", job.job_id)
    with pytest.raises(xmesh.SupervisionError) as e:
        for _ in range(100):  # the next calls fail, naming the job, within the watcher's poll
            w.where.call().get(timeout=30)
            time.sleep(0.1)
    # Named by the agent (its procs ended as the job did) or by the job's watcher, whichever is first.
    assert f"SLURM job {job.job_id} (xmesh-cut) is ending" in str(e.value) or \
        f"SLURM job {job.job_id} (cut) ended: CANCELLED" in str(e.value), str(e.value)
    # `xmesh attach` says it ended (and never submits); the next use of the job submits a new one.
    r = subprocess.run([*CLI, "attach", "cut", "--state-dir", slurm.state_dir, "-c", "print(1)"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"SLURM job {job.job_id} (cut) has ended" in r.stderr, r.stdout + r.stderr
    old_id = job.job_id
    assert job.host_mesh.sizes == {"hosts": 2} and job.job_id != old_id
    assert f"SLURM job {old_id} (cut) has ended: starting anew" in capsys.readouterr().out
    job.kill()


def test_xmesh_ls_shows_jobs_and_stop_releases_them_and_no_early_time_limit_notice(slurm, capfd):
    job = xmesh.SlurmJob(nodes=1, name="limited", time="10", state_dir=slurm.state_dir, timeout=60)
    job.host_mesh
    time.sleep(2)  # four polls of the job: a 10-minute job is not near its end (test_job_records)
    err = capfd.readouterr().err
    assert "reaches its time limit" not in err, err
    r = subprocess.run([*CLI, "ls", "--state-dir", slurm.state_dir], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("limited ")]
    assert f"slurm {job.job_id}" in line and "1 (node-" in line and "running" in line and "10m" in line, r.stdout
    r = subprocess.run([*CLI, "ls", "--json", "--state-dir", slurm.state_dir], capture_output=True, text=True,
                       timeout=60)
    (row,) = [j for j in json.loads(r.stdout) if j.get("kind") == "job" and j["name"] == "limited"]
    assert row["job_id"] == job.job_id and row["state"] == "RUNNING" and 500 < row["seconds_left"] <= 600
    # A named allocation on the job's node is listed too: ls asks the saved jobs' agents.
    named = job.host_mesh.spawn_procs({"gpus": 1}, name="on-the-job")
    named.initialized.get(timeout=60)
    r = subprocess.run([*CLI, "ls", "--state-dir", slurm.state_dir], capture_output=True, text=True, timeout=60)
    assert any(ln.startswith("on-the-job ") and "1/1" in ln for ln in r.stdout.splitlines()), r.stdout + r.stderr
    named.stop().get()
    r = subprocess.run([*CLI, "stop", "limited", "--state-dir", slurm.state_dir], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and f"released SLURM job {job.job_id} (limited; scancel)" in r.stdout, r.stdout + r.stderr
    assert slurm.run("squeue", "-h", "-j", job.job_id, check=False).stdout.strip() == ""


def test_an_ssh_job_gives_hosts_that_a_restarted_kernel_finds_again(ssh_hosts):
    ssh = ["-F", ssh_hosts.config]
    job = xmesh.SSHJob(["node-a", "node-b"], ssh_args=ssh, name="over-ssh", state_dir=STATE, timeout=60)
    procs = job.host_mesh.spawn_procs({"gpus": 1}, name="ssh-procs")
    first = procs.spawn("where", Where).where.call().get(timeout=60)
    assert [v["host"] for v in first.values()] == ["node-a", "node-b"]
    prog = textwrap.dedent(f"""
        import sys, xmesh
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_jobs import Where
        job = xmesh.SSHJob(["node-a", "node-b"], ssh_args={ssh!r}, name="over-ssh", state_dir={STATE!r})
        procs = xmesh.attach("ssh-procs", hosts=job.host_mesh)
        print("PIDS", sorted(v["pid"] for v in procs.spawn("w2", Where).where.call().get().values()))
    """)
    r = run_program(prog, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"PIDS {sorted(v['pid'] for v in first.values())}" in r.stdout and "using SSH job over-ssh" in r.stdout
    record = xmesh._jobs.records.JobRecord.load(STATE, "over-ssh")
    agents = record.agents
    pids = [a["pid"] for a in agents]
    # Hosts sharing a home directory (as these do) get a key file each, never one written twice at once.
    assert all(os.path.exists(os.path.expanduser(f"~/.xmesh/jobs/{record.job_id}-{h}/cluster.key"))
               for h in ("node-a", "node-b"))
    # A second job on the same hosts runs beside the first (agents of their own).
    other = xmesh.SSHJob(["node-a", "node-b"], ssh_args=ssh, name="beside", state_dir=STATE, timeout=60)
    assert sorted(other.host_mesh.spawn_procs({"gpus": 1}).spawn("w", Where).where.call().get(timeout=60)
                  .values(), key=lambda v: v["host"])[0]["host"] == "node-a"
    other.kill()
    ls = subprocess.run([*CLI, "ls", "--state-dir", STATE], capture_output=True, text=True, timeout=60)
    assert "over-ssh  ssh over-ssh-" in ls.stdout and "2 (node-a,node-b)  running" in ls.stdout, ls.stdout
    # An agent gone (its host rebooted, say) shows as lost, naming the host.
    os.kill(next(a["pid"] for a in agents if a["host"] == "node-b"), 9)
    deadline = time.monotonic() + 20
    while "lost (no agent answers on node-b)" not in ls.stdout and time.monotonic() < deadline:
        ls = subprocess.run([*CLI, "ls", "--state-dir", STATE], capture_output=True, text=True, timeout=60)
    assert "lost (no agent answers on node-b)" in ls.stdout, ls.stdout
    job.kill()
    assert not any(os.path.exists(os.path.expanduser(f"~/.xmesh/jobs/{record.job_id}-{h}/cluster.key"))
                   for h in ("node-a", "node-b")), "the key's copies stay on the hosts"
    deadline = time.monotonic() + 20
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids), "the agents still run"


def test_a_host_whose_ssh_refuses_is_named_with_ssh_s_words(ssh_hosts):
    ssh = ["-F", ssh_hosts.config, "-o", "Port=2222"]  # no sshd there
    with pytest.raises(xmesh.JobError) as e:
        xmesh.SSHJob(["node-a", "node-b"], ssh_args=ssh, name="refused", state_dir=STATE, timeout=30).host_mesh
    text = str(e.value)
    assert "node-a: ssh exited with code 255" in text and "node-b: ssh exited" in text, text
    assert "Connection refused" in text, text


MONARCH_SLURM = '''
import socket
from monarch.actor import Actor, endpoint
from monarch.job import SlurmJob, job_load

class Host(Actor):
    @endpoint
    def name(self) -> str:
        return socket.gethostname()

def names(hosts):
    return sorted(hosts.spawn_procs(per_host={{"gpus": 1}}).spawn("h", Host).name.call().get().values())

if "{mode}" == "load":
    job = job_load()  # .monarch/job_state.pkl, as the first run's state() saved it
else:
    job = SlurmJob(meshes={meshes}, job_name="mj", time_limit="0:10:00", exclusive=False)
state = job.state()
print("MESHES", {{name: names(getattr(state, name)) for name in {names}}})
print("ACTIVE", job.active)
if "{mode}" == "kill":
    job.kill()
    print("ACTIVE", job.active)
'''


def _monarch_program(tmp_path, mode, meshes):
    path = tmp_path / f"monarch_{mode}.py"
    path.write_text(MONARCH_SLURM.format(mode=mode, meshes=meshes, names=list(meshes)))
    r = run_program(path=str(path), timeout=100)
    assert r.returncode == 0, r.stdout + r.stderr
    record = xmesh._jobs.records.JobRecord.load(str(tmp_path / ".monarch"), "mj")
    return r.stdout, record and record.job_id


def test_monarch_s_slurm_job_runs_unchanged_and_is_found_again(slurm, tmp_path):
    two = {"trainers": 1, "generators": 1}
    out, job_id = _monarch_program(tmp_path, "new", two)
    assert "MESHES {'trainers': ['node-a'], 'generators': ['node-b']}" in out and "ACTIVE True" in out, out
    assert f"submitted SLURM job {job_id} (mj: 2 nodes)" in out
    # Another process loads the job Monarch's way and reaches the same allocation.
    out, again = _monarch_program(tmp_path, "load", two)
    assert again == job_id and "submitted" not in out and "MESHES {'trainers': ['node-a']" in out, out
    # Other meshes over the same nodes: the same allocation serves them.
    out, same = _monarch_program(tmp_path, "same", {"trainers": 2})
    assert same == job_id and "MESHES {'trainers': ['node-a', 'node-b']}" in out, out
    # A spec the saved job cannot run: released and a new one applied (Monarch's can_run), then killed.
    out, other = _monarch_program(tmp_path, "kill", {"trainers": 1})
    assert other is None and "MESHES {'trainers': ['node-a']}" in out, out
    assert f"releasing SLURM job {job_id} (mj)" in out and out.rstrip().endswith("ACTIVE False"), out
    assert slurm.run("squeue", "-h", "-n", "xmesh-mj", check=False).stdout.strip() == ""


def test_monarch_s_ssh_job_runs_unchanged(ssh_hosts, tmp_path):
    path = tmp_path / "monarch_ssh.py"
    path.write_text(textwrap.dedent(f"""
        import socket
        from monarch.actor import Actor, endpoint
        from monarch.job import SSHJob

        class Host(Actor):
            @endpoint
            def name(self) -> str:
                return socket.gethostname()

        job = SSHJob(ssh_args=["-F", {ssh_hosts.config!r}])
        job.add_mesh("workers", ["node-a", "node-b"])
        try:
            job.add_mesh("again", ["node-b"])
        except ValueError as e:
            print("REFUSED", e)
        procs = job.state().workers.spawn_procs(per_host={{"gpus": 1}})
        print("NAMES", sorted(procs.spawn("h", Host).name.call().get().values()))
        job.kill()
        print("ACTIVE", job.active)
    """))
    r = run_program(path=str(path), timeout=100)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "NAMES ['node-a', 'node-b']" in r.stdout and "ACTIVE False" in r.stdout, r.stdout
    assert "REFUSED hosts ['node-b'] are named twice" in r.stdout, r.stdout
