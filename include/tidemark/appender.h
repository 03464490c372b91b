// Appender: managed, memory-bounded writes to one shard.
//
// Producers hand records to an AppendSender; they never pick times, batch
// or retry. In the background the appender:
//   - assigns each batch a time: wall-clock milliseconds, at least the
//     shard's upper and above the previous batch's (monotonic);
//   - cuts batches by bytes and record count (or after batch_linger while
//     the previous batch is still in flight) and uploads each batch's parts
//     while the previous commit is in flight (a builder and a committer,
//     run on a pool of threads shared by every appender of the process,
//     max(16, 8 x cores), only while there is work: an open appender with
//     nothing queued holds no thread);
//   - commits every ready batch with one compare_and_append (batch_appends;
//     off commits one batch per call, for comparison);
//   - after a commit is durable, releases the records' leases, then resolves
//     their commit tokens with the commit time.
// Idempotent producers: a sender opened for a producer (sender(producer,
// first_sequence)) numbers its records, and each commit records in the
// shard, atomically with the data, the last sequence number committed for
// each producer in it. Before every commit the committer checks those
// records against the shard: records already committed (by this process or
// any other, say a retry of a request that a killed server had committed)
// are dropped and their tokens resolve with the time they were committed
// at (counted by AppendSender::duplicates); a record that does not follow
// the producer's committed sequence fails (SequenceMismatch), and so does
// the first record of a new producer when the shard keeps
// ClientOptions::max_producers already (Full). A producer's records are
// committed in order, a prefix at a time.
//
// Groups: enqueue_group queues records that one compare_and_append commits,
// all or none; the builder never cuts a batch inside a group.
//
// On UpperMismatch (another writer moved the shard) pending batches are
// re-timed at the new upper and retried, or with MismatchPolicy::kBail
// their tokens fail instead. Indeterminate errors are retried with the
// same idempotency token; determinate ones are retried with backoff as
// `retry` allows; anything else (or too many retries) is fatal: every pending
// token fails and the appender closes. No token reports a commit that did
// not happen.
//
// Memory bound: every queued record is charged to the appender's pool
// (key + value + kRecordOverheadBytes, + kTokenOverheadBytes with a
// token: what it really holds) until its commit is durable and its memory
// freed. enqueue fails with Full while the pool has nothing available
// and otherwise charges the actual size (force_reserve), so the queue never
// exceeds queue_bytes by more than one call's records per sender. Beyond
// the queue, the batch builders hold at most part_target_bytes x (1 +
// uploads in flight) each (ClientOptions), and at most kMaxBuiltBatches
// built batches wait for the committer. A records mode (queue_records)
// bounds the count instead; it exists only to compare against. The commit
// latencies (AppenderStats) take at most 4 KiB, whatever the traffic.
//
// Thread-safety: Appender is safe for concurrent use. An AppendSender is
// move-only and used by one producer thread at a time; each producer takes
// its own sender. Token callbacks run on the appenders' pool (or on a
// thread committing here, AppendSender::set_commit_here): they must
// not block for long, nor drop the last reference to the appender (its
// destructor waits for its committer, which would be waiting for itself).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "tidemark/client.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/memory_pool.h"
#include "tidemark/retry.h"

