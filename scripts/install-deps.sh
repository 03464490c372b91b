#!/usr/bin/env bash
# Installs the Debian 12 packages Tidemark needs to build and test
# (`install-deps.sh peers`: and to run bench/peers/run.sh).
# Idempotent: installs only what is missing; does nothing when all is present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libzstd-dev libxxhash-dev libsqlite3-dev librdkafka-dev libboost-dev
  libjemalloc-dev  # the tidemark binary's allocator (CMakeLists.txt, TIDEMARK_JEMALLOC)
  libgtest-dev curl wrk
  libpq-dev libcurl4-openssl-dev libssl-dev
  postgresql
  libclang-rt-14-dev
  chromium  # the console test loads GET / in a headless browser
  python3-matplotlib  # scripts/plots.py (docs/plots), and plots_test renders with it
)
# `install-deps.sh peers`: also the systems bench/peers/run.sh measures
# Tidemark against (not needed to build or test).
if [ "${1:-}" = peers ]; then
  packages+=(redis-server librocksdb-dev libhiredis-dev strace)
fi
# s3rver (tools/s3rver, for the S3 tests) runs on the machine's Node.js;
# Debian's only when the machine has none.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
echo "install-deps: installing ${missing[*]}" >&2
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
