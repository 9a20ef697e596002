#!/bin/bash
# Sets up (scripts/setup.sh) and runs the quickstart: procs, actors, calls, slicing, errors.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== examples/quickstart.py"
/usr/bin/python3 examples/quickstart.py
