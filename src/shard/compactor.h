// Compaction and garbage collection of one shard (DESIGN.md 7).
//
// compact_shard runs the merges next_merge (state.h) asks for until the
// spine is in shape. A merge streams its inputs through a MergeCursor (each
// input batch one run when its parts are ordered), advances every time t to
// max(t, since) (clamped into the output's description), consolidates equal
// (key, value, time), and writes the result as one ordered run of parts of
// part_target_bytes. It registers the output with one compare_and_set only
// if its inputs are all still there; otherwise it deletes what it wrote.
// Memory: one decoded block per open input (a run counts once) plus the
// part being written (about part_target_bytes + one block): never O(data).
//
// The compactor writes as a writer of its own (registered for the pass,
// leased, heartbeating between parts), so a compactor that dies leaves
// parts garbage collection recognizes as orphans; and it reads as a leased
// reader whose seqno hold (moved up before each merge) keeps GC from
// deleting the inputs of a merge in progress.
//
// collect_garbage (gc.cc):
//   1. drops expired leases (committed only if any expired);
//   2. lists the shard's parts and rollups, THEN reads the head state: a
//      writer that uploaded a listed part registered before the listing,
//      so it is in the head unless it is gone for good;
//   3. folds every retained version, oldest first, into the set of parts
//      referenced at or after seqno_since (live) and before it (retired);
//   4. deletes listed parts that are retired and not live, and parts no
//      retained version references whose writer is not in the head (crash
//      orphans); then truncates consensus below the rollup seqno_since's
//      version starts from; then deletes the rollups below that one.
// That order makes a pass that dies midway harmless: parts go while the
// versions that show them retired are still there, and the oldest
// retained version always finds its rollup. The next pass finishes.
//
// BackgroundCompactor: one thread per opened shard (when
// ClientOptions::background_compaction), woken by appends whose state needs
// a merge; it compacts, then collects garbage at most once a second.
//
// Thread-safety: compact_shard and collect_garbage may run concurrently in
// any number of threads and processes; lost races cost work, never data.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "shard/context.h"
#include "tidemark/client.h"

namespace tidemark {

// `stop` (when given) is checked between merges, while a merge opens its
// inputs and every 4096 updates it merges: once it returns true the merge
// in flight is abandoned (what it wrote is deleted) and the pass ends.
[[nodiscard]] Result<CompactionReport> compact_shard(ShardContext& context,
                                                     const std::function<bool()>& stop = {});
// `stop` (when given) is asked between steps of deletes: once it returns
// true the pass ends (what is left, the next pass deletes).
[[nodiscard]] Result<GcReport> collect_garbage(ShardContext& context,
                                               const std::function<bool()>& stop = {});

class BackgroundCompactor {
 public:
  // REQUIRES: `context` outlives this (it is a member of it).
  explicit BackgroundCompactor(ShardContext* context);
  ~BackgroundCompactor();
  BackgroundCompactor(const BackgroundCompactor&) = delete;
  BackgroundCompactor& operator=(const BackgroundCompactor&) = delete;

  // Wakes the compactor (starting its thread on first use).
  void request();

  // The last error of a background pass, for tests and metrics.
  std::optional<Error> last_error();

 private:
  void run();

  ShardContext* const context_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool requested_ = false;           // GUARDED_BY(mu_)
  bool stopping_ = false;            // GUARDED_BY(mu_)
  std::optional<Error> last_error_;  // GUARDED_BY(mu_)
  std::thread thread_;               // started under mu_
};

}  // namespace tidemark
