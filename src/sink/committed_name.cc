#include "sink/committed_name.h"

#include <algorithm>
#include <cstdio>
#include <limits>

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

Status ListedOutputs::add(std::string_view where, std::string_view name) {
  auto range = parse_committed_output(where, name);
  if (!range) return std::unexpected(range.error());
  if (*range) {
    committed.push_back(std::move(**range));
    return {};
  }
  auto part = parse_snapshot_part(where, name);
  if (!part) return std::unexpected(part.error());
  if (*part) parts.push_back(std::move(**part));
  return {};
}

std::string snapshot_part_name(Time upper, std::uint64_t pairs, std::uint64_t check,
                               std::string_view extension) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(check));
  return bound_text(0) + "-" + bound_text(upper) + "-" + bound_text(pairs) + "-" +
         std::string(hex, 16) + "." + std::string(extension);
}

Result<std::optional<SnapshotPart>> parse_snapshot_part(std::string_view where,
                                                        std::string_view name) {
  // <20>-<20>-<20>-<16 hex>.<json|csv>
  constexpr std::size_t kStem = 3 * kBoundDigits + 3 + 16;
  if (name.size() <= kStem + 1 || name[kStem] != '.') return std::nullopt;
  const std::string_view extension = name.substr(kStem + 1);
  if (extension != extension_of(SinkFormat::kJson) && extension != extension_of(SinkFormat::kCsv)) {
    return std::nullopt;
  }
  for (std::size_t dash : {kBoundDigits, 2 * kBoundDigits + 1, 3 * kBoundDigits + 2}) {
    if (name[dash] != '-') return std::nullopt;
  }
  const std::string_view lower_digits = name.substr(0, kBoundDigits);
  const std::string_view upper_digits = name.substr(kBoundDigits + 1, kBoundDigits);
  const std::string_view pairs_digits = name.substr(2 * kBoundDigits + 2, kBoundDigits);
  const std::string_view check_hex = name.substr(3 * kBoundDigits + 3, 16);
  if (!all_digits(lower_digits) || !all_digits(upper_digits) || !all_digits(pairs_digits) ||
      !std::all_of(check_hex.begin(), check_hex.end(),
                   [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
    return std::nullopt;
  }
  const std::string path = std::string(where) + "/" + std::string(name);
  auto lower = parse_bound(lower_digits);
  auto upper = parse_bound(upper_digits);
  auto pairs = parse_bound(pairs_digits);
  if (!lower || !upper || !pairs) {
    return corruption("snapshot part " + path + ": a number is larger than 2^64 - 1");
  }
  if (*lower != 0 || *upper == 0 || *pairs == 0) {
    return corruption("snapshot part " + path +
                      ": a part's lower is 0 and its upper and pairs are above 0");
  }
  std::uint64_t check = 0;
  for (char c : check_hex)
    check = check * 16 + static_cast<std::uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
  return SnapshotPart{*upper, *pairs, check, std::string(name)};
}

Result<std::string> next_snapshot_part_name(std::string_view what, Time lower,
                                            std::optional<Time> max_time,
                                            const std::optional<Frontier>& progress,
                                            const std::optional<SnapshotPosition>& last,
                                            const SnapshotPosition& position,
                                            std::string_view extension) {
  if (progress) {
    return invalid_usage(std::string(what) + ": a snapshot part after the progress " +
                         progress->to_string() + " was committed");
  }
  if (lower != 0 || position.pairs == 0 || position.key_pairs == 0 ||
      position.as_of == std::numeric_limits<Time>::max() ||
      (max_time && *max_time != position.as_of) ||
      (last && (last->as_of != position.as_of || last->pairs >= position.pairs))) {
    return invalid_usage(std::string(what) + ": snapshot part at " +
                         std::to_string(position.as_of) + " ending at pair " +
                         std::to_string(position.pairs) +
                         " does not follow the open output and the parts before it");
  }
  const std::uint64_t check =
      position.check.value_or(snapshot_pair_check(position.key, position.key_pairs));
  return snapshot_part_name(position.as_of + 1, position.pairs, check, extension);
}

Result<std::optional<SnapshotPosition>> snapshot_in_progress(
    std::string_view where, std::vector<SnapshotPart>& parts,
    const std::optional<Frontier>& progress) {
  std::sort(parts.begin(), parts.end(),
            [](const SnapshotPart& a, const SnapshotPart& b) { return a.pairs < b.pairs; });
  auto path = [&](const SnapshotPart& part) { return std::string(where) + "/" + part.name; };
  for (const SnapshotPart& part : parts) {
    if (progress && Frontier::at(part.upper) > *progress) {
      // Cannot be: a part is committed only while nothing else is, and
      // its snapshot's last output has the part's upper.
      return corruption("snapshot part " + path(part) + " is above the committed progress " +
                        progress->to_string());
    }
  }
  if (parts.empty() || progress) return std::nullopt;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].upper != parts[0].upper) {
      return corruption("snapshot parts " + path(parts[0]) + " and " + path(parts[i]) +
                        " are of different snapshots");
    }
    if (parts[i].pairs == parts[i - 1].pairs) {
      return corruption("snapshot parts " + path(parts[i - 1]) + " and " + path(parts[i]) +
                        " end at the same pair");
    }
  }
  const SnapshotPart& last = parts.back();
  SnapshotPosition position;
  position.as_of = last.upper - 1;
  position.pairs = last.pairs;
  position.check = last.check;
  return position;
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
