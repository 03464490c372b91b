// The spine's rules (spine.h): what a whole-shard read merges, which merge
// is due next, and replacing its inputs by its output.
#include "shard/spine.h"

#include <algorithm>
#include <vector>

#include "shard/transitions.h"
#include "tidemark/write.h"

namespace tidemark {
namespace {

// What a batch adds to read_inputs.
std::size_t batch_inputs(const HollowBatch& batch) {
  return batch.ordered ? std::size_t{!batch.parts.empty()} : batch.parts.size();
}

}  // namespace

std::size_t read_inputs(const ShardState& state) {
  std::size_t inputs = 0;
  for (const HollowBatch& batch : state.batches) inputs += batch_inputs(batch);
  return inputs;
}

std::optional<MergeRequest> next_merge(const ShardState& state, const SpineRules& rules,
                                       std::size_t first) {
  const std::uint64_t inline_drain_bytes = rules.inline_drain_bytes;
  const std::uint64_t fanout = std::clamp<std::uint64_t>(rules.fanout, 2, kSpineMaxFanout);
  const auto& batches = state.batches;
  if (first >= batches.size()) return std::nullopt;
  if (inline_drain_bytes != kNoInlineDrain && inline_bytes(state) >= inline_drain_bytes) {
    // From the oldest batch holding an inline part: everything after it.
    for (std::size_t i = first; i < batches.size(); ++i) {
      if (std::any_of(batches[i].parts.begin(), batches[i].parts.end(),
                      [](const PartRef& p) { return p.is_inline(); })) {
        return MergeRequest{i, batches.size()};
      }
    }
  }
  if (batches.size() - first < 2) return std::nullopt;
  // suffix[i] = total size of batches[i..].
  std::vector<std::uint64_t> suffix(batches.size() + 1, 0);
  for (std::size_t i = batches.size(); i-- > first;) {
    suffix[i] = suffix[i + 1] + batches[i].payload_bytes();
  }
  for (std::size_t i = first; i + 1 < batches.size(); ++i) {
    const bool due = (fanout - 1) * batches[i].payload_bytes() <= suffix[i + 1];
    const bool worth_it =
        suffix[i] >= kSpineMinMergeBytes || batches.size() - i >= kSpineMinMergeBatches;
    if (due && worth_it) return MergeRequest{i, batches.size()};
  }
  // Too many inputs for reads (see kSpineMaxReadInputs): the shortest tail
  // whose merge (one input) brings them to half the bound.
  const std::size_t inputs = read_inputs(state);
  if (inputs > kSpineMaxReadInputs) {
    std::size_t i = batches.size(), tail = 0;
    while (i > first && inputs - tail + 1 > kSpineMaxReadInputs / 2) {
      tail += batch_inputs(batches[--i]);
    }
    if (batches.size() - i >= 2 || tail > 1) return MergeRequest{i, batches.size()};
  }
  return std::nullopt;
}

std::size_t first_batch_from(const ShardState& state, Frontier lower) {
  const auto& batches = state.batches;
  const auto it = std::find_if(batches.begin(), batches.end(),
                               [&](const HollowBatch& batch) { return batch.desc.lower >= lower; });
  return static_cast<std::size_t>(it - batches.begin());
}

Result<CompactionOutcome> apply_compaction(ShardState& state, std::string_view writer_id,
                                           std::span<const HollowBatch> inputs,
                                           const HollowBatch& output, std::uint64_t now_ms) {
  expire_leases(state, now_ms);
  if (writer_id.empty()) {
    if (!std::all_of(output.parts.begin(), output.parts.end(),
                     [](const PartRef& p) { return p.is_inline(); })) {
      return invalid_usage("a compaction that writes to the blob store needs a writer");
    }
  } else if (!state.writers.contains(writer_id)) {
    // The pass was slower than its lease (its process paused, or its
    // backend calls slow): its output is garbage now; a new pass redoes it.
    return make_error(ErrorKind::kLeaseExpired,
                      "compaction writer " + std::string(writer_id) + " of shard " + state.name +
                          " lost its lease before its merge was applied: nothing was "
                          "replaced; compact again");
  }
  if (inputs.empty()) return invalid_usage("a compaction needs inputs");
  if (output.desc.lower != inputs.front().desc.lower ||
      output.desc.upper != inputs.back().desc.upper) {
    return invalid_usage("compaction output " + output.desc.to_string() +
                         " does not span its inputs");
  }
  auto& batches = state.batches;
  // Our own write, landed in an attempt whose outcome we did not learn.
  if (!output.parts.empty() && std::find(batches.begin(), batches.end(), output) != batches.end()) {
    return CompactionOutcome::kAlreadyApplied;
  }
  auto first = std::find(batches.begin(), batches.end(), inputs.front());
  if (first == batches.end() || static_cast<std::size_t>(batches.end() - first) < inputs.size() ||
      !std::equal(inputs.begin(), inputs.end(), first)) {
    return CompactionOutcome::kInputsGone;
  }
  auto last = first + static_cast<std::ptrdiff_t>(inputs.size());
  if (output.parts.empty()) {
    batches.erase(first, last);  // everything consolidated away
  } else {
    *first = output;
    batches.erase(first + 1, last);
  }
  return CompactionOutcome::kApplied;
}

}  // namespace tidemark
