// The spine: the batches of a shard as compaction keeps them, in geometric
// size classes, and the transition that replaces a run of them by its merge.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "shard/state.h"
#include "tidemark/error.h"

namespace tidemark {

// What a read of the whole shard merges at once (MergeCursor inputs): one
// per part of an unordered batch, one per ordered batch (its parts open
// one at a time). Each holds an open block while the read runs, so this is
// what the write stall (WriteHandle::wait_for_compaction) keeps bounded.
std::size_t read_inputs(const ShardState& state);

// Batches are kept in geometric size classes: a merge is due when some
// batch b[i] is at most 1 / (fanout - 1) of the total size of the batches
// after it; it takes b[i] and every batch after it. The fanout is
// kSpineFanout unless ClientOptions::spine_fanout says otherwise. Like a
// counter in base fanout, the data after a batch grows to (fanout - 1)
// times its size before the two merge, so n appends of similar size leave
// at most about (fanout - 1) log_fanout(n) batches, and each byte is
// rewritten about log_fanout(n) times.
//
// The fanout trades rewrites against batches, so merge work against what
// a whole-shard read merges:
//   - until issue #19's twelfth step a batch merged once the data after
//     it reached half its size (a fanout of 1.5): each merge grew the
//     oldest batch by only 1.5x, and a byte was rewritten about
//     log1.5(n) times;
//   - 2 (a binary counter; until the seventeenth step): log2(n) rewrites;
//   - 4: log4(n), half of that, for at most about three batches per size
//     class. Under 100 clients' one-record appends of 100 bytes, compaction
//     was 14-17% of the server's CPU, most of it merges into the blob store;
//     the spine's simulation of 10,000 equal appends (compaction_test.cc)
//     rewrites a byte 4.5-4.6 times instead of 5.7-6.7, and leaves 7-8
//     batches instead of 5.
//
// Sizes are uncompressed payload bytes (HollowBatch::payload_bytes), what
// a merge decodes and encodes again. Encoded sizes misled it: a part of
// one small update is mostly its fixed framing, while in a merged part an
// update that compresses well costs a few bytes, so one append weighed as
// much as dozens of merged updates and the merged batch was rewritten with
// every few appends (about 850 updates per merge and over 100 rewrites of
// each update, for 100-byte appends of one repeated character).
//
// Small merges wait for width: a due merge whose run totals less than
// kSpineMinMergeBytes waits until it spans kSpineMinMergeBatches batches.
// Without this, a stream of tiny appends merged its tail on nearly every
// append (each merge a part write, a CaS and later a delete). So the spine
// holds at most kSpineMinMergeBatches - 1 extra small batches at its tail.
inline constexpr std::uint64_t kSpineFanout = 4;
// ClientOptions::spine_fanout is clamped to [2, kSpineMaxFanout].
inline constexpr std::uint64_t kSpineMaxFanout = 64;
static_assert(kSpineFanout >= 2 && kSpineFanout <= kSpineMaxFanout);
inline constexpr std::uint64_t kSpineMinMergeBytes = 256 << 10;
inline constexpr std::size_t kSpineMinMergeBatches = 8;
// Whatever the sizes and widths, a spine whose whole-shard read would merge
// more than this many inputs (read_inputs) merges its shortest tail that
// brings them to half of it: otherwise a tail of wide loose batches (a
// busy appender's commits) could pass the write stall's trigger
// (kStallReadInputs) with no merge due, and every commit would wait out
// the stall's 10 s.
inline constexpr std::size_t kSpineMaxReadInputs = 48;

// The write stall (WriteHandle::wait_for_compaction), like LevelDB's when
// level 0 has too many files: while this process compacts the shard in the
// background and a read of the whole shard would merge more than
// kStallReadInputs inputs (read_inputs), an append waits for compaction to
// bring that down, polling every kStallPoll, and gives up after
// kStallMaxWait without progress.
inline constexpr std::size_t kStallReadInputs = 64;
inline constexpr std::chrono::milliseconds kStallPoll{10};
inline constexpr std::chrono::milliseconds kStallMaxWait{10'000};
static_assert(kSpineMaxReadInputs < kStallReadInputs, "compaction must act before appends stall");

// A run of adjacent batches [begin, end) to merge into one.
struct MergeRequest {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// What next_merge goes by besides the state: the fanout
// (ClientOptions::spine_fanout, clamped to [2, kSpineMaxFanout]), and the
// inline bytes at which the state's inline parts are moved into the blob
// store (kNoInlineDrain: never for that reason).
inline constexpr std::uint64_t kNoInlineDrain = UINT64_MAX;
struct SpineRules {
  std::uint64_t fanout = kSpineFanout;
  std::uint64_t inline_drain_bytes = kNoInlineDrain;
};

// The merge the spine needs next: the oldest batch that breaks the size
// rule (and whose run is wide or big enough), with every batch after it,
// or the tail kSpineMaxReadInputs asks for. nullopt when the spine is in
// shape. Once the state's inline parts reach `rules.inline_drain_bytes`,
// the oldest batch holding one and every batch after it instead (a merge
// writes its output to the blob store), even when that is a single batch.
//
// With `first`, the spine from batches[first] on only, as if the batches
// before it were not there (they are a merge in flight: see
// ShardContext::begin_merge); the bound on read inputs still counts them.
std::optional<MergeRequest> next_merge(const ShardState& state, const SpineRules& rules = {},
                                       std::size_t first = 0);

// The index of the first batch at or above `lower` (batches.size() when
// none is): the first that a merge of inputs below `lower` did not take.
std::size_t first_batch_from(const ShardState& state, Frontier lower);

enum class CompactionOutcome : std::uint8_t {
  kApplied,         // the inputs were replaced by the output
  kAlreadyApplied,  // the output is registered already (a retried write)
  kInputsGone,      // the inputs are no longer all there: nothing changed
};

// Replaces `inputs` (adjacent batches, exactly as the compactor read them)
// with `output`, if they are still in the state. The writer must be live
// (its parts would otherwise be orphans GC may delete): LeaseExpired if not.
// An output of inline parts only has no blob object to orphan: its
// `writer_id` may be empty (a merge that registered no writer).
// REQUIRES: output.desc spans the inputs' descriptions.
[[nodiscard]] Result<CompactionOutcome> apply_compaction(ShardState& state,
                                                         std::string_view writer_id,
                                                         std::span<const HollowBatch> inputs,
                                                         const HollowBatch& output,
                                                         std::uint64_t now_ms);

}  // namespace tidemark
