#include "util/number.h"

#include <charconv>

namespace tidemark {

std::optional<std::uint64_t> parse_decimal(std::string_view text, std::uint64_t least,
                                           std::uint64_t most) {
  if (text.empty() || text.front() < '0' || text.front() > '9') return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  if (value < least || value > most) return std::nullopt;
  return value;
}

}  // namespace tidemark
