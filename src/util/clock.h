// Wall-clock time in milliseconds since the Unix epoch: the appender's
// default batch times and reader lease expiries.
//
// Thread-safety: a pure read of the system clock.
#pragma once

#include <chrono>
#include <cstdint>

namespace tidemark {

inline std::uint64_t wall_clock_millis() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace tidemark
