"""Saved job records (`.xmesh/jobs/NAME.json`) are acted on only when they are this user's own
(issue 41, finding 5): a record planted in a repository checkout or an unpacked archive must never
choose a program for `xmesh stop` to run; one bad record never hides the others in `xmesh ls`; an
SSH job's stop says what it stopped (not "scancel")."""
import json
import os
import stat
import subprocess
import sys

import pytest
from xmesh_testing import PYTHON

from xmesh._jobs.records import JobError, JobRecord


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A working directory with its .xmesh state, and a secret of this test's own."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    work = tmp_path / "checkout"
    (work / ".xmesh").mkdir(parents=True)
    return work


def xmesh(cwd, *args):
    return subprocess.run([PYTHON, "-m", "xmesh.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=str(cwd), env=dict(os.environ))


def planted(work, name: str, marker, file_mode: int = 0o644, dir_mode: int = 0o755) -> str:
    """A record as an attacker would leave it: its ssh 'program' a shell that makes `marker`."""
    jobs = work / ".xmesh" / "jobs"
    jobs.mkdir(exist_ok=True)
    os.chmod(jobs, dir_mode)
    body = {"kind": "ssh", "name": name, "job_id": f"{name}-00", "job_dir": str(jobs), "submitted": 0.0,
            "spec": {"hosts": ["h"], "python": sys.executable, "port": 0, "ssh": "/bin/sh",
                     "ssh_args": ["-c", f"touch {marker}"]},
            "hosts": ["127.0.0.1:1"], "agents": [{"host": "h", "addr": "127.0.0.1:1", "pid": 4242}]}
    path = jobs / f"{name}.json"
    path.write_text(json.dumps(body))
    os.chmod(path, file_mode)
    return str(path)


def test_a_record_open_to_others_is_refused_and_nothing_runs(state, tmp_path):
    marker = tmp_path / "ran"
    planted(state, "evil", marker)
    r = xmesh(state, "stop", "evil")
    assert r.returncode == 1
    assert "not this user's own private one" in r.stderr and "mode 0644" in r.stderr
    assert not marker.exists()


def test_a_private_record_xmesh_did_not_sign_is_refused_and_nothing_runs(state, tmp_path):
    marker = tmp_path / "ran"
    planted(state, "evil", marker, file_mode=0o600, dir_mode=0o700)  # an archive keeps modes
    r = xmesh(state, "stop", "evil")
    assert r.returncode == 1
    assert "was not written by xmesh for this user" in r.stderr
    assert not marker.exists()


def test_a_signed_record_changed_afterwards_is_refused(state, tmp_path):
    fake_ssh = tmp_path / "fake-ssh"
    fake_ssh.write_text("#!/bin/sh\nexit 0\n")
    fake_ssh.chmod(0o700)
    spec = {"hosts": ["h"], "python": sys.executable, "port": 0, "ssh": str(fake_ssh), "ssh_args": []}
    JobRecord("ssh", "mine", spec, "mine-01", "/nowhere", 0.0, ["127.0.0.1:1"],
                    [{"host": "h", "addr": "127.0.0.1:1", "pid": 4242}]).save(str(state / ".xmesh"))
    path = state / ".xmesh" / "jobs" / "mine.json"
    body = json.loads(path.read_text())
    body["spec"]["ssh"] = "/bin/sh"
    path.write_text(json.dumps(body))
    with pytest.raises(JobError, match="not written by xmesh for this user"):
        JobRecord.load(str(state / ".xmesh"), "mine")


def test_ls_lists_every_job_beside_a_bad_record_and_stop_says_what_it_stopped(state, tmp_path):
    calls = tmp_path / "ssh-calls"
    fake_ssh = tmp_path / "fake-ssh"  # the user's own ssh wrapper, chosen when the job was made
    fake_ssh.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexit 0\n")
    fake_ssh.chmod(0o700)
    spec = {"hosts": ["node-a"], "python": sys.executable, "port": 0, "ssh": str(fake_ssh), "ssh_args": []}
    JobRecord("ssh", "good", spec, "good-01", "/nowhere", 0.0, ["127.0.0.1:1"],
                    [{"host": "node-a", "addr": "127.0.0.1:1", "pid": 4242}]).save(str(state / ".xmesh"))
    saved = state / ".xmesh" / "jobs" / "good.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
    (saved.parent / "broken.json").write_text("{not json")
    os.chmod(saved.parent / "broken.json", 0o600)

    r = xmesh(state, "ls")
    assert r.returncode == 0, r.stderr
    assert "good" in r.stdout and "lost" in r.stdout  # its agent does not answer at 127.0.0.1:1
    assert "broken" in r.stdout and "refused" in r.stdout
    rows = json.loads(xmesh(state, "ls", "--json").stdout)
    assert {j["name"]: j["state"] for j in rows if j.get("kind") == "job"} == {"good": "LOST", "broken": "REFUSED"}

    r = xmesh(state, "stop", "good")
    assert r.returncode == 0, r.stderr
    assert "stopped the host agents of SSH job good on node-a" in r.stdout and "scancel" not in r.stdout
    assert "kill 4242" in calls.read_text()
    assert not saved.exists()


def test_a_job_name_that_is_a_path_is_not_a_record(state):
    assert JobRecord.load(str(state / ".xmesh"), "../../etc/passwd") is None


def test_a_jobs_time_limit_notice_comes_in_the_last_fifth_of_its_limit():
    """Issue 45: a 10-minute job is not "reaching its time limit" when it starts (XMESH_JOB_NOTICE_S
    unset: 10 minutes); it is 2 minutes before its end. A 24-hour job: 10 minutes before. SLURM's durations read."""
    from xmesh._jobs.control import SlurmState, _slurm_duration

    assert [_slurm_duration(t) for t in ("00:10:00", "10", "1-00:00:00", "2-3", "5:30", "UNLIMITED", "")] == \
        [600.0, 600.0, 86400.0, 183600.0, 330.0, None, None]
    ten_minutes = 600.0
    assert not SlurmState("RUNNING", seconds_left=599, limit_s=ten_minutes).notice_due(600)
    assert SlurmState("RUNNING", seconds_left=119, limit_s=ten_minutes).notice_due(600)
    assert not SlurmState("RUNNING", seconds_left=3600, limit_s=86400).notice_due(600)
    assert SlurmState("RUNNING", seconds_left=599, limit_s=86400).notice_due(600)
    assert SlurmState("RUNNING", seconds_left=599, limit_s=None).notice_due(600)  # limit not said
    assert not SlurmState("PENDING", seconds_left=None, limit_s=ten_minutes).notice_due(600)
    # XMESH_JOB_NOTICE_S set by the user: its lead, whatever the limit
    assert SlurmState("RUNNING", seconds_left=599, limit_s=ten_minutes).notice_due(900, within_last_fifth=False)
