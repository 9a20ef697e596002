"""Programs run by the Pythons of venvs holding the wheel (issue 43): the seed programs, a
package only the environment has reaching the actors (in an endpoint and after a workspace
sync), RDMA's absence where libibverbs cannot be loaded, and a host agent of another Python
refused at connect, naming both."""
import json
import os
import socket
import subprocess
import textwrap

import pytest
from wheel_envs import EXAMPLES, clean_env, run_in, shared_venv, wheel, wheel_versions
from xmesh_testing import private_tmpdir, stop_agent, wait_until

VERSIONS = wheel_versions(wheel())
ENV_ONLY = "only_in_this_env_{tag}"


def env_only_package(python: str) -> str:
    """A package of the test's own, installed into the venv only (not the system's Python);
    returns its name."""
    tag = os.path.basename(os.path.dirname(os.path.dirname(python))).replace(".", "_").replace("-", "_")
    name = ENV_ONLY.format(tag=tag)
    site = run_in(python, "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
    os.makedirs(os.path.join(site, name), exist_ok=True)
    with open(os.path.join(site, name, "__init__.py"), "w") as f:
        f.write("import sys\nMARKER = 'from ' + sys.prefix\n")
    return name


@pytest.mark.parametrize("version", VERSIONS)
def test_the_seed_programs_run_in_the_venv(version, tmp_path):
    python = shared_venv(version)
    rundir = private_tmpdir("xmw-")
    try:
        hello = open(os.path.join(EXAMPLES, "seed_hello_bye.py")).read()
        r = run_in(python, hello, cwd=str(tmp_path), XMESH_RUNTIME_DIR=rundir)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("'hello world'") == 4 and r.stdout.rstrip().endswith("got an exception saying bye")
        toy = open(os.path.join(EXAMPLES, "seed_asyncio.py")).read()
        r = run_in(python, toy, cwd=str(tmp_path), XMESH_RUNTIME_DIR=rundir)
        assert r.returncode == 0, r.stderr
        for rank in range(4):
            assert f"[{rank}] Identity: {rank}, msg='hey there, from script!!'" in r.stdout, r.stdout
    finally:
        stop_agent(rundir)


ACTORS_SEE_THE_ENV = """
import json, os, sys
import xmesh
from xmesh import Actor, endpoint, this_host

class Where(Actor):
    @endpoint
    def where(self) -> dict:
        import {pkg}
        return {{"executable": sys.executable, "prefix": sys.prefix, "marker": {pkg}.MARKER}}

    @endpoint
    def synced(self) -> str:
        import uses_the_env  # from the synced workspace, importing the environment's package
        return uses_the_env.VALUE

import {pkg}
print("CONTROLLER", json.dumps([sys.executable, {pkg}.MARKER, os.path.dirname(xmesh.__file__)]))
hm = this_host()
procs = hm.spawn_procs({{"gpus": 2}})
w = procs.spawn("where", Where)
print("ACTORS", json.dumps(list(w.where.call().get(timeout=60).values())))
hm.sync_workspace({workspace!r})
print("SYNCED", json.dumps(list(w.synced.call().get(timeout=60).values())))
procs.stop()
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_a_package_only_the_env_has_reaches_the_actors_and_the_synced_code(version, tmp_path):
    """Invariant env.1 (docs/architecture/12-environments.md): in a venv holding the wheel."""
    python = shared_venv(version)
    pkg = env_only_package(python)
    prefix = os.path.dirname(os.path.dirname(python))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "uses_the_env.py").write_text(f"import {pkg}\nVALUE = 'synced, ' + {pkg}.MARKER\n")
    rundir = private_tmpdir("xmw-")
    try:
        r = run_in(python, ACTORS_SEE_THE_ENV.format(pkg=pkg, workspace=str(workspace)), cwd=str(tmp_path),
                   XMESH_RUNTIME_DIR=rundir)
    finally:
        stop_agent(rundir)
    assert r.returncode == 0, r.stderr
    lines = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in r.stdout.splitlines()
             if line.split(" ", 1)[0] in ("CONTROLLER", "ACTORS", "SYNCED")}
    marker = f"from {prefix}"
    assert lines["CONTROLLER"][:2] == [python, marker] and lines["CONTROLLER"][2].startswith(prefix + "/lib/")
    assert lines["ACTORS"] == [{"executable": python, "prefix": prefix, "marker": marker}] * 2
    assert lines["SYNCED"] == [f"synced, {marker}"] * 2


def test_without_a_loadable_libibverbs_xmesh_loads_and_says_why_there_is_no_rdma(tmp_path):
    """libibverbs is loaded at run time: a machine without it (here: the library hidden in a
    mount namespace) imports xmesh, and buffers move over the other paths."""
    python = shared_venv(VERSIONS[0])
    lib = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    path = next(line.split("=> ")[1] for line in lib.splitlines() if "libibverbs.so.1 " in line)
    program = textwrap.dedent("""
        import xmesh, xmesh.rdma as r
        from xmesh import _core
        print("WHY", _core.probe_ibverbs()["why"])
        print("AVAILABLE", r.is_ibverbs_available())
    """)
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind /dev/null {path} && exec {python} -c '{program}'"],
                       capture_output=True, text=True, timeout=60, env=clean_env())
    assert r.returncode == 0, r.stderr
    assert "WHY libibverbs could not be loaded (" in r.stdout and "AVAILABLE False" in r.stdout, r.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(len(VERSIONS) < 2, reason="the wheel holds one Python version")
def test_a_host_agent_of_another_python_is_refused_at_connect_naming_both(tmp_path):
    """Invariant env.2 (docs/architecture/12-environments.md): over a real connection."""
    controller, other = shared_venv(VERSIONS[0]), shared_venv(VERSIONS[-1])
    key = str(tmp_path / "cluster.key")
    run_in(controller, f"from xmesh import _core; _core.write_new_key_file({key!r})").check_returncode()
    port = free_port()
    agent_dir = private_tmpdir("xmw-agent-")
    hostd = os.path.join(os.path.dirname(other), "xmesh-hostd")
    with open(tmp_path / "agent.log", "w") as log:
        agent = subprocess.Popen([hostd, "--runtime-dir", agent_dir, "--listen", f"tcp://127.0.0.1:{port}",
                                  "--key-file", key], stdout=log, stderr=subprocess.STDOUT, env=clean_env())
    try:
        wait_until(lambda: "serving" in (tmp_path / "agent.log").read_text() or agent.poll() is not None, 20)
        program = textwrap.dedent(f"""
            import xmesh
            hm = xmesh.hosts(["127.0.0.1:{port}"], key_file={key!r})
            try:
                hm.spawn_procs({{"gpus": 1}})
            except Exception as e:
                print("REFUSED", type(e).__name__, e)
        """)
        r = run_in(controller, program, XMESH_RUNTIME_DIR=private_tmpdir("xmw-"))
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    assert r.returncode == 0, r.stderr
    theirs = run_in(other, "import platform; print(platform.python_version())").stdout.strip()
    ours = run_in(controller, "import platform; print(platform.python_version())").stdout.strip()
    assert (f"runs Python {theirs} ({other}), this controller Python {ours} ({controller})" in r.stdout
            and "REFUSED" in r.stdout), r.stdout