namespace tidemark {

struct AppendRecord {
  std::string key;
  std::string value;
  Diff diff = 1;
};

// Bytes charged per record on top of its key and value: its queue entry
// (sequence numbers, diff, charge, producer, the strings' own headers), as
// the queue really stores it: three to a 512-byte block, plus the block's
// allocation header.
inline constexpr std::uint64_t kRecordOverheadBytes = 176;
// Charged on top of that for a record enqueued with a CommitToken: the
// token's shared state (a mutex, a condition variable, the outcome). A
// server that took a token per record held 52 MiB of them for a 24 MiB
// queue of tiny records before they were charged (heaptrack).
inline constexpr std::uint64_t kTokenOverheadBytes = 256;

// The records-mode bound when none is given (records mode exists only to
// compare against the byte bound).
inline constexpr std::size_t kDefaultQueueRecords = 50;

enum class MismatchPolicy : std::uint8_t {
  kRetime,  // re-time pending batches at the new upper and retry
  kBail,    // fail their tokens with a clear error
};

struct AppenderOptions {
  // The queue bound in bytes, when the appender makes its own pool.
  std::uint64_t queue_bytes = 64ull << 20;
  // Draw from this pool instead (the appender takes a child of it, bounded
  // by queue_bytes), so the appender counts in a process-wide budget.
  std::shared_ptr<MemoryPool> parent_pool;
  // Records mode, only for comparison: bound the queue by record count.
  std::optional<std::size_t> queue_records;
  std::uint64_t batch_max_bytes = 8ull << 20;
  std::size_t batch_max_records = 100'000;
  bool batch_appends = true;
  // While a batch is uploading or committing, the builder waits up to this
  // long for more records before cutting the next batch (unless a whole
  // batch is queued). An idle appender cuts at once. Under load this makes
  // fewer, larger parts: each part costs a file (or object) and a sync.
  std::chrono::milliseconds batch_linger{5};
  MismatchPolicy on_mismatch = MismatchPolicy::kRetime;
  // How failures of an upload or a commit are retried before the appender
  // gives up (fatal): 11 attempts, about 1.5 s of backoff in all.
  RetryPolicy retry{std::chrono::milliseconds(10), std::chrono::milliseconds(320), 11, {}};
  // The time source, in the shard's time unit; wall-clock milliseconds by
  // default.
  std::function<Time()> clock;
};

// Resolved once: with the commit time when the record is durable, or an
// error when it will never be committed.
class CommitToken {
 public:
  struct State;
  explicit CommitToken(std::shared_ptr<State> state);

  // Waits for the outcome.
  Result<Time> wait() const;
  // The outcome if there is one yet.
  std::optional<Result<Time>> poll() const;
  // Runs `done` once with the outcome: at once if it is known, else when it
  // is, on the thread that resolves it (the appenders' pool, or a sender's
  // thread committing here: AppendSender::set_commit_here).
  void on_complete(std::function<void(const Result<Time>&)> done) const;

 private:
  std::shared_ptr<State> state_;
};

class Appender;

class AppendSender {
 public:
  AppendSender(AppendSender&&) noexcept;
  AppendSender& operator=(AppendSender&&) noexcept;
  AppendSender(const AppendSender&) = delete;
  AppendSender& operator=(const AppendSender&) = delete;
  ~AppendSender();

  // Never blocks. Closed, Full (nothing available), or TooLarge (larger
  // than the whole queue bound); otherwise queued.
  [[nodiscard]] Status enqueue(AppendRecord record);
  [[nodiscard]] Status enqueue_many(std::span<AppendRecord> records);
  [[nodiscard]] Result<CommitToken> enqueue_with_token(AppendRecord record);
  // The same without a copy: `*record` is moved into the queue when it is
  // queued, and left as it was on Full or TooLarge (so Full can be retried
  // with it); after Closed it may be empty. For large values, which a copy
  // would double.
  [[nodiscard]] Result<CommitToken> enqueue_with_token(AppendRecord* record);
  // Queues `records` (moved from) as one group: they are committed by one
  // compare_and_append, or none is. The token resolves for all of them.
  // Closed, Full (nothing available), or TooLarge (the group is larger than
  // the whole queue bound); on Full and TooLarge `records` are left intact.
  // REQUIRES: a sender without a producer; records not empty.
  [[nodiscard]] Result<CommitToken> enqueue_group(std::span<AppendRecord> records);
  // Resolves once everything enqueued before it (by any sender) is durable
  // or has failed.
  [[nodiscard]] Result<CommitToken> canary();
  // Blocks until the queue has room (or the appender closes).
  void wait_for_capacity();

