"""Workspaces synced into live actors (real host agents and procs): auto_reload runs new code in
live actors, every reload reaches live actors and instances, watch mode keeps syncing until
stopped, `xmesh sync` of a named allocation with reload, and a notebook's and tools' clutter
stays home unless asked for."""
import os
import subprocess
import sys
import time

from actors_for_tests import WorkspaceUser
from xmesh_testing import PYTHON, read, wait_until, write

import xmesh
from xmesh._workspace.sync import workspace_dir


def test_auto_reload_runs_new_code_in_live_actors(fresh_rundir, tmp_path):
    src = str(tmp_path / "src")
    write(f"{src}/wsmod_helper.py", "def base():\n    return 10\n")
    write(f"{src}/wsmod_main.py", "from wsmod_helper import base\n\n\ndef value():\n    return base() + 1\n\n\n"
                                  "class Thing:\n    def describe(self):\n        return 'thing v1'\n")
    write(f"{src}/wsmod_worker.py", "from xmesh import Actor, endpoint\n\n\nclass Worker(Actor):\n    @endpoint\n"
                                    "    def version(self):\n        return 'worker v1'\n")
    host = xmesh.hosts([fresh_rundir])
    procs = host.spawn_procs({"gpus": 2})
    host.sync_workspace(src)
    users = procs.spawn("users", WorkspaceUser, "wsmod_main")
    assert list(users.value.call().get(timeout=30).values()) == [11, 11]
    assert set(users.keep_instance.call().get(timeout=30).values()) == {"thing v1"}
    sys.path.insert(0, src)  # the controller pickles the actor class by reference
    try:
        import wsmod_worker
        workers = procs.spawn("workers", wsmod_worker.Worker)
        assert set(workers.version.call().get(timeout=30).values()) == {"worker v1"}

        write(f"{src}/wsmod_helper.py", "def base():\n    return 20\n")
        write(f"{src}/wsmod_main.py", read(f"{src}/wsmod_main.py").replace("+ 1", "+ 2").replace("v1", "v2"))
        write(f"{src}/wsmod_worker.py", read(f"{src}/wsmod_worker.py").replace("v1", "v2"))
        report = host.sync_workspace(src, auto_reload=True)
        # Dependencies first: wsmod_main's value() sees the new base().
        assert list(users.value.call().get(timeout=30).values()) == [22, 22]
        # An instance made before the reload runs the new method; so does the live actor itself.
        assert set(users.describe_kept.call().get(timeout=30).values()) == {"thing v2"}
        assert set(workers.version.call().get(timeout=30).values()) == {"worker v2"}
        assert sorted(r["rank"] for r in report.reloads) == [0, 1]
        # Dependencies before the modules that use them (then name order).
        assert all(r["reloaded"] == ["wsmod_helper", "wsmod_worker", "wsmod_main"] for r in report.reloads), \
            report.reloads
        assert "reloaded on ranks 0-1: wsmod_helper, wsmod_worker, wsmod_main" in repr(report)

        # A module that no longer compiles is reported per rank; the old code keeps running.
        write(f"{src}/wsmod_helper.py", "def base(:\n")
        broken = procs.sync_workspace(src, auto_reload=True)
        assert [f[0] for r in broken.reloads for f in r["failed"]] == ["wsmod_helper", "wsmod_helper"]
        # Identical failures of several ranks are one warning; no "nothing reloaded" line first.
        text = repr(broken)
        assert "  warning: ranks 0-1 could not reload wsmod_helper: SyntaxError" in text, text
        assert "nothing (no changed module" not in text and text.count("could not reload") == 1, text
        assert "background: var(--jp-rendermime-error-background" in broken._repr_html_()
        assert list(users.value.call().get(timeout=30).values()) == [22, 22]
    finally:
        sys.path.remove(src)
        sys.modules.pop("wsmod_worker", None)
        procs.stop()


def test_every_reload_reaches_live_actors_and_instances(fresh_rundir, tmp_path):
    """Defect: from the second reload on, live instances kept the first-reloaded code.

    Invariant sync.2 (docs/architecture/09-sync.md).
    """
    src = str(tmp_path / "src")
    main = ("class Base:\n    def tag(self):\n        return 'base'\n\n\n"
            "class Thing(Base):\n    def describe(self):\n        return super().tag() + ' thing v1'\n\n\n"
            "def value():\n    return 1\n")
    worker = ("from xmesh import Actor, endpoint\n\n\nclass Worker(Actor):\n    @endpoint\n"
              "    def version(self):\n        return 'worker v1'\n")
    write(f"{src}/wsre_main.py", main)
    write(f"{src}/wsre_worker.py", worker)
    host = xmesh.hosts([fresh_rundir])
    procs = host.spawn_procs({"gpus": 2})
    host.sync_workspace(src)
    users = procs.spawn("users", WorkspaceUser, "wsre_main")
    assert set(users.keep_instance.call().get(timeout=30).values()) == {"base thing v1"}
    sys.path.insert(0, src)  # the controller pickles the actor class by reference
    try:
        import wsre_worker
        workers = procs.spawn("workers", wsre_worker.Worker)
        assert set(workers.version.call().get(timeout=30).values()) == {"worker v1"}
        for version in ("v2", "v3", "v4"):
            main = main.replace(f"v{int(version[1]) - 1}", version)
            worker = worker.replace(f"v{int(version[1]) - 1}", version)
            write(f"{src}/wsre_main.py", main)
            write(f"{src}/wsre_worker.py", worker)
            report = host.sync_workspace(src, auto_reload=True)
            assert all(sorted(r["reloaded"]) == ["wsre_main", "wsre_worker"] and not r["failed"]
                       for r in report.reloads), report.reloads
            # The live actor, and an instance made before the first reload, run this edit's code
            # (zero-argument super() included), and the instance's class is the module's class.
            assert set(workers.version.call().get(timeout=30).values()) == {f"worker {version}"}
            assert set(users.describe_kept.call().get(timeout=30).values()) == {f"base thing {version}"}
            assert set(users.kept_is_current_class.call().get(timeout=30).values()) == {True}
    finally:
        sys.path.remove(src)
        sys.modules.pop("wsre_worker", None)
        procs.stop()


