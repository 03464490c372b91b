#!/usr/bin/env bash
# `make run`: a short end-to-end walk through the CLI on the embedded
# default (files + SQLite in one data directory). It creates a shard,
# appends with explicit frontiers, shows a mismatch being refused, reads
# snapshots and a listen, compacts and inspects the shard, and sinks it
# into files and into Kafka (librdkafka's mock cluster in its own process).
set -euo pipefail
bin=${1:-build/tidemark}
data=${TIDEMARK_DEMO_DATA:-$(mktemp -d /tmp/tidemark-demo.XXXXXX)}
tm() { "$bin" --data "$data" "$@"; }
step() { printf '\n\033[1m$ tidemark %s\033[0m\n' "$*"; }

echo "Tidemark demo; data directory: $data"

step shard create orders
tm shard create orders

step 'append orders --lower 0 --upper 3   (three records at times 0..2)'
tm append orders --lower 0 --upper 3 <<'JSON'
{"key": "order-1", "value": {"item": "apple", "qty": 2}, "time": 0}
{"key": "order-2", "value": {"item": "pear", "qty": 1}, "time": 1}
{"key": "order-3", "value": {"item": "fig", "qty": 7}, "time": 2}
JSON

step 'append orders --lower 3 --upper 5   (order-2 retracted and replaced at time 4)'
tm append orders --lower 3 --upper 5 <<'JSON'
{"key": "order-2", "value": {"item": "pear", "qty": 1}, "time": 4, "diff": -1}
{"key": "order-2", "value": {"item": "pear", "qty": 3}, "time": 4}
JSON

step 'append orders --lower 3 --upper 6   (a stale writer: refused with exit 3)'
set +e
echo '{"key": "late", "value": 1, "time": 3}' | tm append orders --lower 3 --upper 6 2>&1
echo "exit status: $?"
step 'append orders --lower 5 --upper 6   (a malformed line: nothing appended, exit 1)'
printf '{"key": "a", "value": 1, "time": 5}\n{"key": "b", "value": \n' | tm append orders --lower 5 --upper 6 2>&1
echo "exit status: $?"
set -e

step 'append orders   (managed: no times; the appender picks one and prints it)'
tm append orders <<'JSON'
{"key": "order-4", "value": {"item": "kiwi", "qty": 4}}
JSON

step snapshot orders --as-of 2
tm snapshot orders --as-of 2
step 'snapshot orders   (latest complete time: upper - 1)'
tm snapshot orders
step "listen orders --resume-progress 0 --until 5   (every change from time 0, then progress)"
tm listen orders --resume-progress 0 --until 5
step 'compact orders   (appends already compact as they go; this runs a pass and GC by hand)'
tm compact orders
step shard inspect orders --json
tm shard inspect orders --json
step shard list
tm shard list

out=$data/sink-out
step "sink run orders --to file://$out --as-of 2 --until 5   (upsert json files)"
tm sink run orders --to "file://$out" --as-of 2 --until 5
for f in "$out"/*.json; do echo "== $(basename "$f")"; cat "$f"; done

mock=$(dirname "$bin")/tidemark-kafka-mock
brokers_file=$data/kafka-brokers
"$mock" --topic orders:3 --topic orders-progress:1 >"$brokers_file" &
mock_pid=$!
trap 'kill $mock_pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do [ -s "$brokers_file" ] && break; sleep 0.1; done
brokers=$(cat "$brokers_file")
step "sink run orders --to kafka://$brokers/orders --envelope debezium --sink-name to-kafka --as-of 4 --until 5   (a mock broker)"
tm sink run orders --to "kafka://$brokers/orders" --envelope debezium --sink-name to-kafka --as-of 4 --until 5 2>&1 |
  grep -v '^%' || true
