#!/bin/bash
# Sets up (scripts/setup.sh), builds the wheel (scripts/build_wheel.sh) and runs every test
# through ctest. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The wheel for the oldest and newest Python supported, and venvs of both holding it (tests/wheel).
scripts/build_wheel.sh --python 3.10 --python 3.13
/usr/bin/python3 tests/wheel/wheel_envs.py 3.10 3.13
# Each test has its own hang guard (TIMEOUT property, at most 120 s); --timeout is the backstop.
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 120 "$@"
