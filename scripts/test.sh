#!/bin/bash
# Sets up (scripts/setup.sh) and runs every test through ctest. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Each test has its own hang guard (TIMEOUT property, at most 120 s); --timeout is the backstop.
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 120 "$@"
