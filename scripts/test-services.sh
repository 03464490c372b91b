#!/usr/bin/env bash
# The real servers the scale-out tests run against, started for one command:
#   scripts/test-services.sh COMMAND [ARGS...]
# starts PostgreSQL (Debian's packages) and s3rver (npm, tools/s3rver) on
# loopback in a fresh temporary directory, runs COMMAND with these set:
#   TIDEMARK_TEST_POSTGRES  postgres://tidemark:tidemark@127.0.0.1:PORT/tidemark
#   TIDEMARK_TEST_S3        s3://tidemark/PREFIX?endpoint=http://127.0.0.1:PORT&region=us-east-1
#   AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY  (s3rver's fixed credentials)
#   TIDEMARK_TEST_POSTGRES_STOP / _START  shell commands stopping and
#                           starting that PostgreSQL (outage tests)
#   TIDEMARK_TEST_S3_STOP / _START  the same for s3rver: it starts again on
#                           the same port and data, so objects survive
#   TIDEMARK_TEST_NO_SKIP=1 every test has what it needs, so a test that
#                           skips fails (tests/test_main.cc)
# then stops both servers and removes their data, whatever COMMAND did, and
# exits with COMMAND's status. Tests that need a server skip without these
# variables and fail, never skip, when they are set but the server is not
# there. Ports: the first free from TIDEMARK_PG_PORT (default 25432) and
# TIDEMARK_S3_PORT (25680): below the kernel's ephemeral range (32768 up),
# so that while an outage test has a server down, no outgoing connection
# can be given its port, and the server binds it again when restarted.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The first port from `start` on which nothing listens yet (another run's
# servers may hold the defaults).
free_port() {
  local port=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  echo "$port"
}
pg_port=$(free_port "${TIDEMARK_PG_PORT:-25432}")
s3_port=$(free_port "${TIDEMARK_S3_PORT:-25680}")
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$pg_bin/initdb" ] || { echo "test-services: PostgreSQL not installed (make deps)" >&2; exit 1; }

work=$(mktemp -d /tmp/tidemark-services.XXXXXX)
chmod 755 "$work"
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
  # PostgreSQL refuses to run as root; Debian's package made this user.
  chown postgres: "$work"
  as_pg=(runuser -u postgres --)
fi
# Whichever s3rver runs at the end (a test may have restarted it) is named
# by $work/s3rver.pid.
s3ctl=(bash "$root/scripts/s3rver.sh")
stop() {
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  "${s3ctl[@]}" stop "$work" || true
  rm -rf "$work"
}
trap stop EXIT
trap "exit 130" INT
trap "exit 143" TERM

# PostgreSQL: its own cluster, password auth over TCP, socket in $work.
echo tidemark >"$work/pwfile"
chmod 644 "$work/pwfile"
"${as_pg[@]}" "$pg_bin/initdb" -D "$work/pg" -U tidemark --pwfile="$work/pwfile" \
  --auth-local=trust --auth-host=scram-sha-256 >"$work/initdb.log" 2>&1 ||
  { cat "$work/initdb.log" >&2; exit 1; }
pg_start=("${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w -t 60
  -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on" start)
pg_stop=("${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pg" -w -t 60 -m fast stop)
"${pg_start[@]}" >/dev/null || { cat "$work/pg.log" >&2; exit 1; }
"${as_pg[@]}" "$pg_bin/createdb" -h "$work" -p "$pg_port" -U tidemark tidemark

# s3rver: installed from the npm registry into tools/s3rver (lockfile pinned).
if [ ! -x "$root/tools/s3rver/node_modules/.bin/s3rver" ]; then
  (cd "$root/tools/s3rver" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
s3_start=("${s3ctl[@]}" start "$work" "$s3_port")
s3_stop=("${s3ctl[@]}" stop "$work")
"${s3_start[@]}"

export TIDEMARK_TEST_POSTGRES="postgres://tidemark:tidemark@127.0.0.1:$pg_port/tidemark"
export TIDEMARK_TEST_S3="s3://tidemark/test?endpoint=http://127.0.0.1:$s3_port&region=us-east-1"
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
# For tests of a database outage under load: shell commands that stop
# PostgreSQL (fast shutdown: sessions are cut) and start it again.
TIDEMARK_TEST_POSTGRES_STOP="$(printf '%q ' "${pg_stop[@]}")>/dev/null"
TIDEMARK_TEST_POSTGRES_START="$(printf '%q ' "${pg_start[@]}")>/dev/null"
export TIDEMARK_TEST_POSTGRES_STOP TIDEMARK_TEST_POSTGRES_START
# And for s3rver (killed: a request in flight is cut).
TIDEMARK_TEST_S3_STOP="$(printf '%q ' "${s3_stop[@]}")"
TIDEMARK_TEST_S3_START="$(printf '%q ' "${s3_start[@]}")"
export TIDEMARK_TEST_S3_STOP TIDEMARK_TEST_S3_START
# Every service a test may need is up: a skip is a test that stopped
# running without anyone noticing, so it fails.
export TIDEMARK_TEST_NO_SKIP=1
echo "test-services: PostgreSQL on 127.0.0.1:$pg_port, s3rver on 127.0.0.1:$s3_port" >&2
status=0
"$@" || status=$?
exit "$status"
