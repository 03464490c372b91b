#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/) in build-fuzz and runs each for SECONDS
# (default 20) from its seed corpus, fuzz/corpus/<target>/ (read only: what
# a run finds goes to a scratch directory). A crash, a sanitizer report, a
# leak, a run over 1 GiB of RSS or a single allocation over 512 MiB fails
# the run; the input is kept as build-fuzz/crash-<target>-*.
#   scripts/fuzz.sh [SECONDS]      fuzz every target
#   scripts/fuzz.sh --seeds        rewrite the seed corpora from the writers
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD:-build-fuzz}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTIDEMARK_FUZZ=ON >/dev/null
if [ "${1:-}" = "--seeds" ]; then
  cmake --build "$build" --target fuzz_seeds -j "${JOBS:-2}"
  "$build/fuzz_seeds"
  exit 0
fi
seconds=${1:-20}
cmake --build "$build" --target fuzz_targets -j "${JOBS:-2}"
status=0
for target in part state records s3_listing sink_records http; do
  scratch=$(mktemp -d)
  echo "fuzz: $target for ${seconds}s" >&2
  if ! "$build/fuzz_$target" -max_total_time="$seconds" -use_value_profile=1 \
      -rss_limit_mb=1024 -malloc_limit_mb=512 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$build/crash-$target-" "$scratch" "fuzz/corpus/$target" \
      2>"$build/fuzz-$target.log"; then
    echo "fuzz: $target FAILED (log: $build/fuzz-$target.log)" >&2
    tail -40 "$build/fuzz-$target.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$build/fuzz-$target.log" |
      tr '\n' ' ' >&2
    echo >&2
  fi
  rm -rf "$scratch"
done
exit $status
