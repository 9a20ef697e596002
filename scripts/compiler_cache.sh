#!/bin/bash
# Prints the CMake compiler launcher (CMAKE_CXX_COMPILER_LAUNCHER, a ;-list) that puts the
# compiler behind ccache, or nothing where ccache is not installed. One cache for build/ and the
# wheel's build (build/wheel/<tag>, scripts/build_wheel.sh): both compile the runtime's sources
# with the same flags, so the wheel takes build/'s objects instead of compiling them again.
#   base_dir = build/: paths inside the build trees (generated headers) are hashed relative to
#     each tree, so both trees' commands read alike; the sources' absolute paths already do.
#   hash_dir off: -g would otherwise hash each tree's working directory (the debug info is
#     stripped from what a wheel installs).
# Usage: scripts/compiler_cache.sh [BUILD_DIR]   (default: build)
set -euo pipefail
command -v ccache > /dev/null || exit 0
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
mkdir -p "$build"
build="$(cd "$build" && pwd)"
echo "/usr/bin/env;CCACHE_DIR=$build/ccache;CCACHE_BASEDIR=$build;CCACHE_NOHASHDIR=1;CCACHE_MAXSIZE=4G;$(command -v ccache)"
