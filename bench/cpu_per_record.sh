#!/usr/bin/env bash
# The server's CPU and system calls per record under HTTP load: starts a
# fresh `tidemark serve` on the embedded default in a scratch directory,
# drives it with tidemark-peers (tidemark-http, CLIENTS clients, 12 s), and
# over 5 s in the middle of the run reads the server's utime + stime
# (/proc/PID/stat) and counts its system calls (`perf stat`). Both are
# divided by the records of 5 s at the run's records/s. Prints one line.
#
#   bench/cpu_per_record.sh CLIENTS [TIDEMARK_BINARY]
#
# tidemark-peers comes from $PEERS (default build/tidemark-peers); the port
# is $PORT (27001). Needs perf.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
clients=$1
here=$(cd "$(dirname "$0")" && pwd)
binary=${2:-$here/../build/tidemark}
peers=${PEERS:-$here/../build/tidemark-peers}
port=${PORT:-27001}
dir=$(mktemp -d "${TMPDIR:-/tmp}/tidemark-cpu.XXXXXX")
"$binary" --data "$dir/data" serve --listen "127.0.0.1:$port" \
  --max-connections $((clients + 20)) >"$dir/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
curl -sf -X POST "127.0.0.1:$port/v1/shards" -d '{"name": "peers"}' >/dev/null
"$peers" --dir "$dir/scratch" --systems tidemark-http --tidemark "127.0.0.1:$port" \
  --tidemark-pid "$pid" --clients "$clients" --seconds 12 --rounds 1 \
  --json "$dir/out.json" >"$dir/peers.out" 2>&1 &
load=$!
sleep 4
before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
perf stat -o "$dir/stat.txt" -p "$pid" -e 'syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_futex,syscalls:sys_enter_fdatasync' -- sleep 5
after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
wait $load || { cat "$dir/peers.out" >&2; exit 1; }
python3 - "$dir/out.json" "$dir/stat.txt" "$before" "$after" "$(getconf CLK_TCK)" "$clients" <<'PY'
import json, re, sys
out, stat, before, after, hz, clients = sys.argv[1:]
rate = json.load(open(out))["rows"][0]["records_per_s"]
records = rate * 5
calls = {}
for line in open(stat):
    m = re.match(r'\s*([\d,]+)\s+syscalls:sys_enter_(\w+)', line)
    if m:
        calls[m.group(2)] = int(m.group(1).replace(',', '')) / records
cpu_us = (int(after) - int(before)) / int(hz) * 1e6 / records
print('clients %s: %.0f records/s, server CPU %.1f us a record; per record %s' %
      (clients, rate, cpu_us, ' '.join('%s %.2f' % kv for kv in calls.items())))
PY
