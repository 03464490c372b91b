#include "sink/committed_name.h"

#include <algorithm>
#include <cstdio>

namespace tidemark {
namespace {

constexpr std::size_t kBoundDigits = 20;  // the decimal digits of u64's maximum

// 20 decimal digits; nullopt when they exceed u64.
std::optional<Time> parse_bound(std::string_view digits) {
  Time value = 0;
  for (char c : digits) {
    Time digit = static_cast<Time>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

bool all_digits(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::string_view extension_of(SinkFormat format) {
  return format == SinkFormat::kJson ? "json" : "csv";
}

std::string bound_text(Time time) {
  char digits[kBoundDigits + 1];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(time));
  return std::string(digits, kBoundDigits);
}

std::string committed_name(Time lower, Time upper, std::string_view extension) {
  return bound_text(lower) + "-" + bound_text(upper) + "." + std::string(extension);
}

bool is_temporary_name(std::string_view name) {
  return name.size() > 1 + kTemporarySuffix.size() && name.starts_with('.') &&
         name.ends_with(kTemporarySuffix);
}

Result<std::optional<CommittedRange>> parse_committed_name(std::string_view where,
                                                           std::string_view name,
                                                           std::string_view extension) {
  const std::size_t stem = 2 * kBoundDigits + 1;
  if (name.size() != stem + 1 + extension.size() || name[kBoundDigits] != '-' ||
      name[stem] != '.' || name.substr(stem + 1) != extension) {
    return std::nullopt;
  }
  std::string_view lower_digits = name.substr(0, kBoundDigits);
  std::string_view upper_digits = name.substr(kBoundDigits + 1, kBoundDigits);
  if (!all_digits(lower_digits) || !all_digits(upper_digits)) return std::nullopt;
  auto lower = parse_bound(lower_digits);
  auto upper = parse_bound(upper_digits);
  const std::string path = std::string(where) + "/" + std::string(name);
  if (!lower || !upper)
    return corruption("committed " + path + ": a bound is larger than any time");
  if (*lower >= *upper) {
    return corruption("committed " + path + ": lower " + std::to_string(*lower) +
                      " is not below upper " + std::to_string(*upper));
  }
  return CommittedRange{*lower, *upper, std::string(name)};
}

Result<std::optional<CommittedRange>> parse_committed_output(std::string_view where,
                                                             std::string_view name) {
  for (const SinkFormat format : {SinkFormat::kJson, SinkFormat::kCsv}) {
    auto range = parse_committed_name(where, name, extension_of(format));
    if (!range || *range) return range;
  }
  return std::nullopt;
}

Result<std::optional<Frontier>> committed_progress(std::string_view where,
                                                   std::vector<CommittedRange>& committed) {
  std::sort(committed.begin(), committed.end(),
            [](const CommittedRange& a, const CommittedRange& b) { return a.lower < b.lower; });
  std::optional<Frontier> progress;
  for (std::size_t i = 0; i < committed.size(); ++i) {
    if (i > 0 && committed[i - 1].upper > committed[i].lower) {
      return corruption("committed " + std::string(where) + "/" + committed[i - 1].name + " and " +
                        std::string(where) + "/" + committed[i].name + " overlap");
    }
    progress = Frontier::at(committed[i].upper);  // sorted and disjoint: uppers increase too
  }
  return progress;
}

}  // namespace tidemark
