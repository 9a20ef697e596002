"""Notebooks executed headlessly: `xmesh run` (progress, outputs, the executed notebook, a
failing cell's error and exit code), nbclient directly, and `jupyter nbconvert --execute`."""
import os
import shutil
import subprocess

import nbformat
from nbclient import NotebookClient
from xmesh_testing import EXAMPLES, PYTHON, SOURCE_DIR

NOTEBOOKS = os.path.join(SOURCE_DIR, "tests", "notebooks")


def _xmesh_run(kernel_rundir, *args, timeout=110):
    env = dict(os.environ, XMESH_RUNTIME_DIR=kernel_rundir)
    return subprocess.run([PYTHON, "-m", "xmesh.cli", "run", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _outputs_text(nb):
    """Every output's text; stream pieces joined as they were printed (the kernel may split
    one print into several stream messages)."""
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                texts.append(out.get("text", ""))
            else:
                texts.append("\n" + out.get("data", {}).get("text/plain", "") + out.get("data", {}).get("text/html", "")
                             + "\n")
    return "".join(texts)


def test_xmesh_run_executes_the_quickstart_notebook(kernel_rundir, tmp_path):
    out = tmp_path / "quickstart.out.ipynb"
    r = _xmesh_run(kernel_rundir, os.path.join(EXAMPLES, "quickstart.ipynb"), "-o", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[1/6] cell 2: ok" in r.stdout and "[6/6] cell 11: ok" in r.stdout
    assert "caught an actor error from rank 7 {'hosts': 1, 'gpus': 3}: rank 7 ran out of patience" in r.stdout
    assert "steps per rank: [2, 2, 2, 2, 1, 1, 1, 1]" in r.stdout
    assert f"wrote {out}" in r.stdout
    nb = nbformat.read(str(out), as_version=4)
    text = _outputs_text(nb)
    assert "<b>ValueMesh {&#x27;hosts&#x27;: 2, &#x27;gpus&#x27;: 4}</b>" in text  # the HTML table
    assert "ProcMesh {'hosts': 2, 'gpus': 4} stopped" in text


def test_xmesh_run_fails_with_the_failing_cells_error(kernel_rundir, tmp_path):
    out = tmp_path / "failing.out.ipynb"
    r = _xmesh_run(kernel_rundir, os.path.join(NOTEBOOKS, "failing.ipynb"), "-o", str(out))
    assert r.returncode == 1
    assert "[1/3] cell 1: ok" in r.stdout and "[2/3] cell 2: error" in r.stdout
    assert "a cell of" in r.stdout and "ActorError" in r.stdout and "ValueError: no work today" in r.stdout
    assert "never reached" not in r.stdout
    nb = nbformat.read(str(out), as_version=4)
    errors = [o for o in nb.cells[1].outputs if o.output_type == "error"]
    assert errors and errors[0].ename == "ActorError"
    assert not nb.cells[2].get("outputs")


def test_xmesh_run_names_bad_input(kernel_rundir, tmp_path):
    r = _xmesh_run(kernel_rundir, str(tmp_path / "missing.ipynb"))
    assert r.returncode == 1 and "no notebook at" in r.stderr and "Traceback" not in r.stderr
    junk = tmp_path / "junk.ipynb"
    junk.write_text("this is not json")
    r = _xmesh_run(kernel_rundir, str(junk))
    assert r.returncode == 1 and "is not a readable notebook" in r.stderr and "Traceback" not in r.stderr


def test_nbclient_runs_a_notebook_whose_cells_share_live_actors(kernel_rundir, monkeypatch):
    monkeypatch.setenv("XMESH_RUNTIME_DIR", kernel_rundir)
    nb = nbformat.read(os.path.join(NOTEBOOKS, "persistence.ipynb"), as_version=4)
    NotebookClient(nb, timeout=60, kernel_name="xmesh").execute()
    text = _outputs_text(nb)
    assert "items ['a', 'b']" in text


def test_a_notebook_syncs_its_workspace_and_live_actors_run_the_edit(kernel_rundir, monkeypatch):
    monkeypatch.setenv("XMESH_RUNTIME_DIR", kernel_rundir)
    nb = nbformat.read(os.path.join(NOTEBOOKS, "workspace_sync.ipynb"), as_version=4)
    NotebookClient(nb, timeout=60, kernel_name="xmesh").execute()
    first, second = nb.cells[2].outputs, nb.cells[4].outputs
    html = [o.data["text/html"] for o in first if o.output_type == "execute_result"]
    assert html and "<table" in html[0] and "1 added" in html[0], first  # the report, as a table
    text = _outputs_text(nb)
    assert "before [1, 1]" in text and "after [2, 2]" in text, text
    reloaded = [o.data["text/plain"] for o in second if o.output_type == "execute_result"]
    assert reloaded and "1 changed" in reloaded[0] and "reloaded on ranks 0-1: nbsync_model" in reloaded[0], second


def test_nbconvert_execute_works(kernel_rundir, tmp_path):
    src = tmp_path / "persistence.ipynb"
    shutil.copy(os.path.join(NOTEBOOKS, "persistence.ipynb"), src)
    env = dict(os.environ, XMESH_RUNTIME_DIR=kernel_rundir)
    r = subprocess.run(["jupyter-nbconvert", "--execute", "--to", "notebook", "--output", "done.ipynb", str(src)],
                       env=env, capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stderr
    nb = nbformat.read(str(tmp_path / "done.ipynb"), as_version=4)
    assert "items ['a', 'b']" in _outputs_text(nb)
