#!/usr/bin/env bash
# `make run`: the main job, `tidemark serve` on the embedded default
# (./tidemark-data: files + SQLite), with how to use it printed first. It
# runs until Ctrl-C or SIGTERM, which stop it gracefully (commits in flight
# finish, sinks record their progress). `make demo` walks through the CLI.
set -euo pipefail
bin=${1:-build/tidemark}
data=${TIDEMARK_DATA:-./tidemark-data}
listen=${TIDEMARK_LISTEN:-127.0.0.1:6875}
url=http://$listen
cat <<USAGE
Tidemark server on $url, data in $data.
The live console: open $url/ in a browser. Try, from another terminal:

  curl -X POST $url/v1/shards -d '{"name": "orders"}'
  printf '{"key": "o1", "value": {"qty": 2}}\n{"key": "o2", "value": {"qty": 5}}\n' |
    curl -X POST $url/v1/shards/orders/append --data-binary @-
  curl "$url/v1/shards/orders/snapshot"                 # the latest complete time
  curl -N "$url/v1/shards/orders/listen?resume_progress=0"  # all of it, then follows new appends
  curl -X POST $url/v1/sinks -d '{"name": "files", "shard": "orders", "to": "file://$(realpath -m "$data")/sinks/files", "envelope": "upsert", "format": "json"}'
  curl $url/v1/sinks/files
  curl $url/metrics

Ctrl-C stops it (gracefully).
USAGE
exec "$bin" --data "$data" serve --listen "$listen"
