// MergeCursor: a k-way merge of parts into one stream sorted by
// (key, value, time), keeping only updates whose times lie in a window.
//
// Each part is filtered to the intersection of its registered range (from
// the shard state), its own inline description, and the window. A part
// whose registered range and inline description do not overlap, or whose
// footer disagrees with its reference, is a Corruption error naming it.
//
// Inputs: each part is an input of its own, except the parts of an ordered
// run (a batch written by compaction: each part's updates all sort strictly
// before the next part's), which form one input that opens its parts one
// after another, each when the one before is exhausted. The run's order is
// checked across part boundaries: a part whose first key sorts before the
// previous part's last key, or whose first update (after filtering) does not
// sort strictly after the previous part's last update, is a Corruption error
// naming it. (The next part's footer is read before the previous part is
// closed, so its first key settles the check, without a copy of that last
// update, unless it repeats the last key; then at most kRunCheckValueBytes
// of the last value are kept, and the part read again if they do not
// settle it.)
//
// Memory: one decoded block per open part (PartReader streams by ranged
// reads), and at most one open part per run, plus a heap of input indices:
// O((unordered parts + runs) x block size), never O(data); open_block_bytes
// (below) computes it. Besides, while an input loads its next block, that
// block compressed and (within a part) a copy of the update before it for
// the order check, until it is checked; a run keeps at most
// kRunCheckValueBytes of a value for its check across parts (plus the key),
// unless it must read a part again to settle it. A block holds one update when
// that update exceeds the writer's block_bytes, so with huge updates the term
// is (inputs x the largest update), unless their key ranges keep them apart:
// a part whose first block decodes to more than kDeferBlockBytes (an input's
// first part at open, or a run's next part) has only its footer read, and
// loads that block once the merge reaches the part's first key (key_min).
// So parts of huge updates with disjoint key ranges (each append's part, or
// a compacted run's) hold one huge block at a time. A caller that must bound
// the worst case merges fewer inputs (the compactor does). Parts whose time
// range misses the window are never opened. Opening them concurrently
// changes no bound: every input's first block was read before the first
// update came out anyway (or is deferred).
//
// Read-ahead (read_ahead.h, issue #22): besides, up to
// ReadAheadBudget::kCursorBytes (16 MiB) of spans of the parts' objects
// fetched ahead or in flight (at most kCursorFetches in flight), plus a
// run's next part opened ahead (its footer and index), each granted
// before its fetch is issued and, with a
// ReadMemory pool, reserved from it with try_reserve (never past its
// capacity, and leaving the merge's blocks as much room again). Fetches
// run on the process's blob_io() threads; a cursor destroyed or moved with
// fetches in flight is safe (they hold what they touch).
//
// Speed: the merge keeps the part that produced the last update as the
// "current" one and compares its next update with the heap's top, so parts
// with disjoint key ranges cost one comparison per update.
//
// Thread-safety: single-threaded.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "part/part.h"
#include "tidemark/batch.h"
#include "tidemark/location.h"
#include "tidemark/read.h"
#include "tidemark/update.h"

namespace tidemark {

class ReadAheadBudget;

struct TimeWindow {
  Time min = 0;           // inclusive
  Time max = UINT64_MAX;  // inclusive
};

class MergeCursor {
 public:
  // Threads that open parts at once (see open()).
  static constexpr std::size_t kOpenThreads = 8;
  // Of the last value of a run's part, the order check against the next
  // part keeps at most this much (see Run).
  static constexpr std::size_t kRunCheckValueBytes = 1 << 20;
  // An input whose first block decodes to more than this loads it only when
  // the merge reaches the input's first key. Smaller ones are loaded at open,
  // concurrently, which hides blob latency.
  static constexpr std::uint64_t kDeferBlockBytes = 1 << 20;

  // Parts read as one input of the merge. ordered: the parts form one sorted
  // run (each part's updates all sort before the next part's), so they are
  // opened one after another; otherwise each part is an input of its own.
  struct PartRun {
    std::vector<PartRef> parts;
    bool ordered = false;
  };

  // Opens every unordered part and the first wanted part of each ordered
  // run, and reads each one's first update (unless its first block is over
  // kDeferBlockBytes: then only its footer): one by one while that is quick,
  // the rest on up to kOpenThreads threads (this one and jobs of the
  // process's blob_io() pool) once it has taken 2 ms;
  // the rest of a run is opened (and validated) as next() reaches it.
  // `stop` (when given) is asked before each part: once it says true, open
  // fails with Closed. `memory` (when it has a pool) is charged every
  // block an input loads, while the input holds it (ReadMemory, read.h):
  // the next block's decoded bytes are reserved before it loads: up to
  // kDeferBlockBytes at once (force_reserve), a larger block waiting for
  // room, and one that cannot get it in time fails next() (or open) with
  // Full.
  // `read_ahead`: off for compaction, whose merges have no pool to bound
  // it; on for reads, where it still stays off when every input opened in
  // under 2 ms (a local disk, where it would only cost CPU).
  [[nodiscard]] static Result<MergeCursor> open(std::shared_ptr<Blob> blob,
                                                const std::vector<PartRun>& runs, TimeWindow window,
                                                const std::function<bool()>& stop = {},
                                                ReadMemory memory = {}, bool read_ahead = true);
  // Every part an input of its own.
  [[nodiscard]] static Result<MergeCursor> open(std::shared_ptr<Blob> blob,
                                                const std::vector<PartRef>& parts,
                                                TimeWindow window);
  // Read-ahead (read_ahead.h) always on (even from a quick blob) or off for
  // cursors opened from now on, and back to the default (on where the blob
  // is slow). For tests that compare with the plain sequential read.
  static void set_read_ahead_for_testing(bool on);
  static void reset_read_ahead_for_testing();

