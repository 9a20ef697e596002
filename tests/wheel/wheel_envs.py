"""The wheel the tests install (scripts/build_wheel.sh, run by scripts/test.sh into
build/wheel/dist) and virtual environments of pyenv's CPythons holding it: clean ones (no system
site packages, nothing of the build tree in their environment), made once per wheel and shared
by the test processes (a lock per environment), or fresh ones for the install itself."""
import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
from typing import Callable

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD_DIR = os.environ.get("XMESH_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
DIST_DIR = os.path.join(BUILD_DIR, "wheel", "dist")
EXAMPLES = os.path.join(SOURCE_DIR, "examples")

# What the tests' environment must not carry into a venv's programs: the build tree's package
# and host agent (tests/CMakeLists.txt sets them for the other suites).
BUILD_TREE_VARIABLES = ("PYTHONPATH", "XMESH_HOSTD", "XMESH_SOURCE_DIR", "XMESH_BUILD_DIR", "JUPYTER_PATH")


def wheel() -> str:
    """The newest wheel in build/wheel/dist (scripts/test.sh builds it before the tests)."""
    found = sorted(glob.glob(os.path.join(DIST_DIR, "xmesh-*.whl")), key=os.path.getmtime)
    if not found:
        raise FileNotFoundError(f"no xmesh wheel in {DIST_DIR}: scripts/build_wheel.sh makes it")
    return found[-1]


def wheel_versions(path: str) -> list:
    """The CPython versions a wheel holds, from its tags ("3.10", "3.13")."""
    python_tag = os.path.basename(path).split("-")[2]
    return [f"{t[2]}.{t[3:]}" for t in python_tag.split(".")]


def pyenv_python(version: str) -> str:
    """pyenv's interpreter of a CPython version ("3.10"), the newest patch release of it."""
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")))
    if not found:
        raise FileNotFoundError(f"pyenv has no CPython {version} under {root}")
    return found[-1]


def clean_env(**extra: str) -> dict:
    """This process's environment without the build tree's variables, plus extra."""
    env = {k: v for k, v in os.environ.items() if k not in BUILD_TREE_VARIABLES}
    env.update(extra)
    return env


def make_venv(where: str, version: str, packages: tuple = ()) -> str:
    """A fresh venv of pyenv's CPython `version` at `where` with the wheel (and packages)
    installed by its own pip; returns its interpreter."""
    subprocess.run([pyenv_python(version), "-m", "venv", where], check=True, timeout=120, env=clean_env())
    python = os.path.join(where, "bin", "python")
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--find-links",
                        wheelhouse(version), wheel(), *packages],
                       capture_output=True, text=True, timeout=300, env=clean_env())
    if r.returncode != 0:
        raise RuntimeError(f"pip install into a {version} venv failed:\n{r.stdout}\n{r.stderr}")
    return python


KERNEL_NAME = "xmesh-venv"  # the kernelspec each shared venv gets (--sys-prefix)


def _made_once(kind: str, version: str, make: Callable[[str], None]) -> str:
    """build/wheel/<kind>/<version>-<the wheel's hash>, made by make(where) in the first test
    process that asks (under a lock, older ones removed) and reused by the others."""
    with open(wheel(), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    root = os.path.join(BUILD_DIR, "wheel", kind)
    os.makedirs(root, exist_ok=True)
    where = os.path.join(root, f"{version}-{digest}")
    with open(where + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(where, ".complete")):
            for old in glob.glob(os.path.join(root, f"{version}-*")):
                if not old.endswith(".lock"):
                    shutil.rmtree(old, ignore_errors=True)
            make(where)
            open(os.path.join(where, ".complete"), "w").close()
    return where


def shared_venv(version: str) -> str:
    """The venv of `version` holding the current wheel and jupyter_client, its kernelspec
    installed into it (`python -m xmesh.kernel install --sys-prefix --name xmesh-venv`), shared
    by the test processes; returns its interpreter."""
    def make(where: str) -> None:
        python = make_venv(where, version, ("jupyter_client",))  # `jupyter kernelspec list` in the venv
        install = [python, "-m", "xmesh.kernel", "install", "--sys-prefix", "--name", KERNEL_NAME,
                   "--display-name", f"xmesh (venv {version})"]
        subprocess.run(install, check=True, capture_output=True, timeout=120, env=clean_env())

    return os.path.join(_made_once("venvs", version, make), "bin", "python")


def wheelhouse(version: str) -> str:
    """A directory (readable by every user) holding the wheel's dependencies for CPython
    `version`, downloaded once per wheel: installs from it need no index (`--no-index
    --find-links`), so a test of an install is not a test of the network's speed."""
    def make(where: str) -> None:
        r = subprocess.run([pyenv_python(version), "-m", "pip", "download", "-q", "--disable-pip-version-check",
                            "-d", where, wheel()], capture_output=True, text=True, timeout=300, env=clean_env())
        if r.returncode != 0:
            raise RuntimeError(f"pip download of the wheel's dependencies for {version} failed:\n{r.stderr}")

    where = _made_once("wheelhouse", version, make)
    for d in (os.path.dirname(where), where):
        os.chmod(d, 0o755)
    return where


def run_in(python: str, source: str, timeout: float = 90, cwd: "str | None" = None, **env: str):
    """Runs a program with a venv's interpreter, in a clean environment; CompletedProcess."""
    return subprocess.run([python, "-c", source], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=clean_env(**env))



if __name__ == "__main__":
    # scripts/test.sh makes the shared venvs before the tests run (their PyPI installs take a
    # minute, which no test's hang guard should have to hold): wheel_envs.py 3.10 3.13
    import sys

    for v in sys.argv[1:]:
        print(f"wheel_envs: {shared_venv(v)}, {wheelhouse(v)}")
