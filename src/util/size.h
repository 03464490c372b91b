// Byte sizes as people write them: on the command line (--memory-limit)
// and in configuration.
//
// parse_size accepts plain bytes ("1048576") or a number with a binary
// unit: B, KiB, MiB, GiB, TiB (powers of 1024; units are matched without
// regard to case, and spaces may separate number and unit). With a unit
// other than B the number may have a decimal fraction ("1.5GiB"); the
// result is rounded down to whole bytes. Decimal units (KB, MB, GB) and
// bare letters (K, M, G) are rejected rather than guessed at, as are signs,
// surrounding whitespace and sizes that do not fit in 64 bits.
//
// format_size is for people, not machines: "512 B", "64.0 MiB", "1.5 GiB"
// (one decimal, largest unit up to TiB). parse_size reads its output back,
// to within the rounding of the decimal.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tidemark/error.h"

namespace tidemark {

// The number of bytes `text` names, or kInvalidUsage naming the problem.
[[nodiscard]] Result<std::uint64_t> parse_size(std::string_view text);

// `bytes` in the largest binary unit that keeps the number >= 1.
std::string format_size(std::uint64_t bytes);

}  // namespace tidemark
