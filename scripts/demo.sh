#!/bin/bash
# Sets up (scripts/setup.sh) and runs the quickstart twice: as a script, then as a notebook on
# the xmesh kernel (headless, `xmesh run`). Never waits for input.
#   scripts/demo.sh --serve   afterwards starts the notebook server on the quickstart notebook
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== examples/quickstart.py"
/usr/bin/python3 examples/quickstart.py
echo "== xmesh run examples/quickstart.ipynb"
xmesh run examples/quickstart.ipynb -o /tmp/xmesh-quickstart.out.ipynb
if [[ "${1:-}" == "--serve" ]]; then
  echo "== jupyter notebook (kernel: Python 3 (xmesh)); Ctrl-C stops it"
  exec jupyter notebook --no-browser --ip=127.0.0.1 --allow-root examples/quickstart.ipynb
fi
