#!/usr/bin/env bash
# bench/alternate_http.sh on the shared backends: two tidemark binaries
# taking turns as `tidemark serve --blob s3://... --consensus
# postgres://...` on the PostgreSQL and s3rver of scripts/test-services.sh
# (fsync on, synchronous_commit on), driven by tidemark-peers
# (tidemark-http at 1 and 100 clients, or the list in $CLIENTS, SECONDS
# each), one line per binary, round and client count, with the consensus
# versions the server wrote meanwhile (rows inserted into PostgreSQL's
# consensus table: the appends' commits and compaction's, GC's and the
# leases' writes).
#
#   bench/alternate_shared.sh OLD_BINARY NEW_BINARY [ROUNDS] [SECONDS]
#
# Each run starts on an empty consensus table and a blob prefix of its
# own. tidemark-peers comes from $PEERS (default build/tidemark-peers).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
old=$(realpath "$1") new=$(realpath "$2") rounds=${3:-3} seconds=${4:-8}
peers=$(realpath "${PEERS:-$root/build/tidemark-peers}")
clients=${CLIENTS:-1,100}
for binary in "$old" "$new" "$peers"; do
  [ -x "$binary" ] || { echo "alternate_shared.sh: $binary is not an executable" >&2; exit 2; }
done
if [ -z "${TIDEMARK_TEST_POSTGRES:-}" ]; then
  exec bash "$root/scripts/test-services.sh" env PEERS="$peers" CLIENTS="$clients" \
    bash "$0" "$old" "$new" "$rounds" "$seconds"
fi
. "$root/bench/serve_port.sh"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
pg=$TIDEMARK_TEST_POSTGRES
versions() {
  psql "$pg" -Atc "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables
                   WHERE relname = 'tidemark_consensus'"
}
for round in $(seq 1 "$rounds"); do
  for which in old new; do
    binary=$old
    [ "$which" = new ] && binary=$new
    dir=$(mktemp -d "${TMPDIR:-/tmp}/tidemark-alternate.XXXXXX")
    psql "$pg" -qc "TRUNCATE tidemark_consensus, tidemark_consensus_heads" 2>/dev/null || true
    blob=${TIDEMARK_TEST_S3/\/test\?//alternate-$$-$round-$which?}
    "$binary" --data "$dir/data" --blob "$blob" --consensus "$pg" \
      serve --listen 127.0.0.1:0 --max-connections 2000 2>"$dir/serve.err" &
    pid=$!
    port=$(serve_port "$dir/serve.err")
    curl -sf -X POST "127.0.0.1:$port/v1/shards" -d '{"name": "peers"}' >/dev/null
    for count in ${clients//,/ }; do
      before=$(versions)
      "$peers" --dir "$dir/scratch" --systems tidemark-http --tidemark "127.0.0.1:$port" \
        --tidemark-pid "$pid" --clients "$count" --seconds "$seconds" --rounds 1 \
        --json "$dir/out.json" >"$dir/peers.out" 2>&1 || { cat "$dir/peers.out" >&2; exit 1; }
      after=$(versions)
      python3 - "$which" "$round" "$dir/out.json" "$((after - before))" <<'PY'
import json, sys
for row in json.load(open(sys.argv[3]))["rows"]:
    print("%s round %s: %4d clients %7d records/s  p50 %.3f ms  p99 %.3f ms  "
          "%s consensus versions written" %
          (sys.argv[1], sys.argv[2], row["clients"], row["records_per_s"], row["p50_ms"],
           row["p99_ms"], sys.argv[4]))
PY
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
  done
done
