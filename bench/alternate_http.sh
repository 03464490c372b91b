#!/usr/bin/env bash
# Two tidemark binaries taking turns under the same HTTP load, to tell a
# change from the VM's drift: each round starts a fresh `tidemark serve`
# of OLD, then of NEW, on the embedded default in a scratch directory,
# and drives it with tidemark-peers (tidemark-http at 1 and 100 clients,
# or the list in $CLIENTS, SECONDS each), printing one line per binary,
# round and client count, with the server's CPU per record over the round
# (its utime + stime, which includes the idle moments between client counts).
#
#   bench/alternate_http.sh OLD_BINARY NEW_BINARY [ROUNDS] [SECONDS]
#
# tidemark-peers comes from $PEERS (default build/tidemark-peers; `cmake
# --build build --target tidemark-peers`). The port is $PORT (27001).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
old=$1 new=$2 rounds=${3:-3} seconds=${4:-6}
peers=${PEERS:-build/tidemark-peers}
port=${PORT:-27001}
clients=${CLIENTS:-1,100}
max_clients=$(tr ',' '\n' <<<"$clients" | sort -n | tail -1)
for binary in "$old" "$new" "$peers"; do
  [ -x "$binary" ] || { echo "alternate_http.sh: $binary is not an executable" >&2; exit 2; }
done
for round in $(seq 1 "$rounds"); do
  for which in old new; do
    binary=$old
    [ "$which" = new ] && binary=$new
    dir=$(mktemp -d "${TMPDIR:-/tmp}/tidemark-alternate.XXXXXX")
    "$binary" --data "$dir/data" serve --listen "127.0.0.1:$port" \
      --max-connections $((max_clients + 20)) >"$dir/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
    curl -sf -X POST "127.0.0.1:$port/v1/shards" -d '{"name": "peers"}' >/dev/null
    "$peers" --dir "$dir/scratch" --systems tidemark-http --tidemark "127.0.0.1:$port" \
      --tidemark-pid "$pid" --clients "$clients" --seconds "$seconds" --rounds 1 \
      --json "$dir/out.json" >"$dir/peers.out" 2>&1 || { cat "$dir/peers.out" >&2; exit 1; }
    ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    python3 - "$which" "$round" "$dir/out.json" "$ticks" "$seconds" "$(getconf CLK_TCK)" <<'PY'
import json, sys
rows = json.load(open(sys.argv[3]))["rows"]
records = sum(row["records_per_s"] for row in rows) * float(sys.argv[5])
cpu_us = int(sys.argv[4]) / int(sys.argv[6]) * 1e6
for row in rows:
    print("%s round %s: %4d clients %7d records/s  p50 %.3f ms  p99 %.3f ms" %
          (sys.argv[1], sys.argv[2], row["clients"], row["records_per_s"], row["p50_ms"],
           row["p99_ms"]))
print("%s round %s: server CPU %.1f us per record over the round" %
      (sys.argv[1], sys.argv[2], cpu_us / max(records, 1)))
PY
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
  done
done
