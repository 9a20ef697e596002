"""Workspace spaces: each program, and each named allocation, has its own synced workspace on a
host; a named allocation keeps its own across controllers and starts with what its controller
synced; agents drop the copies of allocations that ended."""
import os
import shutil
import subprocess
import time

from actors_for_tests import WorkspaceUser
from xmesh_testing import PYTHON, read, run_program, runtime_dir_of_its_own, wait_until, write

import xmesh
from xmesh import _core
from xmesh._workspace.sync import workspace_dir


OTHER_PROGRAM = """
import os, sys
sys.path.insert(0, {tests!r})
import xmesh
from actors_for_tests import WorkspaceUser
host = xmesh.hosts([{rundir!r}])
procs = host.spawn_procs({{"gpus": 1}}{named})
report = host.sync_workspace({src})
users = procs.spawn("users", WorkspaceUser, {module!r})
print("VALUE", users.value.call_one().get(timeout=30))
print("WHERE", users.where.call_one().get(timeout=30)[0])
"""


def other_program(rundir, src, named="", module="wsmine"):
    """Another program (a controller of its own) on the same host: spawns, syncs src, and says
    what its actor imported and where its workspace is."""
    what = src if src.startswith("xmesh.") else repr(src)  # a path, or a Workspace expression
    code = OTHER_PROGRAM.format(tests=os.path.dirname(os.path.abspath(__file__)), rundir=rundir, src=what,
                                named=named, module=module)
    r = run_program(code, env={"XMESH_RUNTIME_DIR": rundir}, timeout=90)
    assert r.returncode == 0, r.stderr
    return dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith(("VALUE", "WHERE")))


def test_programs_syncing_to_one_host_each_get_a_workspace_of_their_own(fresh_rundir, tmp_path):
    """Defect: after any program synced to a host's workspace root, another program's
    Workspace(dirs=[...]) sync failed ("overlaps the workspace root"), and two programs syncing
    "." to one host overwrote each other's files under live actors.

    Invariant sync.3 (docs/architecture/09-sync.md).
    """
    mine, theirs = str(tmp_path / "mine"), str(tmp_path / "theirs")
    write(f"{mine}/wsmine.py", "def value():\n    return 'mine'\n")
    write(f"{theirs}/wsmine.py", "def value():\n    return 'theirs'\n")
    host = xmesh.hosts([fresh_rundir])
    procs = host.spawn_procs({"gpus": 1})
    try:
        host.sync_workspace(mine)  # into the root of this program's workspace
        users = procs.spawn("users", WorkspaceUser, "wsmine")
        assert users.value.call_one().get(timeout=30) == "mine"
        # Another program syncs a Workspace of directories, which would nest in our root.
        out = other_program(fresh_rundir, f"xmesh.Workspace(dirs=[{theirs!r}])", module="theirs.wsmine")
        assert out["VALUE"] == "theirs"  # its procs import its file...
        assert users.value.call_one().get(timeout=30) == "mine"  # ...ours still ours
        assert out["WHERE"] != workspace_dir(fresh_rundir) and not os.path.exists(
            os.path.join(workspace_dir(fresh_rundir), "theirs"))
        # And one that syncs to its root the same way we did: each keeps its own files.
        assert other_program(fresh_rundir, theirs)["VALUE"] == "theirs"
        assert read(os.path.join(workspace_dir(fresh_rundir), "wsmine.py")).endswith("'mine'\n")
        assert users.value.call_one().get(timeout=30) == "mine"
    finally:
        procs.stop()


