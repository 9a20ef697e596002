#!/bin/bash
# Sets up (scripts/setup.sh) and runs the quickstart twice: as a script, then as a notebook on
# the xmesh kernel (headless, `xmesh run`). Never waits for input.
#   scripts/demo.sh --serve   afterwards serves the quickstart notebook in JupyterLab 4 (Notebook 7
#                             at /tree), with the xmesh kernel as the default
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== examples/quickstart.py"
/usr/bin/python3 examples/quickstart.py
echo "== xmesh run examples/quickstart.ipynb"
xmesh run examples/quickstart.ipynb -o /tmp/xmesh-quickstart.out.ipynb
if [[ "${1:-}" == "--serve" ]]; then
  # build/frontend: JupyterLab 4 and Notebook 7 from PyPI (scripts/frontend_env.sh). The kernel
  # is the installed one (setup installs as root), else the build tree's.
  [[ $EUID -eq 0 ]] || export JUPYTER_PATH="$PWD/build/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
  echo "== JupyterLab (kernel: Python 3 (xmesh); Notebook 7 at /tree); open the URL below; Ctrl-C stops it"
  exec build/frontend/bin/jupyter-lab --no-browser --ip=127.0.0.1 --allow-root \
    --ServerApp.root_dir=examples --MappingKernelManager.default_kernel_name=xmesh \
    --LabApp.default_url=/lab/tree/quickstart.ipynb
fi
