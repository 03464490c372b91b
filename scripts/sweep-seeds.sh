#!/usr/bin/env bash
# Runs the model test, the crash tests and the short bounded-memory
# scenarios under many random configurations (shard/random_config.h: part,
# block and batch sizes, compaction, injected latencies and blob/consensus
# faults, all drawn from a seed), and prints a table of what passed.
#   scripts/sweep-seeds.sh 20            seeds 1..20
#   scripts/sweep-seeds.sh 11 42 7       these seeds
# A failed run's log stays in $TMPDIR/tidemark-sweep/<what>-<seed>.log; the
# same seed reruns it: TIDEMARK_RANDOM_CONFIG=<seed> build/model_test, or
# scenarios/run --seed <seed> --random-config <scenario>.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${TIDEMARK_BUILD_DIR:-$root/build}"
if [ $# -eq 1 ] && [ "$1" -le 1000 ] 2>/dev/null; then
  seeds=$(seq 1 "$1")
else
  seeds="$*"
fi
[ -n "$seeds" ] || { echo "usage: $0 COUNT | SEED..." >&2; exit 2; }
ninja -C "$build" model_test crash_test tidemark tidemark-scenarios >/dev/null || exit 1
logs="${TMPDIR:-/tmp}/tidemark-sweep"
mkdir -p "$logs"
failed=0
printf '%-6s %-16s %-16s %-18s %-18s %s\n' seed model_test crash_test hot-key-fanout sink-restart seconds
for seed in $seeds; do
  started=$(date +%s)
  row=()
  run() {  # run NAME COMMAND...: PASS or FAIL, the log kept on failure
    local name=$1; shift
    if "$@" >"$logs/$name-$seed.log" 2>&1; then
      rm -f "$logs/$name-$seed.log"
      row+=(PASS)
    else
      row+=(FAIL)
      failed=$((failed + 1))
    fi
  }
  run model_test env TIDEMARK_RANDOM_CONFIG="$seed" "$build/model_test"
  run crash_test env TIDEMARK_RANDOM_CONFIG="$seed" "$build/crash_test"
  run hot-key-fanout "$build/tidemark-scenarios" --seed "$seed" --random-config hot-key-fanout
  run sink-restart "$build/tidemark-scenarios" --seed "$seed" --random-config sink-restart
  printf '%-6s %-16s %-16s %-18s %-18s %s\n' "$seed" "${row[@]}" $(($(date +%s) - started))
done
echo "$failed failed; logs of failures in $logs"
[ "$failed" -eq 0 ]
