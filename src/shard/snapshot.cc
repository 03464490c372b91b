// Shard::snapshot and SnapshotCursor: consolidation on top of MergeCursor.
#include "shard/context.h"
#include "shard/merge.h"
#include "shard/read_internal.h"
#include "shard/state.h"
#include "tidemark/read.h"
#include "util/try.h"

namespace tidemark {

struct SnapshotCursor::Impl {
  Time as_of = 0;
  std::optional<ConsolidatingCursor> rows;
  // Destroyed after the rows: the pin keeps the parts from garbage
  // collection, the owner (if any) is the leased reader the pin is of.
  ReaderPins::Pin pin;
  std::unique_ptr<ReadHandle> owner;

  ~Impl() {
    rows.reset();
    pin = ReaderPins::Pin();
    owner.reset();
  }
};

SnapshotCursor::SnapshotCursor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SnapshotCursor::SnapshotCursor(SnapshotCursor&&) noexcept = default;
SnapshotCursor& SnapshotCursor::operator=(SnapshotCursor&&) noexcept = default;
SnapshotCursor::~SnapshotCursor() = default;

Time SnapshotCursor::as_of() const {
  return impl_->as_of;
}

Result<std::optional<SnapshotRow>> SnapshotCursor::next() {
  TM_ASSIGN(auto row, impl_->rows->next());
  if (!row) return std::optional<SnapshotRow>{};
  return std::optional<SnapshotRow>{SnapshotRow{row->key, row->value, row->diff}};
}

Result<SnapshotCursor> open_snapshot(const std::shared_ptr<ShardContext>& context_, Time as_of,
                                     ReaderPins::Pin pin, std::unique_ptr<ReadHandle> owner,
                                     const ReadMemory& memory) {
  TM_ASSIGN(StatePtr state_ptr, context_->fetch_for_read());
  const ShardState& state = *state_ptr;
  if (!state.upper.is_past(as_of)) {
    return make_error(ErrorKind::kNotReady,
                      "snapshot as of " + std::to_string(as_of) + " of shard " + state.name +
                          " is not complete yet: the upper is " + state.upper.to_string() +
                          " (as_of must be below it)");
  }
  if (state.since.is_past(as_of)) {
    return make_error(ErrorKind::kSinceViolation,
                      "snapshot as of " + std::to_string(as_of) + " of shard " + state.name +
                          " is below its since " + state.since.to_string() +
                          ": that history has been compacted");
  }
  std::vector<MergeCursor::PartRun> runs;
  for (const HollowBatch& batch : state.batches) {
    if (!batch.desc.lower.includes(as_of)) break;  // batches are in time order
    runs.push_back(MergeCursor::PartRun{batch.parts.get(), batch.ordered});
  }
  TM_ASSIGN(MergeCursor merge,
            MergeCursor::open(context_->read_blob, runs, TimeWindow{0, as_of}, {}, memory));
  auto impl = std::make_unique<SnapshotCursor::Impl>();
  impl->as_of = as_of;
  impl->rows.emplace(std::move(merge));
  impl->pin = std::move(pin);
  impl->owner = std::move(owner);
  return SnapshotCursor(std::move(impl));
}

}  // namespace tidemark
