#!/bin/bash
# Installs what xmesh needs (Debian packages), builds into build/ and installs (cmake --install).
# Idempotent and quick when nothing changed. Run as root on a fresh Debian 12 machine.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  # one compile of the runtime for build/ and the wheel (scripts/compiler_cache.sh)
  ccache
  libzmq3-dev cppzmq-dev nlohmann-json3-dev pybind11-dev catch2 libsodium-dev libssl-dev
  libibverbs-dev libxxhash-dev libzstd-dev
  python3 python3-dev python3-venv
  python3-cloudpickle python3-numpy python3-torch
  python3-pytest python3-pytest-timeout python3-pexpect mypy
  python3-ipyparallel python3-distributed python3-tqdm
  procps iproute2 rsync
  # the panel's front end (jupyter_ext), built with the JupyterLab builder
  nodejs
  # namespace hosts behind a firewall (tests/python/test_tcp_hosts.py)
  nftables
  # jobs on schedulers: a real SLURM cluster and SSH hosts in the tests (tests/python/test_jobs.py)
  slurm-wlm munge openssh-server openssh-client
  # KubernetesJob: the official Kubernetes client (tests/python/test_kubernetes.py replays the API)
  python3-kubernetes python3-yaml
  # the browser tests: Debian's Chromium, driven by Playwright (build/frontend)
  chromium fonts-dejavu-core
  # the fuzzers (tests/fuzz): clang's libFuzzer and sanitizers
  clang-14 libclang-rt-14-dev
  # the kernel (xeus 2.4, IPython with xeus-python-shell's helpers, debugpy, comm) and the Jupyter
  # tools around it
  xeus-dev python3-xeus-python-shell python3-ipython python3-debugpy python3-comm
  python3-jupyter-client jupyter-client python3-jupyter-kernel-test python3-nbclient python3-nbformat
  python3-nbconvert jupyter-nbconvert python3-notebook jupyter-notebook python3-ipykernel
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $EUID -ne 0 ]]; then
    echo "setup: missing Debian packages (${missing[*]}); run as root to install them" >&2
    exit 1
  fi
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" > /tmp/xmesh-apt.log 2>&1 || {
    tail -30 /tmp/xmesh-apt.log >&2
    exit 1
  }
fi

launcher=$(scripts/compiler_cache.sh build)
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr/local \
    -DCMAKE_CXX_COMPILER_LAUNCHER:STRING="$launcher"
elif ! grep -qxF "CMAKE_CXX_COMPILER_LAUNCHER:STRING=$launcher" build/CMakeCache.txt; then
  cmake build -DCMAKE_CXX_COMPILER_LAUNCHER:STRING="$launcher" > /dev/null  # a tree made before the cache
fi
# The front ends (downloads, mostly: JupyterLab, Playwright, the panel's npm packages) are set up
# while the C++ compiles.
scripts/frontend_env.sh > build/frontend-env.log 2>&1 &
frontend=$!
trap 'kill "$frontend" 2> /dev/null || true' EXIT
cmake --build build -j "$(nproc)"
tests/fuzz/build.sh build
if ! wait "$frontend"; then
  cat build/frontend-env.log >&2
  echo "setup: setting up the front ends failed (scripts/frontend_env.sh)" >&2
  exit 1
fi
trap - EXIT
cat build/frontend-env.log
if [[ $EUID -eq 0 ]]; then
  cmake --install build > build/install.log
  ldconfig
else
  echo "setup: not root: built in build/ but not installed (tests use the build tree)"
fi
