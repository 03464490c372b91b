// Committed-output names shared by the file and object (s3://) sink
// destinations: `<lower>-<upper>.<json|csv>`, both bounds 20
// zero-padded decimal digits so names sort as their times do. An output
// being written has a name starting with "." and ending in ".tmp" and is
// never read as output.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sink/envelope.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"

namespace tidemark {

inline constexpr std::string_view kTemporarySuffix = ".tmp";

std::string_view extension_of(SinkFormat format);

// A bound as it appears in a name: 20 digits, zero-padded.
std::string bound_text(Time time);

// "<lower>-<upper>.<extension>".
std::string committed_name(Time lower, Time upper, std::string_view extension);

// A crashed writer's temporary (".<anything>.tmp").
bool is_temporary_name(std::string_view name);

struct CommittedRange {
  Time lower = 0;
  Time upper = 0;
  std::string name;
};

// nullopt for a name that is not `<20 digits>-<20 digits>.<extension>` (not
// a committed output of this sink: ignored); Corruption, naming `where` +
// the name, for one that is but does not hold a range with lower < upper.
Result<std::optional<CommittedRange>> parse_committed_name(std::string_view where,
                                                           std::string_view name,
                                                           std::string_view extension);
// The same for a name of either format (".json" or ".csv"): what a
// destination's progress is read from, so that a sink whose format was
// changed (PUT /v1/sinks/NAME, or `sink run` again with another --format)
// goes on in the same destination from where the other format stopped.
Result<std::optional<CommittedRange>> parse_committed_output(std::string_view where,
                                                             std::string_view name);

// The progress committed outputs add up to: the largest upper, nullopt when
// there are none; Corruption when two ranges overlap. Sorts `committed`.
Result<std::optional<Frontier>> committed_progress(std::string_view where,
                                                   std::vector<CommittedRange>& committed);

}  // namespace tidemark
