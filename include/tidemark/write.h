// The write path: BatchBuilder and WriteHandle::compare_and_append.
//
// A BatchBuilder streams updates into parts of a target size, sorting and
// consolidating each part's updates, and uploads each part while it goes on
// building, with a bounded number of uploads in flight. Its memory is about
// part_target_bytes x (1 + max_uploads_in_flight), whatever the batch size.
//
// Each part is sorted on its own, so a read merges every part of such a
// batch at once, one open block each: a batch of thousands of small parts
// would cost every reader thousands of blocks. So finish() sorts a batch of
// more than kMaxLooseParts parts into one ordered run (each part's updates
// sort before the next part's), which a read opens one part at a time: it
// merges the parts (at most kRunFanIn at once, the smallest runs first)
// until one run is left, rewriting the batch's data ceil(log_kRunFanIn(parts))
// times. Meanwhile it holds one decoded block per merged input (at most
// kRunFanIn x block_bytes for updates smaller than a block; merge.h) and
// the part being written, and no upload is in flight.
//
// compare_and_append(batches, expected_upper, new_upper) is atomic (all
// batches or none), linearizable, and commits any number of batches with
// one consensus write; the shard registers them as one batch, ordered only
// when it is the call's one batch and was ordered. It returns ok, UpperMismatch{expected, current},
// or InvalidUsage. Each call carries an idempotency token: when a consensus write ends
// indeterminate, a retry with the same token either finds the append already committed or commits
// it, never twice.
//
// Thread-safety: a WriteHandle and a BatchBuilder are used from one thread
// at a time; distinct handles may be used concurrently.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tidemark/batch.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/update.h"

namespace tidemark {

struct ShardContext;
class PeriodicTask;

// The records of one idempotent producer that an append commits: sequence
// numbers first..last, consecutive, the last of them at `time`. The shard
// records the producer at `last` in the same consensus write as the data,
// so a retry of these records finds them committed (see appender.h).
struct ProducerRange {
  std::string producer;
  std::uint64_t first = 0;
  std::uint64_t last = 0;
  Time time = 0;
  bool operator==(const ProducerRange&) const = default;
};

// Made by WriteHandle::builder.
class BatchBuilder {
 public:
  BatchBuilder(BatchBuilder&&) noexcept;
  BatchBuilder& operator=(BatchBuilder&&) noexcept;
  // Abandons the batch: waits for uploads in flight and deletes every part.
  ~BatchBuilder();

  // REQUIRES: time >= lower (else InvalidUsage). Diff overflow when
  // consolidating is InvalidUsage too. After an error the builder is done.
  [[nodiscard]] Status add(std::string_view key, std::string_view value, Time time, Diff diff);

  // Flushes, waits for every upload, and returns the batch [lower, upper).
  // REQUIRES: every added time < upper; else InvalidUsage and the parts are
  // deleted.
  [[nodiscard]] Result<Batch> finish(Frontier upper);

  // As finish(), but only when it needs no I/O: the batch is one part that
  // travels inline (ClientOptions::inline_part_max_bytes), or none. Then
  // the batch, encoded on this thread. Otherwise std::nullopt, and finish()
  // with the same upper, on any thread, does the rest (the part stays
  // encoded in between: it is not encoded twice). For a thread that must
  // not wait for the blob store.
  [[nodiscard]] Result<std::optional<Batch>> finish_inline(Frontier upper);

  std::uint64_t added() const;

  // A batch of more parts than this is sorted into one run by finish();
  // the merge takes at most kRunFanIn inputs at once (see the top).
  static constexpr std::size_t kMaxLooseParts = 16;
  static constexpr std::size_t kRunFanIn = 64;

 private:
  friend class WriteHandle;
  // Parts are named after `writer_id` (garbage collection deletes the
  // unreferenced parts of writers that are gone).
  BatchBuilder(std::shared_ptr<ShardContext> context, std::string writer_id, Frontier lower);

  struct State;
  std::unique_ptr<State> state_;
};

// Opened by Shard::open_writer.
class WriteHandle {
 public:
  // Stops the heartbeat and removes the writer from the shard (best
  // effort: otherwise its lease runs out).
  ~WriteHandle();
  WriteHandle(const WriteHandle&) = delete;
  WriteHandle& operator=(const WriteHandle&) = delete;

