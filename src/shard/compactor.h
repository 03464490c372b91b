// Compaction of one shard (garbage collection is gc.h).
//
// compact_shard runs the merges next_merge (spine.h) asks for until the
// spine is in shape. A merge streams its inputs through a MergeCursor (each
// input batch one run when its parts are ordered), advances every time t to
// max(t, since) (clamped into the output's description), consolidates equal
// (key, value, time), and writes the result as one ordered run of parts of
// part_target_bytes. It registers the output with one compare_and_set only
// if its inputs are all still there; otherwise it deletes what it wrote.
//
// Memory, never O(data):
//   - the inputs' open blocks (MergeCursor: one decoded block per open
//     input, a run counting once), at most kMergeBlockBudgetBytes: a merge
//     whose inputs need more (open_block_bytes) takes only some adjacent
//     inputs that fit (fit_merge), never fewer than two, and leaves the rest
//     to later merges. Only two inputs whose largest blocks exceed the budget
//     together exceed it (a block holds one update when that is larger than
//     block_bytes). An unordered batch is one input whatever its parts, so a
//     batch of k parts each holding a huge update costs k of them;
//   - while one input loads its next block: that block compressed, and
//     within a part a copy of the update before it (MergeCursor);
//   - a copy of the update being consolidated, which becomes the output
//     block's value column when it is a block of its own (PartWriter::add);
//   - the part being written: its encoded blocks (about part_target_bytes,
//     or one huge update compressed) and the open block's columns.
// So with updates of U >= block_bytes bytes a merge holds about 2U (or the
// budget) + 2U, and up to one U more while an input loads: 64 to 80 MiB for
// updates of 16 MiB (measured: 68 MiB of heap merging twelve of them).
//
// The compactor writes as a writer of its own (registered for the pass,
// leased, heartbeating between parts), so a compactor that dies leaves
// parts garbage collection recognizes as orphans; and it reads as a leased
// reader whose seqno hold keeps GC from deleting the inputs of a merge in
// progress. The commit of each merge moves that hold to the version it
// writes (the next merge's inputs are referenced there or later), and the
// commit of the pass's last merge removes the writer and the reader: a
// pass of one merge costs two consensus writes. A merge of inline parts
// whose output fits in one inline part registers neither (it writes no
// blob object and reads none): one consensus write. The pass registers
// before the first merge that may write to blob, and reads the state again
// under its hold.
//
// BackgroundCompactor: one per opened shard (when
// ClientOptions::background_compaction), woken by appends whose state needs
// a merge. A request queues one pass on the process's compaction pool
// (util/executor.h: max(2, cores) threads shared by every shard, oldest
// request first); a pass compacts (at most kMaxMergesPerPass merges, so
// shards take turns), then collects garbage at most once a second, and
// queues another if a request came meanwhile. At most one pass of a shard
// is queued or running at a time, and beside it at most one tail pass
// (compact_shard_tail), queued by a request that finds a merge due above
// the pass's merge in flight. Each holds a pool thread: the process's
// compaction memory stays within one merge's bound per pool thread.
//
// Thread-safety: compact_shard may run concurrently with itself and with
// collect_garbage (gc.h) in any number of threads and processes; lost races
// cost work, never data.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "shard/context.h"
#include "tidemark/client.h"

