#include "util/size.h"

#include <array>
#include <cstdio>
#include <limits>

namespace tidemark {
namespace {

struct Unit {
  std::string_view name;
  int shift;  // the unit is 2^shift bytes
};

constexpr std::array<Unit, 5> kUnits = {{
    {"B", 0},
    {"KiB", 10},
    {"MiB", 20},
    {"GiB", 30},
    {"TiB", 40},
}};

// More fraction digits than this could not change the result by a byte
// (2^40 / 10^18 < 1) but could overflow the arithmetic.
constexpr std::size_t kMaxFractionDigits = 18;

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto lower = [](char c) {
      return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

std::unexpected<Error> size_error(std::string_view text, std::string_view problem) {
  std::string message = "invalid size \"";
  message.append(text);
  message.append("\": ");
  message.append(problem);
  return invalid_usage(std::move(message));
}

}  // namespace

Result<std::uint64_t> parse_size(std::string_view text) {
  constexpr std::string_view kExpected =
      "expected a number of bytes, optionally followed by KiB, MiB, GiB or TiB";
  std::size_t i = 0;
  // Whole part, in 128 bits so overflow is detected after the multiply.
  unsigned __int128 whole = 0;
  const std::size_t whole_start = i;
  while (i < text.size() && is_digit(text[i])) {
    whole = whole * 10 + static_cast<unsigned>(text[i] - '0');
    if (whole > std::numeric_limits<std::uint64_t>::max()) {
      return size_error(text, "does not fit in 64 bits");
    }
    ++i;
  }
  if (i == whole_start) return size_error(text, kExpected);

  unsigned __int128 fraction = 0;
  unsigned __int128 fraction_scale = 1;
  bool has_fraction = false;
  if (i < text.size() && text[i] == '.') {
    has_fraction = true;
    ++i;
    const std::size_t fraction_start = i;
    while (i < text.size() && is_digit(text[i])) {
      if (i - fraction_start >= kMaxFractionDigits) {
        return size_error(text, "too many digits after the decimal point");
      }
      fraction = fraction * 10 + static_cast<unsigned>(text[i] - '0');
      fraction_scale *= 10;
      ++i;
    }
    if (i == fraction_start) return size_error(text, "expected a digit after '.'");
  }

  const std::size_t number_end = i;
  while (i < text.size() && text[i] == ' ') ++i;
  const std::string_view unit_text = text.substr(i);
  if (unit_text.empty() && i != number_end) return size_error(text, "expected a unit after ' '");
  int shift = 0;
  if (!unit_text.empty()) {
    const Unit* unit = nullptr;
    for (const Unit& candidate : kUnits) {
      if (equals_ignoring_case(unit_text, candidate.name)) unit = &candidate;
    }
    if (unit == nullptr) {
      return size_error(text, "unknown unit \"" + std::string(unit_text) +
                                  "\" (use B, KiB, MiB, GiB or TiB, or plain bytes)");
    }
    shift = unit->shift;
  }
  if (has_fraction && shift == 0) {
    return size_error(text, "a fraction needs a unit larger than bytes, such as MiB");
  }

  const unsigned __int128 bytes = (whole << shift) + ((fraction << shift) / fraction_scale);
  if (bytes > std::numeric_limits<std::uint64_t>::max()) {
    return size_error(text, "does not fit in 64 bits");
  }
  return static_cast<std::uint64_t>(bytes);
}

std::string format_size(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  // Move up while the value would print as 1024.0 or more, so 1048575
  // bytes reads "1.0 MiB" rather than "1024.0 KiB".
  while (unit + 1 < kUnits.size() && value >= 1023.95) {
    value /= 1024;
    ++unit;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.1f %s", value, kUnits[unit].name.data());
  return buffer;
}

}  // namespace tidemark
