#!/bin/bash
# Builds the fuzzers (README.md here) into BUILD/fuzz: the C++ targets with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer, their seed corpora from real messages, and a
# virtual environment with atheris for the Python target. Run by scripts/setup.sh.
# Usage: tests/fuzz/build.sh [BUILD_DIR]   (default: build)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:-$here/../../build}" && pwd)"
out="$build/fuzz"
if ! command -v clang++-14 > /dev/null; then
  echo "fuzz: clang++-14 is not installed: the fuzzers are not built" >&2
  exit 1
fi
mkdir -p "$out"
if [[ ! -f "$out/build.ninja" ]]; then
  cmake -S "$here" -B "$out" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DXMESH_BUILD_DIR="$build" > "$out/configure.log"
fi
ninja -C "$out" > "$out/build.log" || { tail -30 "$out/build.log" >&2; exit 1; }
rm -rf "$out/seeds"
"$out/fuzz_corpus" "$out/seeds"
if [[ ! -x "$out/venv/bin/python" ]] || ! "$out/venv/bin/python" -c "import atheris" 2> /dev/null; then
  rm -rf "$out/venv"
  # Debian's packages (cloudpickle, numpy) stay visible: xmesh imports them.
  /usr/bin/python3 -m venv --system-site-packages "$out/venv"
  "$out/venv/bin/pip" install -q atheris > "$out/pip.log" 2>&1 || { tail -20 "$out/pip.log" >&2; exit 1; }
fi
PYTHONPATH="$build/python" "$out/venv/bin/python" "$here/fuzz_debug_lines.py" --seed "$out/seeds/debug"
echo "fuzz: built in $out"
