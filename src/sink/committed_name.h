// Committed-output names shared by the file and object (s3://) sink
// destinations: `<lower>-<upper>.<json|csv>`, both bounds 20
// zero-padded decimal digits so names sort as their times do. An output
// being written has a name starting with "." and ending in ".tmp" and is
// never read as output.
//
// A snapshot committed in parts (SinkDestination::commit_snapshot_part)
// has, before its last output `<0>-<as_of + 1>.<ext>`, parts named
// `<0>-<as_of + 1>-<pairs>-<check>.<ext>`: `pairs` (20 digits) counts the
// snapshot's pairs up to and including the part's last, `check` (16 hex
// digits) is that pair's snapshot_pair_check. '-' sorts before '.', so in
// name order the parts come first, in the order written, then the last
// output, then the intervals after the snapshot.
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
#include "tidemark/sink.h"

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

// A snapshot part's name (above); upper is the snapshot's as_of + 1.
std::string snapshot_part_name(Time upper, std::uint64_t pairs, std::uint64_t check,
                               std::string_view extension);

struct SnapshotPart {
  Time upper = 0;
  std::uint64_t pairs = 0;
  std::uint64_t check = 0;
  std::string name;
};

// nullopt for a name that is not a snapshot part's of either format;
// Corruption, naming `where` + the name, for one shaped as a part whose
// lower is not 0, whose upper is 0 or whose pairs are 0.
Result<std::optional<SnapshotPart>> parse_snapshot_part(std::string_view where,
                                                        std::string_view name);

// What a destination's listing holds, one name at a time.
struct ListedOutputs {
  std::vector<CommittedRange> committed;
  std::vector<SnapshotPart> parts;
  // Keeps `name` if it is a committed output or a snapshot part, of either
  // format; ignores any other name. Corruption, naming `where` + the name,
  // for one shaped as either that does not parse.
  [[nodiscard]] Status add(std::string_view where, std::string_view name);
};

// The name of the snapshot part that commit_snapshot_part(position) would
// commit, for the open output of `lower` whose largest time is `max_time`
// in a destination with `progress` whose last part was `last`, named
// `what` ("file destination") in the message: InvalidUsage when the part
// does not follow (progress set, lower not 0, a time other than as_of,
// not more pairs than `last` or another as_of, no pairs).
Result<std::string> next_snapshot_part_name(std::string_view what, Time lower,
                                            std::optional<Time> max_time,
                                            const std::optional<Frontier>& progress,
                                            const std::optional<SnapshotPosition>& last,
                                            const SnapshotPosition& position,
                                            std::string_view extension);

// The snapshot in progress that `parts` record, given the `progress` the
// committed outputs add up to: nullopt when there are no parts or the
// progress is set (the snapshot is complete; a part above that progress is
// Corruption). Otherwise the position of the part with the most pairs, with
// `check` set and no key; Corruption when parts disagree on the upper or
// two hold the same count. Sorts `parts` by pairs.
Result<std::optional<SnapshotPosition>> snapshot_in_progress(
    std::string_view where, std::vector<SnapshotPart>& parts,
    const std::optional<Frontier>& progress);

// The progress committed outputs add up to: the largest upper, nullopt when
// there are none; Corruption when two ranges overlap. Sorts `committed`.
Result<std::optional<Frontier>> committed_progress(std::string_view where,
                                                   std::vector<CommittedRange>& committed);

}  // namespace tidemark
