// Update: one change to a shard's collection, ((key, value), time, diff).
//
// Keys and values are opaque bytes (the command line stores JSON text).
// The collection at time t is the sum of the diffs of the updates with
// time <= t. Consolidation sums the diffs of updates with equal
// (key, value, time) and drops zero sums.
//
// Sums are exact. They are taken in 128 bits (2^64 updates of any i64 diff
// cannot overflow that), and a total that does not fit an i64 is carried:
// it is written as several updates of one (key, value, time), all of one
// sign, every one but the last saturated (i64::MAX for a positive total,
// i64::MIN for a negative one). Their diffs add up to the total, so any
// reader that sums them is right; no sequence of diffs can make a shard
// unreadable. The same (key, value, time) repeats only in such a carry
// (continues_carry); anywhere else a repeat is corruption.
//
// Thread-safety: plain value types and pure functions.
#pragma once

#include <limits>
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

// A sum of diffs, wide enough for any count of updates a shard can hold.
using DiffSum = __int128;

// The diff of the next update of a carry for `remaining` (the whole total
// at first), taken out of `remaining`: i64::MAX or i64::MIN while the rest
// does not fit, then the rest. REQUIRES: remaining != 0.
inline Diff take_carried_diff(DiffSum& remaining) {
  constexpr Diff kMax = std::numeric_limits<Diff>::max();
  constexpr Diff kMin = std::numeric_limits<Diff>::min();
  Diff diff = remaining > kMax ? kMax : (remaining < kMin ? kMin : static_cast<Diff>(remaining));
  remaining -= diff;
  return diff;
}

// Whether an update of diff `next` may follow one of diff `previous` with
// the same (key, value, time): only inside a carry.
inline bool continues_carry(Diff previous, Diff next) {
  return (previous == std::numeric_limits<Diff>::max() && next > 0) ||
         (previous == std::numeric_limits<Diff>::min() && next < 0);
}

// Sorts by (key, value, time), sums equal ones (carrying a sum that does
// not fit) and drops zero sums, in place.
void consolidate(std::vector<Update>& updates);

}  // namespace tidemark
