#!/usr/bin/env bash
# The library as a user gets it: installs the build (cmake --install) into
# a scratch prefix, checks that what is installed stands alone (the public
# headers include only public headers; no header, CMake file or pkg-config
# file names the build or source tree), builds examples/ against the
# installed package with CMake (find_package(tidemark)) and embedded.cc
# again with pkg-config, and runs them: the embedded example must read back
# what it wrote, the file sink must write each change once (and nothing
# on a second run), and the custom blob backend must pass the installed
# conformance suite.
#
# With --core it first configures and builds, in a scratch directory, the
# core engine alone (every TIDEMARK_WITH_* option off) and does all of the
# above with that, checking also that nothing in it links libcurl,
# libcrypto, libpq, librdkafka or Boost, and that s3:// and postgres://
# URLs, and s3:// and kafka:// sink destinations, fail with a clear error
# naming the option.
#
#   tests/examples_test.sh BUILD_DIR SOURCE_DIR [--core]
set -euo pipefail
src=$(cd "$2" && pwd)
core=${3:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/tidemark-examples.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "examples_test: $*" >&2; exit 1; }
if [ "$core" = --core ]; then
  build=$work/core-build
  cmake -G Ninja -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTIDEMARK_WITH_S3=OFF \
    -DTIDEMARK_WITH_POSTGRES=OFF -DTIDEMARK_WITH_KAFKA=OFF -DTIDEMARK_WITH_SERVER=OFF \
    >"$work/core-configure.log" 2>&1 ||
    { cat "$work/core-configure.log" >&2; fail "configuring the core build failed"; }
  cmake --build "$build" -j "${JOBS:-2}" >"$work/core-build.log" 2>&1 ||
    { tail -50 "$work/core-build.log" >&2; fail "building the core engine failed"; }
elif [ -n "$core" ]; then
  fail "unknown option $core"
else
  build=$(cd "$1" && pwd)
fi

prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log" >&2; fail "cmake --install failed"; }

# What is installed stands alone.
[ -f "$prefix/include/tidemark/client.h" ] || fail "no include/tidemark/client.h installed"
[ -f "$prefix/include/tidemark/version.h" ] || fail "no include/tidemark/version.h installed"
[ -f "$prefix/include/tidemark/testing/conformance.h" ] || fail "no conformance suite installed"
[ -f "$prefix/include/tidemark/sink.h" ] || fail "no include/tidemark/sink.h installed"
if [ "$core" = --core ]; then
  [ ! -e "$prefix/include/tidemark/server.h" ] || fail "server.h installed without the server"
else
  [ -f "$prefix/include/tidemark/server.h" ] || fail "no include/tidemark/server.h installed"
fi
private=$(grep -rlE '#include "(util|location|part|shard|sink|server|memory|cli|crypto|s3|postgres|open)/' \
  "$prefix/include" || true)
[ -z "$private" ] || fail "installed headers include private ones: $private"
into_src=$(grep -rn 'src/' "$prefix/include" || true)
[ -z "$into_src" ] || fail "installed headers send the reader into src/: $into_src"
leaks=$(grep -rlF -e "$src" -e "$build" "$prefix/include" "$prefix/lib" --exclude='*.a' || true)
[ -z "$leaks" ] || fail "installed files name the source or build tree: $leaks"
pc=$(find "$prefix" -name tidemark.pc | head -1)
[ -n "$pc" ] || fail "no tidemark.pc installed"
config=$(find "$prefix" -name tidemarkConfig.cmake | head -1)
[ -n "$config" ] || fail "no tidemarkConfig.cmake installed"
[ -f "$(dirname "$config")/tidemarkConfigVersion.cmake" ] || fail "no version file"

# CMake: find_package(tidemark).
cmake -G Ninja -S "$src/examples" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configuring examples/ against the install failed"; }
cmake --build "$work/build" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "building examples/ against the install failed"; }
"$work/build/embedded" "$work/data" >"$work/embedded.out" 2>&1 ||
  { cat "$work/embedded.out" >&2; fail "the embedded example failed"; }
cat "$work/embedded.out"
grep -qx "snapshot at 1: order-1 = {\"qty\":3} (diff 1)" "$work/embedded.out" ||
  fail "the embedded example's snapshot is not what it wrote"
grep -qx "4 changes" "$work/embedded.out" || fail "the embedded example's listen missed changes"
"$work/build/custom_blob" --gtest_brief=1 >"$work/custom_blob.out" 2>&1 ||
  { cat "$work/custom_blob.out" >&2; fail "the custom blob failed the conformance suite"; }
grep -E "PASSED +\] [1-9][0-9]* tests?" "$work/custom_blob.out" ||
  fail "the conformance suite ran no test"
for run in 1 2; do
  "$work/build/file_sink" "$work/sink" >"$work/file_sink.$run" 2>&1 ||
    { cat "$work/file_sink.$run" >&2; fail "the file sink example failed (run $run)"; }
