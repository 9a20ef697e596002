"""The kernel in each venv's Python (issue 43): the kernelspec `python -m xmesh.kernel install
--sys-prefix` wrote runs the venv's interpreter and `jupyter kernelspec list` in the venv shows
it; jupyter_kernel_test's whole suite passes against it; its cells see exactly the venv (its
sys.prefix and interpreter, a package only the venv has, in a cell and in an endpoint), and
`%pip install` installs into the venv, where the procs find it too."""
import json
import os
import subprocess
import unittest
import uuid
import zipfile

import pytest
import test_kernel_protocol as protocol
from kernel_session import KernelSession
from test_wheel_programs import env_only_package
from wheel_envs import KERNEL_NAME, clean_env, shared_venv, wheel, wheel_versions
from xmesh_testing import private_tmpdir, stop_agent

VERSIONS = wheel_versions(wheel())


def venv_of(python: str) -> str:
    return os.path.dirname(os.path.dirname(python))


@pytest.fixture
def venv_jupyter_path(monkeypatch):
    """Sets JUPYTER_PATH to a venv's share/jupyter (where --sys-prefix put its kernelspec)."""
    def point_at(python: str) -> None:
        monkeypatch.setenv("JUPYTER_PATH", os.path.join(venv_of(python), "share", "jupyter"))
    return point_at


@pytest.mark.parametrize("version", VERSIONS)
def test_the_venvs_kernelspec_runs_its_python_and_passes_jupyter_kernel_test(version, venv_jupyter_path,
                                                                           monkeypatch):
    python = shared_venv(version)
    listed = subprocess.run([os.path.join(os.path.dirname(python), "jupyter"), "kernelspec", "list", "--json"],
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert listed.returncode == 0, listed.stderr
    spec = json.loads(listed.stdout)["kernelspecs"][KERNEL_NAME]
    assert spec["resource_dir"] == os.path.join(venv_of(python), "share", "jupyter", "kernels", KERNEL_NAME)
    assert spec["spec"]["argv"][:3] == [python, "-m", "xmesh.kernel"]
    venv_jupyter_path(python)
    rundir = private_tmpdir("xmw-")
    monkeypatch.setenv("XMESH_RUNTIME_DIR", rundir)
    # The kernel is started by this process's jupyter_client: without the build tree's package.
    for name in ("PYTHONPATH", "XMESH_HOSTD"):
        monkeypatch.delenv(name, raising=False)
    tests = type(f"VenvKernelTests{version.replace('.', '')}", (protocol.XmeshKernelTests,),
                 {"kernel_name": KERNEL_NAME})
    try:
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(tests).run(result)
    finally:
        stop_agent(rundir)
    problems = [f"{t}: {tb}" for t, tb in result.failures + result.errors]
    assert not problems, "\n".join(problems)
    assert not result.skipped and result.testsRun >= 13, (result.skipped, result.testsRun)


def tiny_wheel(directory: str, name: str) -> str:
    """A wheel of a one-module package (no build backend needed)."""
    dist = f"{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 'installed by %pip'\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: xmesh-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    path = os.path.join(directory, f"{name}-1.0-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
        z.writestr(f"{dist}/RECORD", "".join(f"{member},,\n" for member in files) + f"{dist}/RECORD,,\n")
    return path


CELL_AND_ACTORS = """
import json, sys
from xmesh import Actor, endpoint, this_host

class Where(Actor):
    @endpoint
    def where(self, module):
        import importlib
        return [sys.executable, sys.prefix, importlib.import_module(module).__name__]

procs = this_host().spawn_procs({{"gpus": 2}})
where = procs.spawn("where", Where)
print(json.dumps([sys.executable, sys.prefix, {pkg}.MARKER]))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_cells_and_their_procs_see_the_venv_and_pip_installs_into_it(version, venv_jupyter_path, tmp_path):
    """Invariant env.1 (docs/architecture/12-environments.md): from a venv's kernel."""
    python = shared_venv(version)
    prefix = venv_of(python)
    pkg = env_only_package(python)
    tiny = f"xmesh_tiny_{version.replace('.', '')}_{uuid.uuid4().hex[:8]}"  # new in the shared venv
    venv_jupyter_path(python)
    rundir = private_tmpdir("xmw-")
    kernel = KernelSession(rundir, kernel_name=KERNEL_NAME, base_env=clean_env())
    try:
        r = kernel.ok(f"import {pkg}\n" + CELL_AND_ACTORS.format(pkg=pkg))
        assert json.loads(r.stdout) == [python, prefix, f"from {prefix}"]
        assert json.loads(kernel.value(f"json.dumps(list(where.where.call({pkg!r}).get().values()))").strip("'")) == \
            [[python, prefix, pkg]] * 2
        r = kernel.ok(f"%pip install --no-index --no-deps {tiny_wheel(str(tmp_path), tiny)}", timeout=110)
        assert f"Successfully installed {tiny.replace('_', '-')}-1.0" in r.stdout, r.stdout + r.stderr
        assert kernel.value(f"import {tiny}; {tiny}.__file__").strip("'").startswith(prefix + "/lib/")
        assert json.loads(kernel.value(f"json.dumps(list(where.where.call({tiny!r}).get().values()))").strip("'")) == \
            [[python, prefix, tiny]] * 2
    finally:
        kernel.close()
        stop_agent(rundir)
        subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", tiny], capture_output=True, timeout=60,
                       env=clean_env())
