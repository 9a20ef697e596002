"""The wheel (issue 43): what it holds, and its install into clean venvs of each CPython it was
built for, by a user who is not root, with only what the wheel brings (no build tree, no
system site packages)."""
import os
import pathlib
import shutil
import subprocess
import tempfile
import zipfile

import pytest
from wheel_envs import clean_env, pyenv_python, run_in, shared_venv, wheel, wheel_versions, wheelhouse

VERSIONS = wheel_versions(wheel())
OTHER = next(v for v in ("3.12", "3.11", "3.9") if v not in VERSIONS)  # a Python the wheel was not built for


def test_the_wheel_bundles_its_libraries_but_never_libibverbs():
    names = zipfile.ZipFile(wheel()).namelist()
    assert "xmesh/_bin/xmesh-hostd" in names and "xmesh/_lib/libxmesh.so" in names
    for v in VERSIONS:
        assert f"xmesh/_core.cpython-{v.replace('.', '')}-x86_64-linux-gnu.so" in names, names
    bundled = [n for n in names if n.startswith("xmesh.libs/")]
    for lib in ("libzmq", "libsodium", "libzstd", "libxxhash", "libcrypto"):
        assert any(os.path.basename(n).startswith(lib) for n in bundled), (lib, bundled)
    # The machine's own rdma-core is loaded at run time: its providers are tied to it.
    assert not [n for n in names if "ibverbs" in n], names
    assert "manylinux" in os.path.basename(wheel())


@pytest.fixture
def nobodys_dir():
    """A directory of user nobody's (pytest's tmp_path is under root's private directory)."""
    d = tempfile.mkdtemp(prefix="xmesh-wheel-", dir="/tmp")
    os.chown(d, 65534, 65534)
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


def as_nobody(script: str, where: pathlib.Path) -> subprocess.CompletedProcess:
    """Runs a shell script as user nobody, in a mount namespace where pyenv's Pythons (under
    root's private home) are reachable: root's home is an empty directory there, with only
    .pyenv mounted into it."""
    (where / "steps.sh").write_text(script)
    view = where / "pyenv-view"
    view.mkdir()
    root_side = (f"mount --bind /root/.pyenv {view} && mount -t tmpfs -o mode=0755 tmpfs /root && "
                 f"mkdir /root/.pyenv && mount --bind {view} /root/.pyenv && "
                 f"exec setpriv --reuid=65534 --regid=65534 --clear-groups -- sh -e {where / 'steps.sh'}")
    env = clean_env(HOME=str(where / "home"), XMESH_RUNTIME_DIR=str(where / "run"), PYENV_VERSION="system")
    env.pop("XDG_RUNTIME_DIR", None)
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", root_side], capture_output=True,
                          text=True, timeout=300, env=env, cwd=str(where))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_user_who_is_not_root_installs_it_into_a_venv(version, nobodys_dir):
    home = nobodys_dir / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    venv = nobodys_dir / "env"
    house = wheelhouse(version)  # the dependencies, downloaded beforehand: no index needed
    program = ("import sys, xmesh, monarch.actor, xmesh._core as c, xmesh.rdma; "
               "print(sys.version_info[:2], xmesh.__file__, c.__file__, xmesh.rdma.is_ibverbs_available())")
    r = as_nobody(f"""
        {pyenv_python(version)} -m venv {venv}
        {venv}/bin/python -m pip install -q --disable-pip-version-check --no-index --find-links {house} {wheel()}
        {venv}/bin/python -c '{program}'
        {venv}/bin/xmesh --version
        {venv}/bin/xmesh-hostd --version
    """, nobodys_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"({version.replace('.', ', ')})") and lines[0].count(f"{venv}/lib/") == 2, lines
    assert lines[1].startswith("xmesh 0.") and lines[2].startswith("xmesh-hostd 0."), lines


def test_an_import_of_a_build_for_other_pythons_names_them(tmp_path):
    """A wheel's package forced onto another Python (copied, or installed past pip's check)
    says which Pythons it was built for, not a bare 'No module named xmesh._core'."""
    venv = shared_venv(VERSIONS[0])
    site = run_in(venv, "import xmesh, os; print(os.path.dirname(os.path.dirname(xmesh.__file__)))").stdout.strip()
    other = OTHER
    r = subprocess.run([pyenv_python(other), "-c", "import xmesh"], capture_output=True, text=True, timeout=60,
                       env=clean_env(PYTHONPATH=site))
    assert r.returncode == 1
    built = ", ".join(VERSIONS)
    assert f"was built for Python {built}, not for this Python {other}" in r.stderr, r.stderr


def test_pip_refuses_it_in_a_python_it_was_not_built_for(tmp_path):
    venv = tmp_path / "env"
    subprocess.run([pyenv_python(OTHER), "-m", "venv", str(venv)], check=True, timeout=120, env=clean_env())
    r = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--disable-pip-version-check", wheel()],
                       capture_output=True, text=True, timeout=120, env=clean_env())
    assert r.returncode != 0
    assert "is not a supported wheel on this platform" in r.stderr, r.stderr
