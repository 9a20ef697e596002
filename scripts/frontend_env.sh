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
# The xmesh panel (jupyter_ext/): its TypeScript built with the JupyterLab builder (npm packages
# pinned by yarn.lock), then the Python package (server extension + prebuilt labextension)
# installed into the same environment. Only when its sources changed.
EXT=jupyter_ext
EXT_STAMP=$VENV/installed-jupyter-ext.sha
ext_sha=$(cd "$EXT" && git ls-files -co --exclude-standard -- . ':!node_modules' | LC_ALL=C sort | xargs sha256sum | sha256sum)
if [[ ! -f $EXT_STAMP || "$(cat "$EXT_STAMP")" != "$ext_sha" ]]; then
  echo "setup: building the xmesh panel (jupyter_ext) into $VENV"
  (
    cd "$EXT"
    export PATH="$PWD/../$VENV/bin:$PATH"
    jlpm install --immutable && jlpm run build && "../$VENV/bin/python" -m pip install -q --disable-pip-version-check .
  ) > build/jupyter-ext-build.log 2>&1 || {
    tail -30 build/jupyter-ext-build.log >&2
    exit 1
  }
  echo "$ext_sha" > "$EXT_STAMP"
fi