  // Commit here: when this sender queues records of at most 4 KiB (keys
  // and values) on an idle appender (nothing queued, building or
  // committing), the calling thread builds their batch and makes the
  // commit's first attempt itself before the enqueue returns, so the token
  // is usually resolved on return: no thread hop to the commit and none
  // back. The call then blocks for one consensus write (a sync on the
  // embedded default; a round trip to PostgreSQL); a commit that must first
  // wait for compaction, a failed attempt and anything queued meanwhile go
  // on on the appenders' pool. Token callbacks (of these records and of
  // others committed with them) may then run on the calling thread inside
  // the enqueue: it must hold no lock they take. Off by default.
  void set_commit_here(bool on) { commit_here_ = on; }

  // A producer's sender: the sequence number its next record gets, and how
  // many of its records were found committed already (not appended again).
  std::uint64_t next_sequence() const { return next_sequence_; }
  std::uint64_t duplicates() const;

  struct ProducerTag;

 private:
  friend class Appender;
  AppendSender(std::shared_ptr<Appender> appender, std::shared_ptr<ProducerTag> producer,
               std::uint64_t first_sequence);
  std::shared_ptr<Appender> appender_;
  std::shared_ptr<ProducerTag> producer_;  // null: no producer
  std::uint64_t next_sequence_ = 0;
  bool commit_here_ = false;
};

// An appender's latency figures, in microseconds: count and sum since it
// opened, quantiles over the last 10 to 20 seconds (from fixed histograms:
// within 1/16 of the true values). With no sample in that window, recent
// is 0 and so are the quantiles.
struct AppenderLatency {
  std::uint64_t count = 0;
  std::uint64_t sum_micros = 0;
  std::uint64_t recent = 0;  // samples in the window
  std::uint64_t p50_micros = 0;
  std::uint64_t p99_micros = 0;
};

struct AppenderStats {
  std::uint64_t records_committed = 0;
  std::uint64_t batches_committed = 0;
  std::uint64_t commits = 0;  // compare_and_append calls that succeeded
  std::uint64_t mismatches = 0;
  std::uint64_t retimed_batches = 0;
  std::uint64_t duplicates = 0;  // producer records found committed already
  std::uint64_t queued_records = 0;
  // Time the committer waited for compaction (WriteHandle::wait_for_compaction).
  std::uint64_t stall_ms = 0;
  // From each record's enqueue to its commit being durable: what a
  // producer waits for its token. A sample per record committed (count ==
  // records_committed); the clock is read once per enqueue call and once
  // per commit, not per record.
  AppenderLatency commit_latency;
  // The compare_and_append call of each commit that succeeded: a sample
  // per commit (count == commits).
  AppenderLatency commit_call;
  MemoryPoolStats pool;
};

class Appender : public std::enable_shared_from_this<Appender> {
 public:
  [[nodiscard]] static Result<std::shared_ptr<Appender>> open(std::shared_ptr<Shard> shard,
                                                              AppenderOptions options = {});
  ~Appender();
  Appender(const Appender&) = delete;
  Appender& operator=(const Appender&) = delete;

  AppendSender sender();
  // A sender for idempotent producer `producer` ([A-Za-z0-9._-]{1,128}),
  // whose next record is number `first_sequence` (see above). One sender
  // per producer at a time in a process: records of one producer must be
  // queued in order. A second sender may queue again numbers a first one
  // has queued and not yet committed (a client's retry reaching a server
  // that still holds its first try): each is committed once, and the
  // second copy resolves when the first does, with its outcome.
  [[nodiscard]] Result<AppendSender> sender(std::string producer, std::uint64_t first_sequence);
  // Waits until everything enqueued so far is durable; the first error of
  // those records, if any failed.
  [[nodiscard]] Status flush();
  // Stops accepting records and waits for the queued ones to be committed
  // (or to fail). Idempotent.
  void close();

  AppenderStats stats() const;
  // The error that stopped the appender (see above: a non-retryable error,
  // or too many retries, e.g. a backend down for longer than `retry`'s
  // backoff), or nullopt while it runs. A stopped appender fails every
  // enqueue with Closed; open a new one to go on.
  std::optional<Error> failure() const;
  const std::shared_ptr<MemoryPool>& pool() const;

  struct Impl;

 private:
  friend class AppendSender;

 protected:
  Appender() = default;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tidemark
