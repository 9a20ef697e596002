#!/bin/bash
# Runs each fuzzer for SECONDS (default 15) from its seeds and from what earlier runs kept, then
# replays every regression input (regressions/<target>/ here). A crash fails the run; its input
# is kept in BUILD/fuzz/crashes/ (fix it, then add the input to regressions/<target>/).
# With FUZZ_RUNS=<n> (CI) each target runs n inputs from a fixed seed instead: the same inputs
# on every machine, so that CI does not turn red by chance; exploring is what SECONDS is for.
# Usage: tests/fuzz/run.sh [BUILD_DIR] [SECONDS] [TARGET...]   (no TARGET: every one; ctest runs
# each target as an entry of its own, so that each has the whole hang guard)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:-$here/../../build}" && pwd)"
seconds="${2:-15}"
shift $(( $# < 2 ? $# : 2 ))
targets=("$@")
out="$build/fuzz"
for f in fuzz_wire fuzz_ring fuzz_lane fuzz_sync_receiver venv/bin/python; do
  [[ -x "$out/$f" ]] || { echo "fuzz: $out/$f is missing: run tests/fuzz/build.sh $build" >&2; exit 1; }
done
mkdir -p "$out/crashes"
limits=(-timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1)
# FUZZ_RUNS is for the C++ targets; the Python one runs a hundredth as fast.
declare -A scale=([fuzz_wire]=100 [fuzz_ring]=100 [fuzz_lane]=50 [fuzz_sync_receiver]=100 [fuzz_debug_lines]=1)
chosen() {  # target: is it to run?
  [[ ${#targets[@]} -eq 0 ]] && return 0
  local t
  for t in "${targets[@]}"; do [[ "$t" == "$1" ]] && return 0; done
  return 1
}
for t in "${targets[@]}"; do
  [[ -v "scale[$t]" ]] || { echo "fuzz: no target $t (there are: ${!scale[*]})" >&2; exit 2; }
done
run() {  # target, corpus name, command...
  local target=$1 name=$2
  shift 2
  chosen "$target" || return 0
  mkdir -p "$out/corpus/$name"
  local budget=(-max_total_time="$seconds") inputs=("$out/corpus/$name" "$out/seeds/$name")
  if [[ -n "${FUZZ_RUNS:-}" ]]; then  # the seeds alone: what earlier local runs kept differs
    budget=(-runs="$(( FUZZ_RUNS * ${scale[$target]:-1} / 100 ))" -seed=1)
    inputs=("$out/seeds/$name")
  fi
  echo "fuzz: $target, ${budget[*]}"
  "$@" "${budget[@]}" "${limits[@]}" -artifact_prefix="$out/crashes/$target-" "${inputs[@]}" \
    > "$out/$target.log" 2>&1 || {
    tail -40 "$out/$target.log" >&2
    echo "fuzz: $target crashed; the input is in $out/crashes/" >&2
    exit 1
  }
  grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$out/$target.log" | tail -1
  local regressions=("$here/regressions/$target"/*)
  if [[ -e "${regressions[0]}" ]]; then
    "$@" "${limits[@]}" "${regressions[@]}" > "$out/$target.regressions.log" 2>&1 || {
      tail -40 "$out/$target.regressions.log" >&2
      echo "fuzz: a regression input of $target crashes again" >&2
      exit 1
    }
    echo "fuzz: $target: ${#regressions[@]} regression inputs pass"
  fi
}
run fuzz_wire wire "$out/fuzz_wire"
run fuzz_ring ring "$out/fuzz_ring"
run fuzz_lane lane "$out/fuzz_lane"
run fuzz_sync_receiver sync "$out/fuzz_sync_receiver"
PYTHONPATH="$build/python" run fuzz_debug_lines debug "$out/venv/bin/python" "$here/fuzz_debug_lines.py"
