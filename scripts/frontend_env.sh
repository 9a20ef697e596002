#!/bin/bash
# The front ends users run, JupyterLab 4 and Notebook 7 from PyPI, and the browser tests' driver
# (Playwright, which drives Debian's Chromium), in a virtual environment of Debian's Python:
# build/frontend. Run by scripts/setup.sh; quick when the pinned requirements did not change.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build/frontend
REQUIREMENTS=scripts/frontend-requirements.txt
if [[ ! -x $VENV/bin/python ]]; then
  /usr/bin/python3 -m venv "$VENV"
fi
if ! cmp -s "$REQUIREMENTS" "$VENV/installed-requirements.txt"; then
  echo "setup: installing the front ends (JupyterLab, Notebook 7, Playwright) into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS" > build/frontend-pip.log 2>&1 || {
    tail -30 build/frontend-pip.log >&2
    exit 1
  }
  cp "$REQUIREMENTS" "$VENV/installed-requirements.txt"
fi
