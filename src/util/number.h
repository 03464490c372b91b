// One parser for the decimal integers people and peers type: flags, query
// parameters, ports in URLs, counts in headers and listings.
//
// The whole text must be digits: no sign, no space, no "0x", no trailing
// junk ("12x" is not 12, "-1" is not a huge number), and a value past
// 2^64 - 1 is refused rather than wrapped.
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

namespace tidemark {

// The value of `text` when it is a decimal integer in [least, most];
// nullopt otherwise.
std::optional<std::uint64_t> parse_decimal(
    std::string_view text, std::uint64_t least = 0,
    std::uint64_t most = std::numeric_limits<std::uint64_t>::max());

}  // namespace tidemark
