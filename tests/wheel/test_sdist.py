"""The sdist (issue 43): made by the PEP 517 backend from the checkout, it holds what the wheel's
build needs, and the project configures from it alone in wheel mode (every source CMake names
is there; `pip wheel xmesh-*.tar.gz` builds the same wheel, which takes minutes and is left to
scripts/build_wheel.sh's kind of run)."""
import os
import subprocess
import tarfile

from wheel_envs import BUILD_DIR, SOURCE_DIR, pyenv_python, wheel, wheel_versions

TOOLS = os.path.join(BUILD_DIR, "wheel", "tools", "bin")


def test_the_sdist_holds_the_sources_and_configures_alone(tmp_path):
    r = subprocess.run([os.path.join(TOOLS, "python"), "-m", "build", "--sdist", "--no-isolation", "--outdir",
                        str(tmp_path), SOURCE_DIR], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stdout + r.stderr
    (sdist,) = [f for f in os.listdir(tmp_path) if f.endswith(".tar.gz")]
    version = os.path.basename(wheel()).split("-")[1]
    assert sdist == f"xmesh-{version}.tar.gz"
    with tarfile.open(tmp_path / sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tar.extractall(tmp_path / "src")  # (our own archive)
    for needed in ("pyproject.toml", "CMakeLists.txt", "README.md", "runtime/CMakeLists.txt",
                   "python/xmesh/__init__.py", "python/monarch/actor.py", "python/src/core_module.cpp",
                   "runtime/protocol/errors.def", "workspace_sync/CMakeLists.txt", "debugger/CMakeLists.txt"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("build/", "jupyter_ext/node_modules/"))]
    pybind11_dir = subprocess.run([os.path.join(TOOLS, "pybind11-config"), "--cmakedir"], capture_output=True,
                                  text=True, check=True).stdout.strip()
    r = subprocess.run(["cmake", "-S", str(tmp_path / "src" / f"xmesh-{version}"), "-B", str(tmp_path / "b"),
                        "-G", "Ninja", "-DXMESH_WHEEL=ON", "-DXMESH_BUILD_TESTS=OFF",
                        f"-DPython_EXECUTABLE={pyenv_python(wheel_versions(wheel())[0])}",
                        f"-Dpybind11_DIR={pybind11_dir}"], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Generating done" in r.stdout
