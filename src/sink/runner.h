// run_sink: a sink from a shard into a SinkDestination.
//
// The sink holds a critical reader named after it ("sink-<name>"), so the
// shard's since never passes what it still has to read, across restarts.
// With no progress yet it emits the snapshot at as_of (default: upper - 1)
// as pairs at time as_of, committed as the interval [0, as_of + 1). From
// then on it follows the shard: for each new upper it walks the pairs of
// the times [progress, upper) and commits once the open interval holds
// roll_bytes or is commit_interval old, then moves its since hold to
// progress - 1. Polls of the upper slow down while nothing is pending (up
// to idle_poll_interval). A restarted sink resumes from the destination's progress:
// nothing committed is emitted again, nothing is skipped.
//
// Faults: its reads retry under the shard's ClientOptions::read_retry, and
// its polls of the upper and moves of its hold under `retry`; a failure
// past those ends the run with the error (a caller that runs it again
// resumes from the committed progress).
//
// Memory: the walker's (O(1) in diffs and group sizes) plus the reads'
// (O(open parts x block), charged to options.read_memory when it has a
// pool) plus the destination's own bound (a file's write buffer, a Kafka
// producer's queue).
//
// SinkRun is the same sink taken one step at a time, so that many sinks
// can share a few threads: step() does the work that is ready (polls the
// upper once, then emits and commits an interval or the snapshot) and says
// how long to wait before the next step, and finish() commits what a
// stopped run has written. run_sink drives one on the caller's thread;
// the server drives its sinks on a shared pool (server/sinks.h).
//
// Thread-safety: run_sink runs on the caller's thread until `until` is
// reached, `stop` returns true, or an error. A SinkRun is used by one
// thread at a time.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "sink/destination.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/retry.h"

namespace tidemark {

struct SinkProgress {
  Frontier frontier;          // every pair at a time < frontier is committed
  Frontier target;            // the frontier the open interval will commit
  bool snapshot = false;      // the open interval is the snapshot
  std::uint64_t pairs = 0;    // emitted by this run
  std::uint64_t commits = 0;  // intervals committed by this run
  std::uint64_t primary_key_violations = 0;
};

struct SinkOptions {
  static constexpr std::uint64_t kTickPairs = 1 << 16;

  std::string sink_name;
  std::optional<Time> as_of;
  std::optional<Time> until;  // stop once the committed frontier reaches it
  std::uint64_t roll_bytes = 64ull << 20;
  std::chrono::milliseconds commit_interval{1000};
  // How often the shard's upper is polled while an interval is open; with
  // nothing pending the polls slow down, doubling up to idle_poll_interval
  // (a sink that has been idle sees the next change within that).
  std::chrono::milliseconds poll_interval{50};
  std::chrono::milliseconds idle_poll_interval{1000};
  std::function<void(const SinkProgress&)> on_progress;  // after each commit
  std::function<void(const SinkProgress&)> on_tick;      // every kTickPairs pairs
  std::function<bool()> stop;
  // What its reads charge their decoded blocks to (read.h); none: nothing.
  ReadMemory read_memory;
  // Waits between polls: sleeps the time given, or less once `stop` would
  // say true (a condition variable the stopper notifies). None: sleeps in
  // steps of 50 ms, asking `stop` after each.
  std::function<void(std::chrono::milliseconds)> sleep;
  RetryPolicy retry{std::chrono::milliseconds(10), std::chrono::milliseconds(1000), 0,
                    std::chrono::milliseconds(30'000)};
};

class ReadHandle;

class SinkRun {
 public:
  // Opens the sink's critical reader. `shard` and `destination` must
  // outlive the run.
  [[nodiscard]] static Result<std::unique_ptr<SinkRun>> open(Shard& shard,
                                                             SinkDestination& destination,
                                                             SinkOptions options);
  ~SinkRun();
  SinkRun(const SinkRun&) = delete;
  SinkRun& operator=(const SinkRun&) = delete;

  // Does the work that is ready. Returns how long to wait before the next
  // step (zero: at once; the waits grow while nothing is pending, up to
  // idle_poll_interval, and never pass an open interval's commit time), or
  // nullopt once the run is over (`until` reached, or the shard closed:
  // everything written is committed).
  [[nodiscard]] Result<std::optional<std::chrono::milliseconds>> step();
  // Commits the open interval, if any (a stopped sink keeps what it wrote).
  [[nodiscard]] Status finish();
  const SinkProgress& progress() const { return progress_; }
  // Since when the run has had nothing in hand: its snapshot and every
  // interval it opened are committed, and nothing has been committed
  // since. nullopt while it has work in hand. A server closes the
  // destinations of sinks idle for long (server/sinks.h).
  std::optional<std::chrono::steady_clock::time_point> idle_since() const;

 private:
  SinkRun(Shard& shard, SinkDestination& destination, SinkOptions options,
          std::unique_ptr<ReadHandle> reader);
  Result<std::optional<std::chrono::milliseconds>> snapshot_step();
  Result<std::optional<std::chrono::milliseconds>> follow_step();
  Status commit();
  void report();
  std::chrono::milliseconds backoff(std::optional<std::chrono::steady_clock::time_point> deadline);

  Shard& shard_;
  SinkDestination& destination_;
  const SinkOptions options_;
  std::unique_ptr<ReadHandle> reader_;
  SinkProgress progress_;
  bool snapshot_done_;
  bool interval_open_ = false;
  std::chrono::steady_clock::time_point opened_at_;
  std::chrono::steady_clock::time_point committed_at_;  // or opened, if none yet
  Frontier written_;                                    // pairs below it are in the open interval
  std::chrono::milliseconds wait_{0};                   // the next wait while nothing is pending
};

[[nodiscard]] Result<SinkProgress> run_sink(Shard& shard, SinkDestination& destination,
                                            const SinkOptions& options);

}  // namespace tidemark