done
cat "$work/file_sink.1"
cat >"$work/file_sink.expected" <<'LINES'
sink wrote 3 pairs in 2 commits
{"time":0,"key":"order-1","value":{"qty":2}}
{"time":1,"key":"order-1","value":{"qty":3}}
{"time":2,"key":"order-1","value":null}
LINES
diff "$work/file_sink.expected" "$work/file_sink.1" >&2 || fail "the file sink wrote other lines"
head -1 "$work/file_sink.2" | grep -qx "sink wrote 0 pairs in 0 commits" ||
  fail "the file sink wrote again on its second run: $(head -1 "$work/file_sink.2")"
[ "$(tail -n +2 "$work/file_sink.2")" = "$(tail -n +2 "$work/file_sink.1")" ] ||
  fail "the file sink's files changed on its second run"

if [ "$core" = --core ]; then
  # The core engine and nothing else.
  libs=$(cd "$(dirname "$pc")/.." && ls libtidemark_*.a | tr '\n' ' ')
  [ "$libs" = "libtidemark_location.a libtidemark_memory.a libtidemark_open.a libtidemark_part.a libtidemark_shard.a libtidemark_sink.a libtidemark_util.a " ] ||
    fail "the core build installed: $libs"
  # Calls into libpq, libcurl, librdkafka or libcrypto are undefined
  # symbols; Boost is header-only, so its code would be defined in them.
  foreign=$(nm -C -u "$(dirname "$pc")"/../libtidemark_*.a 2>/dev/null |
    grep -E ' (PQ[a-zA-Z]+|curl_[a-z_]+|rd_kafka_[a-z_]+|EVP_[A-Za-z_]+)$' | sort -u || true)
  foreign+=$(nm -C "$(dirname "$pc")"/../libtidemark_*.a 2>/dev/null | grep -m 3 'boost::' || true)
  [ -z "$foreign" ] || fail "the core libraries use: $foreign"
  grep -Eq '^Requires: libzstd sqlite3 libxxhash$' "$pc" || fail "tidemark.pc: $(grep Requires "$pc")"
  if ldd "$work/build/embedded" | grep -E 'libpq|libcurl|librdkafka|libcrypto'; then
    fail "the core embedded example links more than the core"
  fi
  cat >"$work/without.cc" <<'PROGRAM'
#include <cstdio>
#include "tidemark/client.h"
#include "tidemark/location.h"
#include "tidemark/sink.h"
int main() {
  if (tidemark::validate_shard_name("bad/name") || !tidemark::validate_shard_name("orders-1")) {
    return 2;
  }
  auto blob = tidemark::open_blob("s3://bucket/p?endpoint=http://127.0.0.1:1");
  auto consensus = tidemark::open_consensus("postgres://u@127.0.0.1:1/db");
  auto objects = tidemark::check_sink_destination("s3://bucket/p?endpoint=http://127.0.0.1:1",
                                                  tidemark::SinkFormat::kJson);
  auto topic = tidemark::check_sink_destination("kafka://127.0.0.1:1/t",
                                                tidemark::SinkFormat::kJson);
  if (blob || consensus || objects || topic) return 1;
  std::printf("%s\n%s\n%s\n%s\n", blob.error().message.c_str(), consensus.error().message.c_str(),
              objects.error().message.c_str(), topic.error().message.c_str());
  return 0;
}
PROGRAM
  # shellcheck disable=SC2046
  g++ -std=c++23 "$work/without.cc" -o "$work/without" \
    $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs tidemark) ||
    fail "building the s3://, postgres:// and kafka:// check failed"
  "$work/without" >"$work/without.out" ||
    fail "s3://, postgres:// or kafka:// opened in a core build, or shard names judged wrong: $(cat "$work/without.out")"
  grep -q "TIDEMARK_WITH_S3=OFF" "$work/without.out" || fail "$(cat "$work/without.out")"
  grep -q "TIDEMARK_WITH_POSTGRES=OFF" "$work/without.out" || fail "$(cat "$work/without.out")"
  grep -q "no S3 destinations (built with TIDEMARK_WITH_S3=OFF)" "$work/without.out" ||
    fail "$(cat "$work/without.out")"
  grep -q "no Kafka destinations (built with TIDEMARK_WITH_KAFKA=OFF)" "$work/without.out" ||
    fail "$(cat "$work/without.out")"
fi

# pkg-config: the same program, compiled and linked by hand.
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs tidemark) ||
  fail "pkg-config cannot resolve tidemark.pc"
# shellcheck disable=SC2086
g++ -std=c++23 -O1 "$src/examples/embedded.cc" -o "$work/embedded-pc" $flags ||
  fail "building embedded.cc with pkg-config failed"
"$work/embedded-pc" "$work/data-pc" | grep -qx "4 changes" || fail "the pkg-config build failed"
echo "examples_test${core:+ $core}: installed package, CMake and pkg-config builds all work"