  // Internal (merge.cc): a part opened for the merge, and one being opened
  // ahead of it.
  struct OpenedPart;
  struct PendingOpen;

  MergeCursor(MergeCursor&&) noexcept;
  MergeCursor& operator=(MergeCursor&&) noexcept;
  ~MergeCursor();

  // Read-ahead leaves `bytes` more of the ReadMemory pool free, for a caller
  // that charges the same pool while it reads (a listen's sorter, whose
  // growth waits for room: room read-ahead held would not come back while
  // it waits). Read-ahead starts with the first next(): call this before.
  void leave_room_for(std::uint64_t bytes);

  // The next update in (key, value, time) order, or nullopt at the end. The
  // view stays valid until the next call.
  [[nodiscard]] Result<std::optional<UpdateView>> next();

 private:
  struct Input;
  struct Run;
  MergeCursor();
  [[nodiscard]] Status advance(Input& input);
  // Reserves the decoded bytes of the block input.reader loads next
  // (releasing the current one's). REQUIRES: memory_.pool.
  [[nodiscard]] Status charge_next_block(Input& input);
  // Sets (or releases) input.block_memory, telling the read-ahead budget
  // what the merge's blocks hold.
  void hold_block(Input& input, Lease lease);
  void release_block(Input& input);
  // Moves input.block_memory out, as release_block, to the caller.
  std::optional<Lease> take_block(Input& input);
  // Marks an input with a reader whose next block is over kDeferBlockBytes as
  // deferred, its head the bound (key_min, "", 0); false when it loads now.
  static bool defer(Input& input);
  // Opens the run's next wanted part into `input`, or leaves it without a
  // reader when the run has no part left.
  [[nodiscard]] Status open_next_part(Input& input);
  // The order of `update` against the run's last update (as
  // compare_key_value_time), reading the last value back from its part when
  // the kept prefix cannot tell.
  [[nodiscard]] Result<int> compare_with_last(const Run& run, UpdateView update) const;
  // Moves a run on from its open part, whose last update is input.head:
  // opens the next wanted part and settles what it can of the order check
  // before closing the open one. A failed fetch leaves the input as it was.
  [[nodiscard]] Status leave_part(Input& input);
  bool less(std::size_t a, std::size_t b) const;
  // Starts opening the run's next wanted part after the open one on a
  // blob_io() thread (when the budget has room for its footer's fetch).
  void open_ahead(Run& run) const;
  // Waits for the part opened ahead (or opens it here, if no thread has
  // started) and clears run.ahead.
  [[nodiscard]] Result<std::optional<OpenedPart>> take_ahead(Run& run);
  static void cancel_ahead(Run& run);
  // Every input's read-ahead gives its bytes back.
  void drop_read_ahead();
  // Once a part is done (its bytes and fetches free): the inputs whose
  // spans the budget refused issue them now, those the merge needs first
  // first (the current input, then the heap's, its front first), until the
  // budget refuses again.
  void top_up_read_ahead();

  std::shared_ptr<Blob> blob_;               // the parts' readers fetch from *blob_
  std::shared_ptr<ReadAheadBudget> budget_;  // null: no read-ahead
  TimeWindow window_;
  ReadMemory memory_;
  std::vector<Input> inputs_;
  std::vector<std::size_t> heap_;  // min-heap of input indices, excluding current_
  std::optional<std::size_t> current_;
  bool started_ = false;
  bool read_ahead_ = true;  // false: the budget stays paused (see open())
  bool advance_current_ = false;
};

// Parts whose reference allows a largest block above this have their footer
// fetched by open_block_bytes for the exact figure.
inline constexpr std::uint64_t kExactBlockBytesAbove = 1 << 20;

// What a MergeCursor over `runs` holds run by run between block loads: the
// decoded_block_bytes of the largest block of every part of an unordered run
// (each part an input, all open at once), and of the largest one of any part
// of an ordered run (one part open at a time). Without I/O, a part's largest
// block is bounded by its reference (its whole payload as one block:
// max_block_length); with `fetch_footers`, parts bounded above
// kExactBlockBytesAbove have their footers fetched (concurrently, like
// open()) for their exact figure.
[[nodiscard]] Result<std::vector<std::uint64_t>> open_block_bytes(
    Blob& blob, const std::vector<MergeCursor::PartRun>& runs, bool fetch_footers);

// A MergeCursor whose consecutive updates with equal (key, value) are summed
// into one, zero sums dropped: the consolidation a snapshot does (times
// advanced to as_of) and a listen does within a window of one time. The
// update returned carries the time of the first update of its group; a sum
// that does not fit an i64 comes out as a carry (update.h), several updates.
//
// Memory: the current key and value are copied into buffers reused across
// updates (advancing the merge may invalidate the views it returned).
class ConsolidatingCursor {
 public:
  explicit ConsolidatingCursor(MergeCursor merge);

  // The next consolidated update, or nullopt at the end. Its views stay
  // valid until the next call.
  [[nodiscard]] Result<std::optional<UpdateView>> next();

 private:
  MergeCursor merge_;
  std::string key_;
  std::string value_;
  Time time_ = 0;
  DiffSum carry_ = 0;               // what is left of a total too large for one update
  std::optional<UpdateView> peek_;  // the first update of the next group
  bool exhausted_ = false;
};

}  // namespace tidemark
