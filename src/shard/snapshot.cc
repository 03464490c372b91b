// Shard::snapshot and SnapshotCursor: consolidation on top of MergeCursor.
#include "shard/context.h"
#include "shard/merge.h"
#include "shard/state.h"
#include "tidemark/read.h"

namespace tidemark {

struct SnapshotCursor::Impl {
  Time as_of = 0;
  std::optional<MergeCursor> merge;
  // The (key, value) being summed is copied, since advancing the merge may
  // invalidate the views it came from. Buffers are reused across rows.
  std::string key;
  std::string value;
  std::optional<UpdateView> peek;  // the first update of the next group
  bool exhausted = false;
};

SnapshotCursor::SnapshotCursor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SnapshotCursor::SnapshotCursor(SnapshotCursor&&) noexcept = default;
SnapshotCursor& SnapshotCursor::operator=(SnapshotCursor&&) noexcept = default;
SnapshotCursor::~SnapshotCursor() = default;

Time SnapshotCursor::as_of() const {
  return impl_->as_of;
}

Result<std::optional<SnapshotRow>> SnapshotCursor::next() {
  Impl& s = *impl_;
  for (;;) {
    if (!s.peek) {
      if (s.exhausted) return std::optional<SnapshotRow>{};
      TM_ASSIGN(s.peek, s.merge->next());
      if (!s.peek) {
        s.exhausted = true;
        return std::optional<SnapshotRow>{};
      }
    }
    s.key.assign(s.peek->key);
    s.value.assign(s.peek->value);
    Diff sum = s.peek->diff;
    s.peek.reset();
    for (;;) {
      TM_ASSIGN(auto update, s.merge->next());
      if (!update) {
        s.exhausted = true;
        break;
      }
      if (update->key != s.key || update->value != s.value) {
        s.peek = update;
        break;
      }
      TM_ASSIGN(sum, checked_add_diff(sum, update->diff, "snapshot"));
    }
    if (sum != 0) return std::optional<SnapshotRow>{SnapshotRow{s.key, s.value, sum}};
  }
}

Result<SnapshotCursor> Shard::snapshot(Time as_of) {
  TM_ASSIGN(StatePtr state_ptr, context_->machine->fetch());
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
  std::vector<PartRef> parts;
  for (const HollowBatch& batch : state.batches) {
    if (!batch.desc.lower.includes(as_of)) break;  // batches are in time order
    parts.insert(parts.end(), batch.parts.begin(), batch.parts.end());
  }
  TM_ASSIGN(MergeCursor merge,
            MergeCursor::open(context_->location.blob, parts, TimeWindow{0, as_of}));
  auto impl = std::make_unique<SnapshotCursor::Impl>();
  impl->as_of = as_of;
  impl->merge = std::move(merge);
  return SnapshotCursor(std::move(impl));
}

}  // namespace tidemark