  // The writer's id now: a handle whose lease expired (its process was
  // paused or cut off past it) registers a writer of a new id, at its next
  // heartbeat or when an append finds it gone (LeaseExpired).
  std::string writer_id() const;

  // The upper this handle last saw (after its own appends or a mismatch).
  Frontier upper() const { return upper_; }
  // Reads the shard's upper from consensus.
  [[nodiscard]] Result<Frontier> fetch_upper();

  BatchBuilder builder(Frontier lower);
  // Builds a batch [lower, upper) from in-memory updates.
  [[nodiscard]] Result<Batch> batch(std::span<const Update> updates, Frontier lower,
                                    Frontier upper);

  // Appends `batches` atomically if the shard's upper is `expected_upper`,
  // and sets it to `new_upper`. Every batch must belong to this shard and lie
  // in [expected_upper, new_upper). On success the batches are committed
  // (the shard owns their parts). On UpperMismatch or InvalidUsage they stay
  // with the caller, who may retry or drop them (dropping deletes them). On
  // Indeterminate they are kept alive (never deleted) and the caller may
  // retry with the same token. On LeaseExpired (this handle's writer, or the
  // writer of a batch's parts, lost its lease) nothing was appended and the
  // handle has registered anew: build the batches again and retry. Only
  // the writer that made an attempt remembers whether it landed: a retry
  // under the token of an Indeterminate attempt whose writer has been
  // replaced meanwhile is Indeterminate again, without trying (read the
  // shard to find out).
  [[nodiscard]] Status compare_and_append(std::span<Batch> batches, Frontier expected_upper,
                                          Frontier new_upper);
  [[nodiscard]] Status compare_and_append(std::span<Batch> batches, Frontier expected_upper,
                                          Frontier new_upper, std::string_view idempotency_token);
  // The same, committing the records of idempotent producers the batches
  // hold: each range must continue what the shard has committed for its
  // producer, else SequenceMismatch and nothing is appended (the caller
  // drops what is committed already and retries; see appender.h).
  [[nodiscard]] Status compare_and_append(std::span<Batch> batches, Frontier expected_upper,
                                          Frontier new_upper, std::string_view idempotency_token,
                                          std::span<const ProducerRange> producers);

  // The write stall, like LevelDB's when level 0 has too many files: while
  // this process compacts the shard in the background and a read of the
  // whole shard would merge more than 64 inputs at once (each part of an
  // appended batch is one; each compacted batch one), waits for compaction
  // to bring that down, polling every 10 ms; it gives up after 10 s
  // without progress, so a failing compactor slows appends rather than
  // stopping them. Without it, ingest faster than
  // compaction grows the shard's parts without bound, and with them what
  // every snapshot holds (one open block each): a 2 GiB ingest from 200
  // clients left 1,695 parts, and its snapshot needed over 128 MiB.
  // `stop` (when given) is asked at every poll: once it says true the wait
  // ends (an appender that is closing commits what it holds at once).
  // Returns how long it waited. The appender calls it before each commit;
  // compare_and_append itself never waits.
  std::chrono::milliseconds wait_for_compaction(const std::function<bool()>& stop = {});
  // Whether wait_for_compaction would wait now (as far as this process
  // knows the shard); never blocks.
  bool compaction_behind() const;

 private:
  friend class Shard;
  // REQUIRES: `writer_id` registered (Shard::open_writer does it, and
  // starts the lease heartbeat).
  WriteHandle(std::shared_ptr<ShardContext> context, std::string writer_id);
  // Starts the lease heartbeat; an error when no thread could be started.
  [[nodiscard]] Status start_heartbeat();
  std::uint64_t lease_expiry() const;
  // Registers a writer of a new id in place of `expired_id` (unless that
  // happened already).
  [[nodiscard]] Status reregister(const std::string& expired_id);

  std::shared_ptr<ShardContext> context_;
  mutable std::mutex mu_;
  std::string writer_id_;  // guarded by mu_
  // The token of the last attempt that ended Indeterminate, and the writer
  // that made it (guarded by mu_).
  std::string doubt_token_;
  std::string doubt_writer_;
  Frontier upper_;
  std::unique_ptr<PeriodicTask> heartbeat_;
};

}  // namespace tidemark
