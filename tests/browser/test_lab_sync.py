"""JupyterLab 4 in Chromium: a module edited in the workspace, synced to the hosts and reloaded
in the live actors, twice in a row; each report names the edited module (notebook checkpoints
stay home)."""
import os

from jupyter_ui import NotebookPage, write_notebook


def test_sync_with_reload_twice_in_a_row(server, page):
    ws = os.path.join(server.root, "ws")
    os.makedirs(os.path.join(ws, ".ipynb_checkpoints"), exist_ok=True)

    def edit(version):
        for path in ("mymod.py", ".ipynb_checkpoints/mymod-checkpoint.py"):
            with open(os.path.join(ws, path), "w") as f:
                f.write(f"def version():\n    return {version}\n")

    edit(1)
    write_notebook(os.path.join(server.root, "sync.ipynb"), [
        f'''
import xmesh
from xmesh import Actor, endpoint, this_host

class User(Actor):
    @endpoint
    def version(self):
        import mymod
        return mymod.version()

host = this_host()
host.sync_workspace({ws!r})
procs = host.spawn_procs({{"gpus": 2}})
users = procs.spawn("users", User)
print("VERSION", sorted(users.version.call().get().values()))
''',
        f"report = host.sync_workspace({ws!r}, auto_reload=True)\nprint(repr(report))\n"
        "print('VERSION', sorted(users.version.call().get().values()))",
    ])
    nb = NotebookPage(page, server, "sync.ipynb")
    nb.run(0, timeout=90)
    assert "VERSION [1, 1]" in nb.output(0), nb.output(0)
    for version in (2, 3):
        edit(version)
        nb.run(1, timeout=60)
        text = nb.output(1)
        assert f"VERSION [{version}, {version}]" in text, text
        assert "sent: mymod.py" in text and "checkpoint" not in text, text
        assert "reloaded on ranks 0-1: mymod" in text, text
