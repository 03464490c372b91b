// DiffPairWalker: turns a consolidated, sorted stream of updates into diff
// pairs, lazily.
//
// Input: updates whose (key, time) groups are contiguous, with the values of
// a group in increasing order and each (key, value, time) at most once with
// a nonzero diff (a snapshot at as_of, or one time of a listen). Within a
// group, befores are the values with a negative diff (|diff| copies each)
// and afters the positive ones. The walker pairs the i-th before copy with
// the i-th after copy (both in value order); the copies left over on the
// longer side stand alone (a delete, or an insert).
//
// Memory: O(1) in the diffs and in the number of values of a group. The
// walker opens the input twice and walks it with two cursors in lock step,
// one reading a group's befores and the other its afters, so a group with a
// million values or a diff of ten million copies is never collected: the
// walker holds the two cursors (each on one update), a copy of the current
// key, and a copy of the last value each cursor read, for the order check
// (bounded by the largest key and value).
//
// Checks, each an InvalidUsage error:
//   - within a group, values strictly increase (sorted, each at most once)
//     and no diff is zero;
//   - the two passes agree: at every group start both stand at the same
//     update, and at every group end both have read the same number of
//     updates with the same fingerprint (a hash of the values and diffs).
//     A disagreement is found at the end of the group it falls in, when
//     pairs of that group may already have gone out: a caller records no
//     progress for a walk that failed.
// Not checked: that a (key, time) group appears only once. Groups may come
// in any order (a listen emits them time-major, a snapshot key-major), so a
// group that reappears later is taken as another group; catching that would
// take memory in the number of groups.
//
// Errors are sticky: after one, every call of next() returns it again.
//
// Thread-safety: single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tidemark/error.h"
#include "tidemark/sink.h"
#include "tidemark/update.h"

namespace tidemark {

// One pass over the input. next() returns views valid until the next call.
class UpdateSource {
 public:
  virtual ~UpdateSource() = default;
  [[nodiscard]] virtual Result<std::optional<UpdateView>> next() = 0;
};

// Opens a fresh pass over the same input; every pass yields the same
// sequence.
using OpenUpdateSource = std::function<Result<std::unique_ptr<UpdateSource>>()>;

// DiffPair: tidemark/sink.h.

class DiffPairWalker {
 public:
  // Opens the input twice and reads the first update of each pass. A
  // factory's or source's error is returned as is.
  [[nodiscard]] static Result<DiffPairWalker> open(const OpenUpdateSource& open_source);

  DiffPairWalker(DiffPairWalker&&) noexcept;
  DiffPairWalker& operator=(DiffPairWalker&&) noexcept;
  ~DiffPairWalker();

  // The next pair, or nullopt at the end (and at every call after it).
  // Views stay valid until the next call. An input that breaks the ordering
  // contract, or passes that disagree, is InvalidUsage; a source's error is
  // returned as is. REQUIRES: *this was not moved from.
  [[nodiscard]] Result<std::optional<DiffPair>> next();

 private:
  struct State;
  explicit DiffPairWalker(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tidemark
