// SeqNoBounds: the sequence numbers every Consensus backend can store, and
// the compare_and_set precondition they all check the same way.
//
// SeqNo is u64, but SQL backends store it as a signed 64-bit integer, so
// seqnos above kMaxSeqNo are InvalidUsage on every backend (the memory one
// included, so tests see what production would).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "tidemark/error.h"
#include "tidemark/location.h"

namespace tidemark {

inline constexpr SeqNo kMaxSeqNo = static_cast<SeqNo>(std::numeric_limits<std::int64_t>::max());

// InvalidUsage unless next <= kMaxSeqNo and next > expected (when set).
inline Status validate_compare_and_set(std::optional<SeqNo> expected, SeqNo next) {
  if (next > kMaxSeqNo) {
    return invalid_usage("seqno " + std::to_string(next) + " exceeds the maximum " +
                         std::to_string(kMaxSeqNo));
  }
  if (expected && next <= *expected) {
    return invalid_usage("compare_and_set: next seqno " + std::to_string(next) +
                         " must be greater than the expected seqno " + std::to_string(*expected));
  }
  return {};
}

}  // namespace tidemark
