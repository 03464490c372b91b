// Update: one change to a shard's collection, ((key, value), time, diff).
//
// Keys and values are opaque bytes (the command line stores JSON text).
// The collection at time t is the sum of the diffs of the updates with
// time <= t. Consolidation sums the diffs of updates with equal
// (key, value, time) and drops zero sums; diff arithmetic is checked and an
// overflow is an error, never a silent wrap.
//
// Thread-safety: plain value types and pure functions.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tidemark/error.h"
#include "tidemark/frontier.h"

namespace tidemark {

struct Update {
  std::string key;
  std::string value;
  Time time = 0;
  Diff diff = 1;

  bool operator==(const Update&) const = default;
};

// A borrowed view of an update, valid as long as the bytes it points into.
struct UpdateView {
  std::string_view key;
  std::string_view value;
  Time time = 0;
  Diff diff = 0;

  Update to_owned() const { return Update{std::string(key), std::string(value), time, diff}; }
};

// Orders by (key, value, time): the order of parts and of merges.
inline int compare_key_value_time(std::string_view ak, std::string_view av, Time at,
                                  std::string_view bk, std::string_view bv, Time bt) {
  if (int c = ak.compare(bk); c != 0) return c;
  if (int c = av.compare(bv); c != 0) return c;
  return at < bt ? -1 : (at > bt ? 1 : 0);
}

// a + b, or an error naming `what` when the sum overflows an i64.
[[nodiscard]] Result<Diff> checked_add_diff(Diff a, Diff b, std::string_view what);

// Sorts by (key, value, time), sums equal ones and drops zero sums, in place.
[[nodiscard]] Status consolidate(std::vector<Update>& updates);

}  // namespace tidemark
