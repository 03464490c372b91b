#!/usr/bin/env bash
# The library as a user gets it: installs the build (cmake --install) into
# a scratch prefix, checks that what is installed stands alone (the public
# headers include only public headers; no header, CMake file or pkg-config
# file names the build or source tree), builds examples/ against the
# installed package with CMake (find_package(tidemark)) and embedded.cc
# again with pkg-config, and runs them: the embedded example must read back
# what it wrote, and the custom blob backend must pass the installed
# conformance suite.
#
#   tests/examples_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/tidemark-examples.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "examples_test: $*" >&2; exit 1; }

prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log" >&2; fail "cmake --install failed"; }

# What is installed stands alone.
[ -f "$prefix/include/tidemark/client.h" ] || fail "no include/tidemark/client.h installed"
[ -f "$prefix/include/tidemark/version.h" ] || fail "no include/tidemark/version.h installed"
[ -f "$prefix/include/tidemark/testing/conformance.h" ] || fail "no conformance suite installed"
private=$(grep -rlE '#include "(util|location|part|shard|sink|server|memory|cli)/' \
  "$prefix/include" || true)
[ -z "$private" ] || fail "installed headers include private ones: $private"
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

# pkg-config: the same program, compiled and linked by hand.
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs tidemark) ||
  fail "pkg-config cannot resolve tidemark.pc"
# shellcheck disable=SC2086
g++ -std=c++23 -O1 "$src/examples/embedded.cc" -o "$work/embedded-pc" $flags ||
  fail "building embedded.cc with pkg-config failed"
"$work/embedded-pc" "$work/data-pc" | grep -qx "4 changes" || fail "the pkg-config build failed"
echo "examples_test: installed package, CMake and pkg-config builds all work"
