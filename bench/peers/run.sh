#!/usr/bin/env bash
# Tidemark's durable small writes against the systems users would pick
# instead, on this machine, in one interleaved run:
#
#   bench/peers/run.sh [--clients 1,100,1000] [--seconds S] [--rounds N]
#                      [--systems a,b,...] [--values repeated|random]
#                      [--out DIR] [--update-docs]
#
# Values are one repeated character unless --values random (letters and
# digits at random, which compress like text rather than to almost nothing).
#
# Installs what is missing (scripts/install-deps.sh peers), builds
# tidemark and tidemark-peers (build/), then starts in a scratch directory
# a PostgreSQL cluster (fsync=on, synchronous_commit=on), a Redis server
# (appendonly yes, appendfsync always) and `tidemark serve` on the
# embedded default; RocksDB (sync writes), SQLite (WAL, synchronous=FULL)
# and Tidemark's Appender run inside tidemark-peers. Each system's
# settings are read back, and strace proves that each acknowledged write
# at one client followed a sync in the processes serving it; then every
# system takes the same load (bench/peers/peers.cc). Writes DIR/peers.md
# (tables), DIR/peers.svg (chart) and DIR/peers.json (every round, with the
# command, commit and date); DIR defaults to bench/peers/out.
# --update-docs also puts the tables into docs/benchmarks.md (between the
# `peers:begin` and `peers:end` markers) and the JSON into
# docs/data/peers.json, then renders docs/plots/peers-throughput.png and
# docs/plots/peers-latency.png from it (scripts/plots.py).
# Everything started is stopped and the scratch directory removed at exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/bench/serve_port.sh"
clients=1,100,1000
seconds=10
rounds=3
systems=tidemark-http,tidemark-embedded,postgres,redis,rocksdb,sqlite
out=$here/out
update_docs=
values=repeated
while [ $# -gt 0 ]; do
  case $1 in
    --clients) clients=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --systems) systems=$2; shift 2 ;;
    --values) values=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --update-docs) update_docs=1; shift ;;
    *) sed -n '2,27p' "$0" >&2; exit 2 ;;
  esac
done
command_line="bench/peers/run.sh --clients $clients --seconds $seconds --rounds $rounds --systems $systems"
[ "$values" = repeated ] || command_line="$command_line --values $values"
commit=$(git -C "$root" describe --always --dirty --exclude '*' 2>/dev/null) || commit=

bash "$root/scripts/install-deps.sh" peers
[ -f "$root/build/build.ninja" ] ||
  cmake -G Ninja -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake "$root/build" >/dev/null  # finds the peers' libraries once installed
cmake --build "$root/build" --target tidemark tidemark-peers >/dev/null

# Room for 1000 clients' connections and the processes' own files.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
max_clients=$(tr ',' '\n' <<<"$clients" | sort -n | tail -1)

work=$(mktemp -d /tmp/tidemark-peers.XXXXXX)
chmod 755 "$work"
pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres: "$work"
  as_pg=(runuser -u postgres --)
fi
free_port() {
  local port=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  echo "$port"
}
tidemark_pid=
redis_pid=
stop() {
  [ -n "$tidemark_pid" ] && { kill -TERM "$tidemark_pid" 2>/dev/null; wait "$tidemark_pid" 2>/dev/null; }
  [ -n "$redis_pid" ] && { kill -TERM "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null; }
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap stop EXIT
trap "exit 130" INT
trap "exit 143" TERM

# The ports are below Linux's ephemeral range (32768-60999 by default):
# one inside it can be held by a client socket of some other program,
# which a connect probe does not see and which makes the bind fail
# (PostgreSQL at 56432 did, once, right after the test suite).
# PostgreSQL: its own cluster, durable per commit (the defaults, stated).
pg_port=$(free_port 26432)
"${as_pg[@]}" "$pg_bin/initdb" -D "$work/pg" -U peers --auth=trust >"$work/initdb.log" 2>&1 ||
  { cat "$work/initdb.log" >&2; exit 1; }
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w -t 60 \
  -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1 -c max_connections=$((max_clients + 20)) \
      -c fsync=on -c synchronous_commit=on" start >/dev/null ||
  { cat "$work/pg.log" >&2; exit 1; }

# Redis: append-only file synced before each command is answered.
redis_port=$(free_port 26379)
mkdir -p "$work/redis"
chmod 777 "$work/redis"
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" --save "" \
  --appendonly yes --appendfsync always --auto-aof-rewrite-percentage 0 --maxclients $((max_clients + 20)) \
  --logfile "$work/redis.log" --daemonize no &
redis_pid=$!

# tidemark serve on the embedded default.
"$root/build/tidemark" --data "$work/tidemark" serve --listen 127.0.0.1:0 \
  --max-connections $((max_clients + 20)) 2>"$work/serve.err" &
tidemark_pid=$!
port=$(serve_port "$work/serve.err")
curl -sf -X POST "http://127.0.0.1:$port/v1/shards" -d '{"name":"peers"}' >/dev/null
for _ in $(seq 100); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.05
done

mkdir -p "$out" "$work/scratch"
"$root/build/tidemark-peers" --dir "$work/scratch" --systems "$systems" --clients "$clients" \
  --seconds "$seconds" --rounds "$rounds" --values "$values" --check-syncs \
  --tidemark "127.0.0.1:$port" --tidemark-pid "$tidemark_pid" \
  --postgres "host=127.0.0.1 port=$pg_port user=peers dbname=postgres" \
  --redis "127.0.0.1:$redis_port" \
  --markdown "$out/peers.md" --svg "$out/peers.svg" --json "$out/peers.json" \
  --command "$command_line" --commit "$commit" | tee "$out/peers.tsv"
echo "tables: $out/peers.md, chart: $out/peers.svg, figures: $out/peers.json" >&2

if [ -n "$update_docs" ]; then
  doc=$root/docs/benchmarks.md
  grep -q '^<!-- peers:begin -->$' "$doc" && grep -q '^<!-- peers:end -->$' "$doc" ||
    { echo "no peers:begin / peers:end markers in $doc" >&2; exit 1; }
  mkdir -p "$root/docs/data"
  cp "$out/peers.json" "$root/docs/data/peers.json"
  python3 "$root/scripts/plots.py" --data "$root/docs/data" --out "$root/docs/plots"
  # The PNG charts replace the SVG one in the docs.
  rm -f "$root/docs/peers.svg"
  {
    sed -n '1,/^<!-- peers:begin -->$/p' "$doc"
    echo "Measured $(date -u +%Y-%m-%d) at ${commit:-$(git -C "$root" rev-parse --short HEAD)}."
    echo
    echo "![Durable writes, records/s per system and concurrency](plots/peers-throughput.png)"
    echo
    echo "![Latency p50 and p99 per system and concurrency](plots/peers-latency.png)"
    echo
    echo "Charts: \`scripts/plots.py\` from \`docs/data/peers.json\` (this run's every round)."
    echo
    cat "$out/peers.md"
    sed -n '/^<!-- peers:end -->$/,$p' "$doc"
  } >"$doc.new"
  mv "$doc.new" "$doc"
  echo "updated $doc, docs/data/peers.json and docs/plots/peers-*.png" >&2
fi
