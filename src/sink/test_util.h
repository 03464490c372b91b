// Helpers shared by the sink tests: diff pairs built by hand.
#pragma once

#include <optional>
#include <string_view>

#include "sink/diff_pairs.h"

namespace tidemark::testing {

inline DiffPair insert(std::string_view key, Time time, std::string_view after) {
  return DiffPair{key, time, std::nullopt, after, 0};
}
inline DiffPair remove(std::string_view key, Time time, std::string_view before) {
  return DiffPair{key, time, before, std::nullopt, 0};
}
inline DiffPair update(std::string_view key, Time time, std::string_view before,
                       std::string_view after) {
  return DiffPair{key, time, before, after, 0};
}

}  // namespace tidemark::testing