def test_a_named_allocation_keeps_its_workspace_across_controllers(fresh_rundir, tmp_path):
    """Invariant sync.3 (docs/architecture/09-sync.md)."""
    src = str(tmp_path / "src")
    write(f"{src}/wsmine.py", "def value():\n    return 'v1'\n")
    # The first controller spawns the named allocation and syncs through the host mesh.
    out = other_program(fresh_rundir, src, named=", name='wsnamed'")
    assert out["VALUE"] == "v1"
    named_root = out["WHERE"]
    assert named_root == workspace_dir(fresh_rundir, "wsnamed")
    # That controller is gone; the allocation and its workspace are not. A new controller
    # attaches: the live actors still import the synced module, and its syncs reach them.
    procs = xmesh.attach("wsnamed", hosts=xmesh.hosts([fresh_rundir]))
    try:
        users = procs.actors("users")
        assert users.value.call_one().get(timeout=30) == "v1"
        write(f"{src}/wsmine.py", "def value():\n    return 'v2'\n")
        report = xmesh.hosts([fresh_rundir]).sync_workspace(src, auto_reload=True)
        assert [r["reloaded"] for r in report.reloads] == [["wsmine"]], report.reloads
        assert users.value.call_one().get(timeout=30) == "v2"
        assert read(os.path.join(named_root, "wsmine.py")).endswith("'v2'\n")
        # The host mesh's sync went to this controller's workspace and to the named one: the
        # report counts the change once.
        labels = sorted(h["host"] for h in report.hosts)
        assert report.changed == 1 and labels == [_core.hostname(), f"{_core.hostname()} [wsnamed]"], labels
        assert "-> 1 host:" in report.summary()
    finally:
        procs.stop()


def test_a_named_allocation_spawned_after_a_sync_starts_with_the_synced_files(fresh_rundir, tmp_path):
    """Invariant sync.3 (docs/architecture/09-sync.md)."""
    src = str(tmp_path / "src")
    write(f"{src}/wsmine.py", "def value():\n    return 'seeded'\n")
    host = xmesh.hosts([fresh_rundir])
    host.sync_workspace(src)
    procs = host.spawn_procs({"gpus": 1}, name="wsseed")
    try:
        users = procs.spawn("users", WorkspaceUser, "wsmine")
        assert users.value.call_one().get(timeout=30) == "seeded"
        assert users.where.call_one().get(timeout=30)[0] == workspace_dir(fresh_rundir, "wsseed")
    finally:
        procs.stop()


def test_agents_drop_the_workspaces_of_ended_allocations(tmp_path, monkeypatch):
    """Invariant sync.3 (docs/architecture/09-sync.md)."""
    monkeypatch.setenv("XMESH_WORKSPACE_KEEP", "1")  # the agent started below reads it
    src = str(tmp_path / "src")
    write(f"{src}/wsmine.py", "x = 1\n")
    with runtime_dir_of_its_own("xws-") as d:
        host = xmesh.hosts([d])
        procs = host.spawn_procs({"gpus": 1}, name="wsgone")
        procs.sync_workspace(src)
        named_root = workspace_dir(d, "wsgone")
        assert os.path.exists(os.path.join(named_root, "wsmine.py"))
        procs.stop()
        # The allocation ended: its copy goes once unused for XMESH_WORKSPACE_KEEP seconds.
        assert wait_until(lambda: not os.path.exists(named_root), timeout=20)
        # (the agent says so just after removing it)
        assert wait_until(lambda: "removed the synced workspace" in read(os.path.join(d, "hostd.log")), timeout=10)
        # This controller's own copy stays while it is connected, and goes at `xmesh shutdown`.
        host.sync_workspace(src)
        own = workspace_dir(d)
        time.sleep(2.5)
        assert os.path.exists(os.path.join(own, "wsmine.py"))
        r = subprocess.run([PYTHON, "-m", "xmesh.cli", "shutdown"], env=dict(os.environ, XMESH_RUNTIME_DIR=d),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert wait_until(lambda: not os.path.exists(own), timeout=20)


def test_a_named_allocation_spawns_when_the_synced_tree_is_gone(fresh_rundir, tmp_path, capfd):
    """Seeding is the program's earlier syncs replayed: a tree deleted since then is named, and
    the spawn goes on."""
    src = tmp_path / "gone"
    write(f"{src}/wsmine.py", "x = 1\n")
    host = xmesh.hosts([fresh_rundir])
    host.sync_workspace(str(src))
    shutil.rmtree(src)
    procs = host.spawn_procs({"gpus": 1}, name="wsnoseed")
    try:
        procs.initialized.get(timeout=30)
        err = capfd.readouterr().err
        assert "allocation 'wsnoseed'" in err and "starts without the workspace" in err and str(src) in err, err
    finally:
        procs.stop()
