#!/usr/bin/env bash
# Small appends over HTTP on the shared backends: `tidemark serve` on
# PostgreSQL (consensus) and s3rver (blob), one managed append of one
# 100-byte record per request, as bench/peers/run.sh measures the embedded
# default:
#
#   bench/peers/shared.sh [--clients 1,100] [--seconds S] [--rounds N]
#
# Starts PostgreSQL and s3rver through scripts/test-services.sh (fsync on,
# synchronous_commit on: a commit is durable when PostgreSQL answers), and
# prints tidemark-peers' lines and table (records/s, p50, p99). With inline
# parts a small append's part travels inside its PostgreSQL commit, so the
# acknowledged path holds no S3 request; compaction writes to s3rver in the
# background.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/bench/serve_port.sh"
clients=1,100
seconds=10
rounds=3
while [ $# -gt 0 ]; do
  case $1 in
    --clients) clients=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) sed -n '2,14p' "$0" >&2; exit 2 ;;
  esac
done

if [ -z "${TIDEMARK_TEST_POSTGRES:-}" ]; then
  bash "$root/scripts/install-deps.sh" peers
  [ -f "$root/build/build.ninja" ] ||
    cmake -G Ninja -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake "$root/build" >/dev/null
  cmake --build "$root/build" --target tidemark tidemark-peers >/dev/null
  exec bash "$root/scripts/test-services.sh" bash "$0" --clients "$clients" \
    --seconds "$seconds" --rounds "$rounds"
fi

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
work=$(mktemp -d /tmp/tidemark-shared.XXXXXX)
serve_pid=
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
blob=${TIDEMARK_TEST_S3/\/test\?//bench-$$?}
"$root/build/tidemark" --data "$work/data" --blob "$blob" --consensus "$TIDEMARK_TEST_POSTGRES" \
  serve --listen 127.0.0.1:0 --max-connections 2000 2>"$work/serve.err" &
serve_pid=$!
port=$(serve_port "$work/serve.err")
curl -sf -X POST "http://127.0.0.1:$port/v1/shards" -d '{"name":"peers"}' >/dev/null
mkdir -p "$work/scratch"
"$root/build/tidemark-peers" --dir "$work/scratch" --systems tidemark-http --clients "$clients" \
  --seconds "$seconds" --rounds "$rounds" --tidemark "127.0.0.1:$port" \
  --tidemark-pid "$serve_pid" --markdown "$work/table.md" \
  --tidemark-durability "tidemark serve on PostgreSQL (fsync on, synchronous_commit on) and s3rver: a small append's part travels inline in its PostgreSQL commit; a larger one is PUT to S3 first" \
  --command "bench/peers/shared.sh --clients $clients --seconds $seconds --rounds $rounds"
cat "$work/table.md"
curl -s "http://127.0.0.1:$port/v1/shards/peers" | head -c 600
echo
