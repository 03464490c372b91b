#!/usr/bin/env bash
# s3rver (npm, tools/s3rver) for the tests, as a daemon that can be stopped
# and started again on the same port and data:
#   scripts/s3rver.sh start DIR PORT   serve DIR/s3 on 127.0.0.1:PORT (bucket
#                                      "tidemark"), returning once it answers
#   scripts/s3rver.sh stop DIR         kill the s3rver that `start DIR` left
#                                      running, if any, and wait until it is gone
# DIR/s3rver.pid names the running server; its output is appended to
# DIR/s3rver.log. Objects are files under DIR/s3, so they survive a stop and
# a start. scripts/test-services.sh runs it; tests run the commands it
# exports (TIDEMARK_TEST_S3_STOP / _START).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# Whether process $1 runs (a zombie does not: nothing may reap a server
# whose starting shell has exited).
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*)}  # the fields after the command's name, state first
  [[ $stat != " Z"* ]]
}

start() {
  local dir=$1 port=$2 pid
  if [ -f "$dir/s3rver.pid" ] && running "$(cat "$dir/s3rver.pid")"; then
    echo "s3rver.sh: already running (pid $(cat "$dir/s3rver.pid"))" >&2
    return 1
  fi
  mkdir -p "$dir/s3"
  # --openssl-legacy-provider: s3rver makes ListObjectsV2 continuation tokens
  # with DES, which OpenSSL 3 (Node >= 17) refuses without it. No standard
  # streams of the caller's: a test's runner waits for its pipes to close.
  node --openssl-legacy-provider "$root/tools/s3rver/node_modules/.bin/s3rver" -d "$dir/s3" \
    -a 127.0.0.1 -p "$port" --silent --no-vhost-buckets --configure-bucket tidemark \
    </dev/null >>"$dir/s3rver.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/s3rver.pid"
  for _ in $(seq 100); do
    if curl -s -o /dev/null "http://127.0.0.1:$port/"; then return 0; fi
    running "$pid" || break
    sleep 0.1
  done
  echo "s3rver.sh: s3rver did not start on port $port:" >&2
  tail -20 "$dir/s3rver.log" >&2
  stop "$dir"
  return 1
}

stop() {
  local dir=$1 pid
  [ -f "$dir/s3rver.pid" ] || return 0
  pid=$(cat "$dir/s3rver.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    running "$pid" || break
    sleep 0.05
  done
  if running "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  while running "$pid"; do sleep 0.05; done
  rm -f "$dir/s3rver.pid"
}

case "${1:-}" in
  start) [ $# -eq 3 ] || { echo "usage: $0 start DIR PORT" >&2; exit 2; }; start "$2" "$3" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2 ;;
esac
