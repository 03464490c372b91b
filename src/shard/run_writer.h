// RunWriter and merge_into: a merge of parts written back as one ordered
// run, shared by compaction (compactor.h) and by a BatchBuilder that sorts a
// batch of many parts into one run (write.h).
//
// RunWriter takes updates in strictly increasing (key, value, time) order
// (a carry aside: update.h) and writes them as parts of part_target_bytes,
// never cutting a carry between two parts, each named after the
// writer and carrying the run's description. With InlineOutput::kWhenSmall,
// a run that fits in one part of at most ShardContext::inline_merge_max_bytes
// (ClientOptions::inline_part_max_bytes) keeps that part inline
// (PartRef::data) instead of writing it to blob: the compactor asks for
// this when it merges inline parts only, so merging a shard's small appends
// costs a consensus write and no file until the state's inline parts are
// drained. With kOnly, a run that does not fit writes nothing and fails
// with TooLarge (the compactor then merges again as a registered writer).
// Memory: the part being written (its encoded blocks, about
// part_target_bytes, or one huge update compressed) and its open block's
// columns.
//
// merge_into streams a MergeCursor over `runs` into a RunWriter: times below
// `advance_to` advanced to it, equal (key, value, time) summed, zero sums
// dropped. Besides the RunWriter it holds what the MergeCursor holds
// (merge.h: one decoded block per open input) and a copy of the update
// being consolidated.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "part/part.h"
#include "shard/context.h"
#include "shard/merge.h"

namespace tidemark {

// Whether a run may stay inline (see above).
enum class InlineOutput : std::uint8_t { kNever, kWhenSmall, kOnly };

class RunWriter {
 public:
  // `after_part` (when given) runs after each part is written; its error
  // ends the run (the compactor renews its leases there).
  RunWriter(ShardContext& context, std::string writer_id, Description desc,
            std::function<Status()> after_part = {},
            InlineOutput inline_output = InlineOutput::kNever);
  RunWriter(const RunWriter&) = delete;
  RunWriter& operator=(const RunWriter&) = delete;

  // May take *value's buffer (PartWriter::add). `carry_goes_on`: the next
  // update continues this one's carry, so the part is not cut here.
  [[nodiscard]] Status add(std::string_view key, std::string* value, Time time, Diff diff,
                           bool carry_goes_on = false);

  // Writes the part in progress, if any.
  [[nodiscard]] Status flush();

  // Deletes every part written to blob (the run is not going to be
  // registered).
  void drop();

  std::vector<PartRef>& written() { return written_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  // Writes the part in progress; `last`: no update follows (so a run of one
  // small part may stay inline).
  [[nodiscard]] Status write_part(bool last);

  ShardContext& context_;
  const std::string writer_id_;
  const Description desc_;
  const std::function<Status()> after_part_;
  const InlineOutput inline_output_;
  std::optional<PartWriter> part_;
  std::vector<PartRef> written_;
  std::uint64_t bytes_ = 0;
};

// `what` names the merge in a stop's message. `stop` is asked
// while the inputs open and every 4096 updates: once it says true the merge
// ends with Closed. Flushes `out` at the end.
[[nodiscard]] Status merge_into(ShardContext& context,
                                const std::vector<MergeCursor::PartRun>& runs, Time advance_to,
                                RunWriter& out, std::string_view what,
                                const std::function<bool()>& stop = {});

}  // namespace tidemark
