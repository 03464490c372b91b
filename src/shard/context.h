// ShardContext: what every handle on one shard shares: its name, location,
// options and state machine.
//
// The read path (snapshots, listens, sinks, compaction's inputs) reads
// through `read_blob` and fetch_for_read(), which retry failures that may
// pass under options.read_retry; a closing shard ends those retries.
//
// Thread-safety: immutable after construction except the machine, which is
// itself thread-safe, `closing`, and the compactor's merge in flight
// (guarded by its own mutex).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "shard/machine.h"
#include "shard/spine.h"
#include "shard/state.h"
#include "tidemark/client.h"
#include "tidemark/location.h"

namespace tidemark {

class BackgroundCompactor;
class ChangeWatch;
class ReaderHeartbeats;
class ListenReaders;

struct ShardContext {
  ShardContext();
  ~ShardContext();  // stops the background compactor first

  std::string name;
  Location location;
  ClientOptions options;
  std::shared_ptr<ShardMachine> machine;
  // The Client's watch, which the machine tells of every state it learns.
  std::shared_ptr<ChangeWatch> changes;
  // One heartbeat for the leased readers of this shard opened here with
  // the default lease (read_handle.cc).
  std::shared_ptr<ReaderHeartbeats> reader_heartbeats;
  // One leased reader for the shard's listens opened here (read_handle.cc).
  std::shared_ptr<ListenReaders> listen_readers;
  // location.blob with its reads retried (retrying_blob.h).
  std::shared_ptr<Blob> read_blob;
  // Set when the shard closes: retries on the read path stop.
  std::shared_ptr<std::atomic<bool>> closing = std::make_shared<std::atomic<bool>>(false);
  // Null when background compaction is off. Declared last: destroyed first,
  // while what it uses is still there.
  std::unique_ptr<BackgroundCompactor> compactor;

  // Hands the background compactor a merge the spine needs (if there is
  // one and a compactor runs).
  void request_compaction(const ShardState& state);
  // When compaction moves inline parts into blob parts: once the state
  // holds half of what appends may fill it with.
  std::uint64_t inline_drain_bytes() const { return options.inline_state_max_bytes / 2; }
  // What next_merge goes by for this shard.
  SpineRules spine_rules() const { return {options.spine_fanout, inline_drain_bytes()}; }
  // The largest merge output of inline inputs that stays inline: one
  // inline part, as an append's. (An eighth of inline_state_max_bytes was
  // tried, with merges waiting for 32 inline batches: fewer commits at one
  // client, but at 1,000 clients inline bytes ran to the state's bound and
  // appends spilled to files.)
  std::uint64_t inline_merge_max_bytes() const { return options.inline_part_max_bytes; }

  // The merge this process's compactor is running, told by the upper of
  // its newest input: the batches below it are that merge's inputs. An
  // append's inline tail merge (merge_inline_tail) and a tail pass
  // (compact_shard_tail) merge only above it, so the compactor's inputs
  // stay whole for its compare-and-set. Before, nothing merged the
  // batches appended while a merge of tens of MB ran (50-180 ms): each
  // commit added one, reads passed kStallReadInputs and appends stalled.
  void begin_merge(Frontier through) {
    std::lock_guard lock(merging_mu_);
    merging_through_ = through;
  }
  void end_merge() {
    std::lock_guard lock(merging_mu_);
    merging_through_.reset();
  }
  // The index in `state` of the first batch above that merge's inputs
  // (first_batch_from, spine.h); nullopt when no merge is in flight.
  std::optional<std::size_t> first_above_merge(const ShardState& state) const;

  // The latest state, retrying failures that may pass (options.read_retry).
  [[nodiscard]] Result<StatePtr> fetch_for_read();
  // Asked by the read path's retries: true once the shard is closing.
  std::function<bool()> stop_reads() const;

 private:
  mutable std::mutex merging_mu_;
  std::optional<Frontier> merging_through_;
};

// While one lives on a thread, a merge that request_compaction finds due
// on that thread wakes the compactor only when the scope ends. The
// appender's committer holds one around a commit and the answers to its
// records: a pass woken by the commit could otherwise take the
// committer's CPU before the acknowledgements leave (about 120 us at one
// HTTP client). Scopes nest; each holds at most one pending context (a
// second shard's request is made at once). Not movable; the contexts it
// names must outlive it.
class DeferCompactionRequests {
 public:
  DeferCompactionRequests();
  ~DeferCompactionRequests();
  DeferCompactionRequests(const DeferCompactionRequests&) = delete;
  DeferCompactionRequests& operator=(const DeferCompactionRequests&) = delete;

  // The innermost scope on this thread, or null.
  static DeferCompactionRequests* current();
  // Notes `context` for the scope's end (with a tail pass when `tail_due`:
  // BackgroundCompactor::request); false when another context is pending
  // (the caller requests at once).
  bool defer(ShardContext* context, bool tail_due = false);

 private:
  DeferCompactionRequests* outer_;
  ShardContext* pending_ = nullptr;
  bool pending_tail_ = false;
};

}  // namespace tidemark
