# Sourced by the bench scripts. serve_port FILE: prints the port that
# `tidemark serve --listen 127.0.0.1:0` reports on its stderr (redirected to
# FILE), waiting up to 10 s for the line; fails with the log otherwise.
serve_port() {
  local port=
  for _ in $(seq 200); do
    port=$(sed -n 's/.*serving on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$1")
    [ -n "$port" ] && break
    sleep 0.05
  done
  [ -n "$port" ] || { cat "$1" >&2; return 1; }
  echo "$port"
}