def test_watch_keeps_syncing_until_stopped(fresh_rundir, tmp_path):
    src = str(tmp_path / "src")
    write(f"{src}/a.txt", "1")
    host = xmesh.hosts([fresh_rundir])
    watcher = host.sync_workspace(src, watch=True)
    root = workspace_dir(fresh_rundir)
    try:
        assert len(watcher.reports) == 1 and read(f"{root}/a.txt") == "1"
        write(f"{src}/a.txt", "2")
        write(f"{src}/sub/b.txt", "new dir")
        assert wait_until(lambda: os.path.exists(f"{root}/sub/b.txt") and read(f"{root}/a.txt") == "2", timeout=30)
        write(f"{src}/sub/c.txt", "inside a directory created after the watch began")
        assert wait_until(lambda: os.path.exists(f"{root}/sub/c.txt"), timeout=30)
    finally:
        watcher.stop()
    assert not watcher.running and not watcher.errors
    write(f"{src}/a.txt", "3")
    time.sleep(1.0)
    assert read(f"{root}/a.txt") == "2"  # stopped: no more syncs


def test_cli_sync_of_a_named_allocation_with_reload(fresh_rundir, tmp_path):
    src = str(tmp_path / "src")
    write(f"{src}/wsmod_cli.py", "def value():\n    return 'cli v1'\n")
    host = xmesh.hosts([fresh_rundir])
    procs = host.spawn_procs({"gpus": 1}, name="wsync-cli")
    try:
        env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir)
        cli = [PYTHON, "-m", "xmesh.cli", "sync"]
        out = subprocess.run(cli + ["wsync-cli", src], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "1 added" in out.stdout
        users = procs.spawn("users", WorkspaceUser, "wsmod_cli")
        assert users.value.call_one().get(timeout=30) == "cli v1"
        write(f"{src}/wsmod_cli.py", "def value():\n    return 'cli v2'\n")
        out = subprocess.run(cli + ["wsync-cli", src, "--reload"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "reloaded on rank 0: wsmod_cli" in out.stdout
        # This program still owns the allocation (the CLI did not take it over).
        assert users.value.call_one().get(timeout=30) == "cli v2"
        out = subprocess.run(cli + ["no-such-name", src], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "no live allocation named 'no-such-name'" in out.stderr
    finally:
        procs.stop()


def test_notebook_and_tool_clutter_stays_home_unless_asked(fresh_rundir, tmp_path):
    """Issue 17, defect 7: .ipynb_checkpoints/ (and .git, environments, tools' caches) went to
    every host, and a second sync's report named the checkpoint instead of the edited module."""
    src = str(tmp_path / "ws")
    write(f"{src}/mymod.py", "X = 1\n")
    clutter = [".ipynb_checkpoints/mymod-checkpoint.py", ".git/config", ".venv/bin/python3", "node_modules/a/x.js",
               ".mypy_cache/3.11/m.json", ".pytest_cache/v/cache", "mymod.egg-info/PKG-INFO", "sub/.ipynb_checkpoints/n.py"]
    for path in clutter:
        write(f"{src}/{path}", "clutter\n")
    host = xmesh.hosts([fresh_rundir])
    first = host.sync_workspace(src)
    root = workspace_dir(fresh_rundir)
    assert first.added == 1 and sorted(os.listdir(root)) == ["mymod.py", "sub"], (first, os.listdir(root))
    assert os.listdir(f"{root}/sub") == []
    write(f"{src}/mymod.py", "X = 2\n")
    write(f"{src}/.ipynb_checkpoints/mymod-checkpoint.py", "X = 2\n")  # what JupyterLab saves beside
    second = host.sync_workspace(src)
    assert second.changed == 1 and second.changed_files == ["mymod.py"], second
    assert "  sent: mymod.py" in repr(second)
    # The user's exclude= has the last word.
    third = host.sync_workspace(src, exclude=["!.git/"])
    assert third.added == 1 and os.path.exists(f"{root}/.git/config")

