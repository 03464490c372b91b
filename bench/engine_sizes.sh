#!/usr/bin/env bash
# The engine bench's snapshot at several data sizes: its peak RSS and rate
# against the number of updates in the shard.
#
#   bench/engine_sizes.sh [--updates 1000000,3000000,10000000] [--out FILE]
#
# Builds tidemark (build/), runs `build/tidemark bench engine --json
# --updates N` once for each N, one after the other, and writes every run's
# JSON with its N and command, and the commit and date, to
# docs/data/engine-memory.json, then renders docs/plots/engine-memory.png
# from it (scripts/plots.py). With --out FILE it writes FILE instead and
# renders nothing. Peak RSS is the snapshot process's own (VmHWM), so other
# load on the machine does not move it; the rate it does.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
updates=1000000,3000000,10000000
out=
command_line=bench/engine_sizes.sh
while [ $# -gt 0 ]; do
  case $1 in
    --updates) updates=$2; command_line="$command_line --updates $2"; shift 2 ;;
    --out) out=$2; command_line="$command_line --out $2"; shift 2 ;;
    *) sed -n '2,13p' "$0" >&2; exit 2 ;;
  esac
done
for n in ${updates//,/ }; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "engine_sizes: --updates takes whole numbers, not $n" >&2; exit 2; }
done
docs=
[ -n "$out" ] || { out=$root/docs/data/engine-memory.json; docs=1; }

[ -f "$root/build/build.ninja" ] ||
  cmake -G Ninja -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" --target tidemark >/dev/null

commit=$(git -C "$root" describe --always --dirty --exclude '*' 2>/dev/null) || commit=
commit_json=null
[ -z "$commit" ] || commit_json="\"$commit\""
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
runs=
for n in ${updates//,/ }; do
  echo "engine_sizes: build/tidemark bench engine --json --updates $n" >&2
  result=$("$root/build/tidemark" bench engine --json --updates "$n")
  echo "$result" >&2
  [ -z "$runs" ] || runs="$runs,"
  runs="$runs
    {\"updates\": $n, \"command\": \"build/tidemark bench engine --json --updates $n\",
     \"result\": $result}"
done

mkdir -p "$(dirname "$out")"
# The aims are issue #2's, drawn on the chart for reference.
cat >"$out.partial" <<EOF
{
  "command": "$command_line",
  "commit": $commit_json,
  "date": "$date",
  "aims": {"snapshot_peak_rss_mib": 64, "snapshot_updates_per_s": 5000000,
           "source": "issue #2: a 10,000,000-update snapshot under 64 MiB peak RSS, at least 5 M updates/s on one core"},
  "runs": [$runs
  ]
}
EOF
python3 -m json.tool "$out.partial" >/dev/null ||
  { echo "engine_sizes: $out.partial is not valid JSON" >&2; exit 1; }
mv "$out.partial" "$out"
echo "engine_sizes: wrote $out" >&2
if [ -n "$docs" ]; then
  python3 "$root/scripts/plots.py" --data "$root/docs/data" --out "$root/docs/plots"
fi