namespace tidemark {

// What a merge's inputs may hold in open blocks (see above).
inline constexpr std::uint64_t kMergeBlockBudgetBytes = 32 << 20;

// What one merge takes of the `inputs` next_merge asked to merge (adjacent
// batches, oldest first, at least two): all of them when their open blocks
// (open_block_bytes) fit `budget`; otherwise, of the windows of adjacent
// inputs that fit (any two inputs make one when no two fit), the longest,
// and of those the one with the least data, so that inputs too big to merge
// many at a time merge in pairs of similar size rather than one by one into
// a growing run. Reads the footers of big parts only when the references
// alone do not show that everything fits. Indices are into `inputs`.
[[nodiscard]] Result<MergeRequest> fit_merge(Blob& blob, std::span<const HollowBatch> inputs,
                                             std::uint64_t budget = kMergeBlockBudgetBytes);

// How a pass commits its registration and its merges: each in a consensus
// write of its own, or (the background compactor's passes) riding in the
// appends' commits while appends commit in this process
// (ShardMachine::apply_riding): no write, no sync and no lost race of their
// own for the next append, at the cost of waiting for it (at most
// kRideWait a commit). A caller that compacts between its own appends
// (Shard::compact) must not wait for them.
enum class PassCommits : std::uint8_t { kOwn, kRideAppends };

// `stop` (when given) is checked between merges, while a merge opens its
// inputs and every 4096 updates it merges: once it returns true the merge
// in flight is abandoned (what it wrote is deleted) and the pass ends.
[[nodiscard]] Result<CompactionReport> compact_shard(ShardContext& context,
                                                     const std::function<bool()>& stop = {},
                                                     PassCommits commits = PassCommits::kOwn);

// As compact_shard, but only while this process's compactor has a merge in
// flight (ShardContext::begin_merge), and only above it, as a spine of its
// own: the batches appends add meanwhile, which would otherwise wait for
// that merge (50-180 ms for tens of MB under 100 clients) and pass the
// write stall's bound. Ends once that merge ends, when no merge is due
// there, or at a merge whose inputs are over kTailMergeMaxBytes encoded,
// which it leaves to the running pass: so beside the running merge it
// holds at most that much in open blocks, and the part it writes. Lost
// races with the running pass cost work only.
inline constexpr std::uint64_t kTailMergeMaxBytes = 8 << 20;
[[nodiscard]] Result<CompactionReport> compact_shard_tail(ShardContext& context,
                                                          const std::function<bool()>& stop = {},
                                                          PassCommits commits = PassCommits::kOwn);

// Does, within `state`, the merges next_merge asks for while their inputs
// are all inline parts that together fit one inline part
// (ShardContext::inline_merge_max_bytes) and the state's inline parts are
// below the drain mark; stops at the first that does not qualify (or whose
// output does not fit inline), which is left to the compactor. Reads and
// writes nothing outside the state: an append whose commit makes such a
// merge due carries it in that same commit, rather than the compactor
// committing it a moment later on its own (a second sync, and a lost
// compare-and-set for whichever append comes next). While this process's
// compactor runs a merge (ShardContext::begin_merge), it looks only at the
// batches above that merge's inputs, as a spine of their own: the tail
// keeps merging while the compactor is busy with a large merge, and the
// compactor's inputs stay whole. Memory: inputs of at
// most one inline part's worth encoded and kInlineTailMergePayloadBytes
// decoded (a few KiB can hold far more of a value that compresses well:
// such merges are the compactor's, within its block budget), and the
// output. Returns the number of merges done.
inline constexpr std::uint64_t kInlineTailMergePayloadBytes = 1 << 20;
int merge_inline_tail(ShardContext& context, ShardState& state, std::uint64_t now_ms);

class BackgroundCompactor {
 public:
  // REQUIRES: `context` outlives this (it is a member of it).
  explicit BackgroundCompactor(ShardContext* context);
  // Waits for a pass in progress to stop (it stops between merges, or
  // within 4096 updates of one); a queued pass then does nothing.
  ~BackgroundCompactor();
  BackgroundCompactor(const BackgroundCompactor&) = delete;
  BackgroundCompactor& operator=(const BackgroundCompactor&) = delete;

  // Queues a pass unless one is queued or running (which then runs again).
  // With `tail_due` (a merge is due above the running pass's merge in
  // flight: ShardContext::begin_merge), also a tail pass beside it, unless
  // one is queued or running.
  void request(bool tail_due = false);

  // The last error of a background pass, for tests and metrics.
  std::optional<Error> last_error();

  struct Shared;  // what a queued pass holds (compactor.cc)

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace tidemark
