#!/usr/bin/env bash
# Peak RSS of `tidemark serve --memory-limit 64 MiB` under large-snapshot's
# ingest shape: 4 clients, all-or-nothing bodies of 100,000 small records.
# usage: bench/ingest_rss.sh BINARY [BODIES_PER_CLIENT]  (default 25)
set -euo pipefail
bin=$1; bodies=${2:-25}
dir=$(mktemp -d)
port=$((20000 + RANDOM % 10000))
python3 - "$dir/body" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(100000):
        f.write('{"key":"r%d","value":%d}\n' % (i, i))
PY
"$bin" --data "$dir/data" serve --listen 127.0.0.1:$port --memory-limit 67108864 > "$dir/serve.log" 2>&1 &
pid=$!
for i in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$port/v1/shards" && break; sleep 0.1; done
curl -s -X POST "http://127.0.0.1:$port/v1/shards" -d '{"name":"large"}' > /dev/null
start=$(date +%s.%N)
clients=()
for c in 1 2 3 4; do
  # Each body is retried until it is appended (a full server answers 503).
  ( for b in $(seq "$bodies"); do
      until code=$(curl -s -o /dev/null -w '%{http_code}' -X POST --data-binary @"$dir/body" \
          "http://127.0.0.1:$port/v1/shards/large/append") && [ "$code" = 200 ]; do sleep 0.05; done
    done ) &
  clients+=($!)
done
wait "${clients[@]}"
end=$(date +%s.%N)
grep VmHWM /proc/$pid/status
awk -v a="$start" -v b="$end" 'BEGIN { printf "seconds %.1f\n", b - a }'
curl -s "http://127.0.0.1:$port/v1/shards/large" | head -c 300; echo
kill $pid; wait $pid 2>/dev/null || true
rm -rf "$dir"
