#!/usr/bin/env bash
# Drives `tidemark serve` with wrk: 1000 connections, one small record per
# request, distinct keys (append.lua), on the embedded default in a scratch
# directory. Prints wrk's report, the server's peak RSS (VmHWM) and the
# rows in the shard afterwards.
#
#   bench/wrk/run.sh [as-is|blob-latency|records50] [DURATION] [CONNECTIONS]
#
#   as-is         the server as shipped (byte-bounded appender queue)
#   blob-latency  every blob call delayed 200 ms (--inject-blob-latency-ms 200)
#   records50     the appender queue bounded by 50 records instead of bytes
#
# TIDEMARK_BIN overrides the binary (default build/tidemark).
set -euo pipefail
mode=${1:-as-is}
duration=${2:-30s}
connections=${3:-1000}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../serve_port.sh"
bin=${TIDEMARK_BIN:-$here/../../build/tidemark}
extra=()
case $mode in
  as-is) ;;
  blob-latency) extra=(--inject-blob-latency-ms 200) ;;
  records50) extra=(--appender-queue records:50) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
command -v wrk >/dev/null || { echo "wrk is not installed (scripts/install-deps.sh)" >&2; exit 1; }
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

dir=$(mktemp -d /tmp/tidemark-wrk.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

# Starts the server with the given flags; sets pid and url.
start_server() {
  # Room for every wrk connection and the script's own requests.
  "$bin" --data "$dir" serve --listen 127.0.0.1:0 --max-connections $((connections + 16)) "$@" \
    2>"$dir/serve.err" &
  pid=$!
  local port
  port=$(serve_port "$dir/serve.err") || exit 1
  url=http://127.0.0.1:$port
}

start_server "${extra[@]}"
curl -sf -X POST "$url/v1/shards" -d '{"name":"bench"}' >/dev/null

echo "mode $mode, $connections connections, $duration, server pid $pid on $url"
wrk -t2 -c"$connections" -d"$duration" --timeout 10s --latency -s "$here/append.lua" "$url"
echo "server peak RSS: $(grep VmHWM /proc/$pid/status | awk '{print $2, $3}')"
curl -sf "$url/metrics" | grep -E "^tidemark_appender_(batches|commits|records)|tidemark_append_commit_seconds_(sum|count)|pool_peak" || true
# Count the rows with a server without injected latency (a snapshot reads
# every part, one block per blob call).
stop_started=$(date +%s.%N)
kill -TERM "$pid"; wait "$pid" || true
echo "server stopped $(awk -v a="$stop_started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after SIGTERM"
start_server
rows=$(curl -sf "$url/v1/shards/bench/snapshot" | wc -l)
echo "rows in the shard: $rows (wrk counts only the answers it read; requests in flight at its end commit too)"
