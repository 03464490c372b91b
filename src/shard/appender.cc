// The background appender (include/tidemark/appender.h).
//
// Two tasks per appender (SerialTasks on the process's appenders pool,
// util/executor.h, run only when there is work). The builder takes queued
// records in order,
// cuts a batch by bytes and count, gives it the next time and uploads its
// parts; the committer takes every built batch (or one, without
// batch_appends), makes sure their times still lie at or above the shard's
// upper (re-building any that do not), and commits them with one
// compare_and_append. Records stay charged to the appender's pool (one
// lease for the queue, one per batch) until that commit is durable and
// their memory freed; then the charge is released and the tokens resolved,
// in that order. A small batch (kBuildHereMaxBytes), or one whose part
// travels inline (up to kEncodeHereMaxBytes), is built on the builder's own
// thread, and the builder runs the committer there too when it is idle
// (SerialTask::run_here): one thread hop from the request to its commit
// instead of three. A sender set to commit here (AppendSender::
// set_commit_here) goes further on an idle appender: its own thread builds
// and commits the batch, no hop at all, and hands whatever cannot be done in
// one attempt to the pool (a Handoff).
#include "tidemark/appender.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include "shard/context.h"
#include "shard/state.h"
#include "tidemark/write.h"
#include "util/clock.h"
#include "util/executor.h"
#include "util/ids.h"
#include "util/latency_window.h"
#include "util/thread.h"
#include "util/try.h"

namespace tidemark {
namespace {

// Batches uploading or waiting for the committer, at most. Uploads run
// concurrently, so under blob latency a batch cut while another uploads
// does not wait for it.
constexpr std::size_t kMaxBuiltBatches = 16;
// A batch whose records' keys and values take at most this many bytes is
// built on the builder's thread, not the batch builds pool: its part is
// small enough to travel inline (ClientOptions::inline_part_max_bytes'
// default), so its build does no I/O and costs less than the hop. (With
// inline parts turned off it uploads one small part from there.)
constexpr std::uint64_t kBuildHereMaxBytes = 4096;
// A larger batch of up to this many bytes of keys and values is encoded on
// the builder's thread too (BatchBuilder::finish_inline), and its part
// goes to the batch builds pool only when it must be written to the blob
// store. Updates that compress well travel inline from far larger batches
// than 4 KiB: under 100 clients' appends of one 100-byte record each the
// batches took about 9 KB, and the hop to the pool and the wake back cost
// a cycle of the committer 100-150 us of its 790 (in process: 8-9% more
// records/s; at 1,000 clients, with batches of about 66 KB, 5-6%).
constexpr std::uint64_t kEncodeHereMaxBytes = 256 << 10;
// Failures remembered for canaries (the most recent).
constexpr std::size_t kMaxRememberedFailures = 64;
// The appender whose builder (and committer) a producer's thread is running
// for its own records (AppendSender::set_commit_here), or null.
thread_local const void* committing_here = nullptr;
// The appender whose committer runs inside its builder's run on this thread
// (the builder looks again when it returns: no need to notify it).
thread_local const void* committer_in_builder = nullptr;

// Sets a thread_local pointer for a scope, restoring the one before (an
// appender's token callback may enqueue into another appender).
class ScopedMark {
 public:
  ScopedMark(const void** mark, const void* value) : mark_(mark), before_(*mark) { *mark = value; }
  ~ScopedMark() { *mark_ = before_; }
  ScopedMark(const ScopedMark&) = delete;
  ScopedMark& operator=(const ScopedMark&) = delete;

 private:
  const void** mark_;
  const void* before_;
};

// Commits in a row that met producer records another process committed
// meanwhile, before the appender gives up (each one drops those records,
// so this is a livelock guard, not a retry budget).
constexpr int kMaxSequenceConflicts = 1000;

}  // namespace

// --- CommitToken ------------------------------------------------------------

struct CommitToken::State {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Result<Time>> outcome;
  std::vector<std::function<void(const Result<Time>&)>> callbacks;

  void resolve(Result<Time> result) {
    std::vector<std::function<void(const Result<Time>&)>> run;
    {
      std::lock_guard lock(mu);
      if (outcome) return;
      outcome = std::move(result);
      run.swap(callbacks);
    }
    cv.notify_all();
    // The outcome never changes once set, so it is safe to read unlocked.
    for (auto& callback : run) callback(*outcome);
  }
};

CommitToken::CommitToken(std::shared_ptr<State> state) : state_(std::move(state)) {}

Result<Time> CommitToken::wait() const {
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->outcome.has_value(); });
  return *state_->outcome;
}

std::optional<Result<Time>> CommitToken::poll() const {
  std::lock_guard lock(state_->mu);
  return state_->outcome;
}

void CommitToken::on_complete(std::function<void(const Result<Time>&)> done) const {
  {
    std::lock_guard lock(state_->mu);
    if (!state_->outcome) {
      state_->callbacks.push_back(std::move(done));
      return;
    }
  }
  done(*state_->outcome);
}

struct AppendSender::ProducerTag {
  std::string id;
  std::atomic<std::uint64_t> duplicates{0};
};

// --- Appender::Impl ---------------------------------------------------------

struct Appender::Impl {
  struct Record {
    std::uint64_t seq = 0;  // this appender's order of records
    std::string key;
    std::string value;
    Diff diff = 1;
    // What it is charged (charge()): bytes of the lease of whatever holds
    // it, the queue or its batch. One lease per container, not per record:
    // a record stays small and queuing it touches no shared counter.
    std::uint64_t charge = 0;
    std::shared_ptr<CommitToken::State> token;
    std::shared_ptr<AppendSender::ProducerTag> producer;  // null: none
    std::uint64_t sequence = 0;                           // the producer's number for it
    bool group_end = true;  // false inside a group: no batch ends after it
    // When push() queued it (one clock read per call, shared by its
    // records): where its commit latency starts.
    std::chrono::steady_clock::time_point enqueued;
  };
  struct Built {
    std::vector<Record> records;
    Lease lease;  // the charges of `records`
    // Of the last record cut into it (its records may be settled early).
    std::optional<std::uint64_t> last_seq;
    Time time = 0;
    std::optional<Batch> batch;
    // The batch's first build: its outcome when it was built where it was
    // cut (kept plainly: a promise's set_value costs a futex wake even with
    // no one waiting), else its run on the batch builds pool.
    std::optional<Status> built_here;
    std::future<Status> upload;

    void wait_built() {
      if (!built_here && upload.valid()) upload.wait();
    }
    bool is_built() const {
      return built_here || upload.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    }
    // REQUIRES: the build was started; called once.
    Status take_built() { return built_here ? std::move(*built_here) : upload.get(); }
  };
  // A failed attempt, left for the next one to look at.
  struct Failed {
    Error error;
    std::string writer;  // the writer id that made the attempt
  };
  // A commit's progress across its attempts: what a retry must keep.
  struct Attempts {
    explicit Attempts(const RetryPolicy& retry) : failures_in_a_row(retry) {}
    // The idempotency token of every attempt: a retry after an
    // indeterminate one finds its batches committed, or commits them.
    std::string token = random_id();
    Backoff failures_in_a_row;
    bool waited_for_compaction = false;
    // After an indeterminate attempt the batches stay as they were.
    bool maybe_committed = false;
    // The writer that made the attempt that may have landed: only its
    // record of its last token can tell whether it did.
    std::string uncertain_writer;
    bool fresh_producers = false;
    int sequence_conflicts = 0;
    std::optional<Failed> failed;  // the last attempt's, not yet handled
  };
  // A commit a producer's thread started and the pool goes on with.
  struct Handoff {
    std::vector<Built> group;
    Attempts attempts;
  };
  struct Canary {
    std::uint64_t from = 0;      // failures of records in [from, boundary)
    std::uint64_t boundary = 0;  // resolves once every seq < boundary is done
    std::shared_ptr<CommitToken::State> token;
  };

  std::shared_ptr<Shard> shard;
  AppenderOptions options;
  std::shared_ptr<MemoryPool> pool;
  std::unique_ptr<WriteHandle> writer;

  mutable std::mutex mu;
  std::condition_variable done_cv;      // close() waits for the builder and committer to end
  std::condition_variable capacity_cv;  // records-mode senders wait for room
  std::deque<Record> queue;             // GUARDED_BY(mu)
  std::uint64_t queued_bytes = 0;       // GUARDED_BY(mu): keys and values in queue
  Lease queued_lease;                   // GUARDED_BY(mu): the charges of the records in queue
  // GUARDED_BY(mu): when the oldest record in queue arrived (or was left
  // behind by a full batch).
  std::chrono::steady_clock::time_point queue_since;
  // Batches in time order, each uploading (or uploaded) on its own thread.
  std::deque<std::shared_ptr<Built>> built;              // GUARDED_BY(mu)
  std::vector<Canary> canaries;                          // GUARDED_BY(mu)
  std::deque<std::pair<std::uint64_t, Error>> failures;  // GUARDED_BY(mu): (first seq, error)
  std::uint64_t next_seq = 0;                            // GUARDED_BY(mu)
  std::uint64_t done_seq = 0;              // GUARDED_BY(mu): every seq below is resolved
  std::uint64_t last_canary_boundary = 0;  // GUARDED_BY(mu)
  std::uint64_t in_flight = 0;             // GUARDED_BY(mu): records not yet resolved
  Time next_time = 0;                      // GUARDED_BY(mu): least time for the next batch
  Time last_commit_time = 0;               // GUARDED_BY(mu)
  bool closing = false;                    // GUARDED_BY(mu)
  bool builder_done = false;               // GUARDED_BY(mu)
  bool committer_done = false;             // GUARDED_BY(mu)
  bool linger_armed = false;               // GUARDED_BY(mu): a linger timer is pending
  std::optional<Timers::Id> linger_timer;  // GUARDED_BY(mu): the latest one
  bool committing = false;                 // GUARDED_BY(mu): the committer holds batches
  std::optional<Handoff> handoff;          // GUARDED_BY(mu): set while committing
  std::optional<Error> fatal;              // GUARDED_BY(mu)
  AppenderStats stats;                     // GUARDED_BY(mu)
  LatencyWindow commit_latency;            // GUARDED_BY(mu): enqueue to durable, per record
  LatencyWindow commit_call;               // GUARDED_BY(mu): compare_and_append, per commit
  // Run on WorkPool::appenders() when there is work: an appender waiting
  // for records holds no thread. Set once by open().
  std::unique_ptr<SerialTask> builder;
  std::unique_ptr<SerialTask> committer;

  Time now() const { return options.clock ? options.clock() : wall_clock_millis(); }

  // The queue (a std::deque) stores records in 512-byte blocks: three to a
  // block at this size, which kRecordOverheadBytes charges.
  static_assert(sizeof(Record) <= 512 / 3 && (512 + 16) / 3 <= kRecordOverheadBytes);
  static_assert(sizeof(AppendSender::ProducerTag) <= kRecordOverheadBytes);
  static_assert(sizeof(CommitToken::State) + 32 <= kTokenOverheadBytes);  // + the control block
  static_assert(2 * sizeof(LatencyWindow) <= 4096);  // the bound appender.h states
  static std::uint64_t charge(const AppendRecord& r, bool with_token = false) {
    return r.key.size() + r.value.size() + kRecordOverheadBytes +
           (with_token ? kTokenOverheadBytes : 0);
  }

  // Admission: checks that `count` records (the
  // largest `bytes`, `total` in all) may be queued, then charges `total`.
  // Check and charge happen under one lock, so concurrent senders cannot all
  // pass one check: the pool's overdraft is bounded by a single call. The
  // records count as in flight from here; push() takes them on.
  Result<Lease> admit(std::size_t count, std::uint64_t bytes, std::uint64_t total) {
    if (!options.queue_records && bytes > pool->capacity()) {
      return make_error(ErrorKind::kTooLarge,
                        "record of " + std::to_string(bytes) +
                            " bytes is larger than the appender's whole queue bound of " +
                            std::to_string(pool->capacity()) + " bytes");
    }
    std::lock_guard lock(mu);
    if (closing) return closed_error();
    if (options.queue_records) {
      if (in_flight >= *options.queue_records) {
        return make_error(ErrorKind::kFull, "the appender's queue holds " +
                                                std::to_string(in_flight) + " records (its bound)");
      }
    } else if (pool->available() == 0) {
      return make_error(ErrorKind::kFull, "the appender's memory pool has no bytes available");
    }
    in_flight += count;
    return pool->force_reserve(total);
  }

  std::unexpected<Error> closed_error() const {
    if (fatal) return make_error(ErrorKind::kClosed, "the appender stopped: " + fatal->to_string());
    return make_error(ErrorKind::kClosed, "the appender is closed");
  }

  // Queues records already charged to `lease`; fails if closed meanwhile.
  // A producer's records are numbered from `first_sequence`; a group's end
  // only after its last record.
  // With `commit_here`, records of at most kBuildHereMaxBytes queued on an
  // idle appender are built and committed by this thread before it returns
  // (one attempt; see AppendSender::set_commit_here).
  Status push(std::span<AppendRecord> records, Lease lease,
              std::shared_ptr<CommitToken::State> token,
              const std::shared_ptr<AppendSender::ProducerTag>& producer = nullptr,
              std::uint64_t first_sequence = 0, bool group = false, bool commit_here = false) {
    const auto now = std::chrono::steady_clock::now();
    std::uint64_t bytes = 0;
    bool wake = false, here = false;
    {
      // Built in place in the queue, under the lock (moving two strings
      // per record, as the builder's cut does): a staged copy would hold
      // every record of the call twice while it moved.
      std::lock_guard lock(mu);
      if (closing) {
        in_flight -= records.size();
        capacity_cv.notify_all();
        return closed_error();
      }
      const bool was_empty = queue.empty();
      if (was_empty) queue_since = now;
      std::uint64_t charged = 0;
      for (std::size_t i = 0; i < records.size(); ++i) {
        AppendRecord& r = records[i];
        const bool last = i + 1 == records.size();
        Record& record = queue.emplace_back();
        record.seq = next_seq++;
        record.charge = std::min(lease.size() - charged, charge(r, token && last));
        charged += record.charge;
        bytes += r.key.size() + r.value.size();
        record.key = std::move(r.key);
        record.value = std::move(r.value);
        record.diff = r.diff;
        record.producer = producer;
        record.sequence = first_sequence + i;
        record.group_end = !group || last;
        record.enqueued = now;
        if (last) record.token = std::move(token);
      }
      queued_bytes += bytes;
      queued_lease.merge(lease.split(charged));
      // The builder waits for the first record, or lingers until a batch
      // is full; other arrivals need not wake it.
      wake = was_empty || queue_full();
      here = commit_here && was_empty && idle() && bytes <= kBuildHereMaxBytes;
    }
    if (here) {
      // (As notify() when the builder is running elsewhere after all.)
      ScopedMark mark(&committing_here, this);
      builder->run_here();
    } else if (wake) {
      builder->notify();
    }
    return {};
  }

  // --- builder ---

  // REQUIRES: mu held.
  bool queue_full() const {
    return queue.size() >= options.batch_max_records || queued_bytes >= options.batch_max_bytes;
  }

  // Nothing built or committing: a batch cut now is committed at once.
  // REQUIRES: mu held.
  bool idle() const { return built.empty() && !committing; }

  enum class Cut : std::uint8_t { kNow, kWait, kLinger, kStop };

  // Whether a batch should be cut now: records are queued, fewer than
  // kMaxBuiltBatches are built, and either nothing is uploading or
  // committing (idle: cut at once), a whole batch is queued, the oldest
  // record has lingered batch_linger, or the appender is closing. kWait:
  // until a record arrives or the committer makes room (each notifies the
  // builder); kLinger: until the oldest record's linger ends; kStop: the
  // builder is done.
  // REQUIRES: mu held.
  Cut next_cut() const {
    if (fatal) return Cut::kStop;
    if (queue.empty()) return closing ? Cut::kStop : Cut::kWait;
    if (built.size() >= kMaxBuiltBatches) return Cut::kWait;
    if (idle() || closing || queue_full()) return Cut::kNow;
    if (std::chrono::steady_clock::now() >= queue_since + options.batch_linger) return Cut::kNow;
    return Cut::kLinger;
  }

  // Notifies the builder when the oldest record's linger ends (one timer
  // pending at a time; close() cancels it). False when no timer can be had
  // (no timer thread): the caller cuts at once instead.
  // REQUIRES: mu held.
  bool arm_linger_locked() {
    if (linger_armed) return true;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        queue_since + options.batch_linger - std::chrono::steady_clock::now());
    auto timer = Timers::shared().schedule(std::max(left, std::chrono::milliseconds(0)),
                                           [this]() -> std::optional<std::chrono::milliseconds> {
                                             {
                                               std::lock_guard lock(mu);
                                               linger_armed = false;
                                             }
                                             builder->notify();
                                             return std::nullopt;
                                           });
    if (!timer) return false;
    linger_armed = true;
    linger_timer = *timer;
    return true;
  }

  // The builder, run when notified: cuts every batch that should be cut
  // now and starts its upload, then returns.
  // On a producer's thread (committing_here) it cuts one batch, then leaves
  // the rest to the pool.
  void run_builder() {
    const bool here = committing_here == this;
    for (bool cut_one = false;; cut_one = true) {
      std::vector<Record> records;
      Lease lease;              // their charges
      std::uint64_t bytes = 0;  // of the records' keys and values
      bool alone = false;       // the batch took every queued record, none was built before
      {
        std::unique_lock lock(mu);
        if (builder_done) return;
        if (here && cut_one) {
          // Records queued meanwhile notified the builder: it runs again on
          // the pool.
          return;
        }
        const Cut cut = next_cut();
        if (cut == Cut::kStop) {
          builder_done = true;
          lock.unlock();
          committer->notify();
          return;
        }
        if (cut == Cut::kWait) return;
        if (cut == Cut::kLinger && arm_linger_locked()) return;
        bytes = 0;
        // A batch never ends inside a group (a group is queued whole).
        // Counted first, so the vector is allocated once at its exact size:
        // grown by doubling, it held up to twice the records' charged
        // overhead (and three times while it moved), outside the pool.
        std::size_t take = 0;
        std::uint64_t charges = 0;
        while (take < queue.size() &&
               ((take < options.batch_max_records && bytes < options.batch_max_bytes) ||
                (take > 0 && !queue[take - 1].group_end))) {
          bytes += queue[take].key.size() + queue[take].value.size();
          charges += queue[take].charge;
          ++take;
        }
        lease = queued_lease.split(charges);
        records.reserve(take);
        for (std::size_t i = 0; i < take; ++i) {
          records.push_back(std::move(queue.front()));
          queue.pop_front();
        }
        queued_bytes -= bytes;
        if (!queue.empty()) queue_since = std::chrono::steady_clock::now();
        alone = queue.empty() && built.empty();
      }
      auto batch = std::make_shared<Built>();
      batch->last_seq = records.back().seq;
      batch->records = std::move(records);
      batch->lease = std::move(lease);
      batch->time = take_time(0);
      Built* raw = batch.get();
      const bool built_here = start_build(*raw, bytes);
      {
        std::lock_guard lock(mu);
        built.push_back(std::move(batch));
      }
      if (built_here && alone) {
        // Nothing else to cut or commit: committing here delays no other
        // batch (with more queued, the builder goes on cutting while the
        // committer's thread commits).
        ScopedMark mark(&committer_in_builder, this);
        committer->run_here();
      } else {
        committer->notify();
      }
    }
  }

  // Starts `batch`'s build (batch.built_here or batch.upload): here when
  // it needs no I/O, or is small (kBuildHereMaxBytes, kEncodeHereMaxBytes);
  // otherwise on the batch builds pool: a build waits for its parts'
  // uploads (blob_io()), which an appenders-pool thread must not. Returns
  // whether it was built here: then it is committed here too if it is
  // alone and the committer idle (a request on an idle appender wakes one
  // thread, not three).
  bool start_build(Built& batch, std::uint64_t bytes) {
    auto done_here = [&](Status status) {
      batch.built_here = std::move(status);
      return true;
    };
    if (bytes <= kBuildHereMaxBytes) return done_here(build(batch));
    Built* raw = &batch;
    if (bytes <= kEncodeHereMaxBytes) {
      BatchBuilder builder = writer->builder(Frontier::at(batch.time));
      Status added;
      for (const Record& r : batch.records) {
        added = builder.add(r.key, r.value, batch.time, r.diff);
        if (!added) break;
      }
      auto finished = added ? builder.finish_inline(Frontier::at(batch.time + 1))
                            : Result<std::optional<Batch>>(std::unexpected(added.error()));
      if (finished && *finished) {
        batch.batch = std::move(**finished);
        return done_here({});
      }
      if (!finished && !is_retryable(finished.error())) {
        return done_here(std::unexpected(finished.error()));
      }
      if (finished) {
        // Its part must be written to the blob store: the pool does that.
        batch.upload = submit_or_inline(WorkPool::batch_builds(),
                                        [this, raw, builder = std::move(builder)]() mutable {
                                          auto stored = builder.finish(Frontier::at(raw->time + 1));
                                          if (stored) {
                                            raw->batch = std::move(*stored);
                                            return Status{};
                                          }
                                          if (!is_retryable(stored.error()))
                                            return Status(std::unexpected(stored.error()));
                                          return build(*raw);  // again from its records, retried
                                        });
        return false;
      }
    }
    batch.upload = submit_or_inline(WorkPool::batch_builds(), [this, raw] { return build(*raw); });
    return false;
  }

  // The next batch time: monotonic, at least `at_least` and the clock.
  Time take_time(Time at_least) {
    std::lock_guard lock(mu);
    Time t = std::max({now(), next_time, at_least});
    next_time = t + 1;
    return t;
  }

  // Uploads `batch` at batch.time, retrying infrastructure failures.
  Status build(Built& batch) {
    return with_retries(options.retry, [&] { return build_once(batch); });
  }

  Status build_once(Built& batch) {
    BatchBuilder builder = writer->builder(Frontier::at(batch.time));
    for (const Record& r : batch.records) {
      TM_TRY(builder.add(r.key, r.value, batch.time, r.diff));
    }
    TM_ASSIGN(Batch built_batch, builder.finish(Frontier::at(batch.time + 1)));
    batch.batch = std::move(built_batch);
    return {};
  }

  // --- committer ---

  // The committer, run when notified: commits every built batch, then
  // returns. Once the builder is done (or the appender failed) it fails
  // what is left and is done too. On a producer's thread (committing_here)
  // it makes one attempt at one commit and leaves the rest to the pool.
  void run_committer() {
    const bool here = committing_here == this;
    // Inside the builder's run on this thread: the builder looks again
    // when this returns, so it needs no notice.
    const bool in_builder = committer_in_builder == this;
    for (bool committed_one = false;; committed_one = true) {
      std::vector<Built> group;
      std::optional<Attempts> attempts;
      {
        std::unique_lock lock(mu);
        if (committer_done) return;
        if (handoff) {
          group = std::move(handoff->group);
          attempts.emplace(std::move(handoff->attempts));
          handoff.reset();
        } else if (here && committed_one) {
          // Anything built meanwhile notified the committer: it runs again
          // on the pool.
          return;
        }
      }
      if (!attempts) {
        if (!take_group(&group, in_builder)) return;
        attempts.emplace(options.retry);
      }
      if (!group.empty() && !commit(group, *attempts, here)) {
        // One attempt was all this thread makes: the pool goes on with the
        // commit (committing stays set).
        {
          std::lock_guard lock(mu);
          handoff.emplace(Handoff{std::move(group), std::move(*attempts)});
        }
        committer->notify();
        return;
      }
      {
        std::lock_guard lock(mu);
        committing = false;
      }
      if (!in_builder) builder->notify();  // an idle appender cuts its next batch at once
    }
  }

  // Takes the batches of the next commit into `group` (empty when each
  // failed alone), or returns false when there is nothing to commit (after
  // failing what is built, once the builder is done or the appender failed).
  bool take_group(std::vector<Built>* group, bool in_builder) {
    for (;;) {
      std::vector<std::shared_ptr<Built>> taken;
      {
        std::unique_lock lock(mu);
        if (fatal || (built.empty() && builder_done)) {
          lock.unlock();
          fail_built();
          return false;
        }
        if (built.empty()) return false;  // the builder notifies when it pushes one
        taken.push_back(std::move(built.front()));
        built.pop_front();
        committing = true;
      }
      // Wait for the oldest batch's upload; with batch_appends, take every
      // later one that has finished uploading too, while their parts stay
      // within kMaxLooseParts: the shard registers one commit's batches as
      // one batch, whose parts are loose (each a merge input of every read)
      // unless it is a single ordered batch, which commits alone.
      taken.front()->wait_built();
      if (options.batch_appends) {
        std::lock_guard lock(mu);
        std::size_t parts = loose_parts(*taken.front());
        while (!built.empty() && built.front()->is_built()) {
          parts += loose_parts(*built.front());
          if (parts > BatchBuilder::kMaxLooseParts) break;
          taken.push_back(std::move(built.front()));
          built.pop_front();
        }
      }
      if (!in_builder) builder->notify();  // room for the builder
      std::optional<Error> fatal_error;
      for (auto& batch : taken) {
        Status uploaded = batch->take_built();
        if (!uploaded && uploaded.error().is(ErrorKind::kInvalidUsage)) {
          // A bad record (e.g. diffs that overflow together) fails its batch only.
          finish(*batch, std::unexpected(uploaded.error()));
        } else if (!uploaded) {
          fatal_error = uploaded.error();
          group->push_back(std::move(*batch));
        } else {
          group->push_back(std::move(*batch));
        }
      }
      if (!fatal_error) return true;
      set_fatal(*fatal_error, nullptr, group);
      group->clear();
      std::lock_guard lock(mu);
      committing = false;
      // On to fail what is left.
    }
  }

  // Fails the built batches (the appender is closing or failed); done
  // once the builder is (a batch it cuts meanwhile notifies again).
  void fail_built() {
    // Uploads still running hold pointers into batches: wait for them.
    std::deque<std::shared_ptr<Built>> rest;
    {
      std::lock_guard lock(mu);
      rest.swap(built);
    }
    for (auto& batch : rest) {
      batch->wait_built();
      finish(*batch, std::unexpected(closed_error().error()));
    }
    {
      std::lock_guard lock(mu);
      if (!builder_done || !built.empty()) return;
      committer_done = true;
    }
    done_cv.notify_all();
  }

  // What `batch` adds to a commit's loose parts; an ordered batch counts
  // as more than kMaxLooseParts, so it commits alone.
  // REQUIRES: its upload has finished.
  static std::size_t loose_parts(const Built& batch) {
    if (!batch.batch) return 0;
    if (batch.batch->ordered()) return BatchBuilder::kMaxLooseParts + 1;
    return batch.batch->parts().size();
  }

  // Commits `group` with `a`'s token, retrying as options.retry allows;
  // every record ends settled. With `one_attempt` (a producer's thread) it
  // makes at most one attempt and does not wait: it returns false, `group`
  // and `a` ready for the next attempt, when the commit must go on
  // elsewhere (compaction is behind, or the attempt failed).
  bool commit(std::vector<Built>& group, Attempts& a, bool one_attempt) {
    if (!a.waited_for_compaction) {
      if (one_attempt && writer->compaction_behind()) return false;
      const auto stalled = writer->wait_for_compaction([this] {
        std::lock_guard lock(mu);
        return closing;
      });
      a.waited_for_compaction = true;
      a.failures_in_a_row = Backoff(options.retry);  // its clock starts with the first attempt
      if (stalled.count() > 0) {
        std::lock_guard lock(mu);
        stats.stall_ms += static_cast<std::uint64_t>(stalled.count());
      }
    }
    // The records are answered before the merge this commit makes due wakes
    // a compaction pass.
    DeferCompactionRequests answer_first;
    for (;;) {
      if (a.failed) {
        Failed failed = std::move(*a.failed);
        a.failed.reset();
        if (!retry_after(failed, group, a)) return true;
      }
      if (group.empty()) return true;  // every record was settled
      if (!a.maybe_committed) {
        auto filtered = filter_producers(group, a.fresh_producers);
        if (!filtered) {
          set_fatal(filtered.error(), nullptr, &group);
          return true;
        }
        if (group.empty()) return true;  // every record was settled
      }
      // Every batch must lie at or above the upper, in increasing time.
      Frontier upper = writer->upper();
      if (upper.is_closed()) {
        set_fatal(Error{ErrorKind::kInvalidUsage, "the shard is closed to appends", std::nullopt,
                        std::nullopt},
                  nullptr, &group);
        return true;
      }
      Time required = upper.time();
      for (Built& batch : group) {
        if (batch.time < required) {
          auto retimed = retime(batch, required);
          if (!retimed) {
            set_fatal(retimed.error(), nullptr, &group);
            return true;
          }
        }
        required = batch.time + 1;
      }
      const std::vector<ProducerRange> ranges = producer_ranges(group);
      std::vector<Batch> batches;
      for (Built& batch : group) batches.push_back(std::move(*batch.batch));
      const std::string attempt_writer = writer->writer_id();
      const auto call_start = std::chrono::steady_clock::now();
      auto result =
          writer->compare_and_append(batches, upper, Frontier::at(required), a.token, ranges);
      for (std::size_t i = 0; i < group.size(); ++i) group[i].batch = std::move(batches[i]);
      if (result) {
        const auto durable = std::chrono::steady_clock::now();
        LatencyHistogram call;
        call.add(std::chrono::duration_cast<std::chrono::microseconds>(durable - call_start));
        {
          // Counted before any token resolves, so a flushed caller sees it.
          std::lock_guard lock(mu);
          ++stats.commits;
          commit_call.add(call, durable);
        }
        for (Built& batch : group) finish(batch, batch.time, durable);
        return true;
      }
      a.failed = Failed{result.error(), attempt_writer};
      if (one_attempt) return false;
    }
  }

  // After a failed attempt: makes `group` ready for the next one (waiting
  // out the backoff), or settles every record in it and returns false.
  bool retry_after(const Failed& failed, std::vector<Built>& group, Attempts& a) {
    const Error& error = failed.error;
    // Once an attempt may have landed, it stays "maybe" through any
    // failure that does not settle it (a determinate error of a later
    // attempt says nothing of the earlier one): only its writer's record
    // of its last token settles it, so a writer that lost its lease, or
    // was replaced by a new id meanwhile, cannot.
    if (a.maybe_committed &&
        (error.is(ErrorKind::kLeaseExpired) || writer->writer_id() != a.uncertain_writer)) {
      a.maybe_committed = false;
      // A producer's records can still be told (the shard records them);
      // the others cannot.
      fail_unproduced(group, Error{ErrorKind::kIndeterminate,
                                   "this append may have been committed before its writer "
                                   "lost its lease (" +
                                       error.message + ")",
                                   std::nullopt, std::nullopt});
      a.fresh_producers = true;
      if (!a.failures_in_a_row.next()) {
        set_fatal(error, nullptr, &group);
        return false;
      }
      return true;
    }
    if (error.is(ErrorKind::kIndeterminate) && !a.maybe_committed) {
      a.maybe_committed = true;
      a.uncertain_writer = failed.writer;
    }
    if (error.is(ErrorKind::kLeaseExpired)) {
      // The writer lost its lease (this process was paused, or cut off
      // from consensus, past it): nothing was appended, and the handle
      // registered a writer of a new id. Build every batch again under it.
      for (Built& batch : group) {
        batch.batch.reset();
        if (auto rebuilt = build(batch); !rebuilt) {
          set_fatal(rebuilt.error(), nullptr, &group);
          return false;
        }
      }
      if (!a.failures_in_a_row.next()) {
        set_fatal(error, nullptr, &group);
        return false;
      }
      return true;
    }
    if (error.is(ErrorKind::kSequenceMismatch)) {
      // Another process committed some of these producers' records: look
      // again (the state as it is now) and drop them. (Checked after the
      // writer's last token: an earlier attempt did not land.)
      a.maybe_committed = false;
      a.fresh_producers = true;
      if (++a.sequence_conflicts > kMaxSequenceConflicts) {
        set_fatal(error, nullptr, &group);
        return false;
      }
      return true;
    }
    if (error.is(ErrorKind::kUpperMismatch)) {
      // Checked after the same writer's last token: an earlier attempt
      // did not land.
      a.maybe_committed = false;
      {
        std::lock_guard lock(mu);
        ++stats.mismatches;
        if (error.current_upper) next_time = std::max(next_time, *error.current_upper);
      }
      if (options.on_mismatch == MismatchPolicy::kBail) {
        Error bail{ErrorKind::kUpperMismatch,
                   "another writer moved the shard's upper (" + error.message +
                       "); these records were not appended (bail policy)",
                   error.expected_upper, error.current_upper};
        for (Built& batch : group) finish(batch, std::unexpected(bail));
        return false;
      }
      a.failures_in_a_row = Backoff(options.retry);
      return true;  // re-timed before the next attempt
    }
    if (!is_retryable(error) || !a.failures_in_a_row.next()) {
      set_fatal(error, nullptr, &group);
      return false;
    }
    return true;
  }

  // Settles every record without a producer in `group` with `error`, and
  // rebuilds (or retires) the batches that held them.
  void fail_unproduced(std::vector<Built>& group, const Error& error) {
    for (auto batch = group.begin(); batch != group.end();) {
      std::size_t kept = 0;  // kept in place: no second vector of the batch
      for (Record& r : batch->records) {
        if (r.producer) {
          if (&batch->records[kept] != &r) batch->records[kept] = std::move(r);
          ++kept;
        } else {
          settle(*batch, r, std::unexpected(error));
        }
      }
      batch->records.erase(batch->records.begin() + static_cast<std::ptrdiff_t>(kept),
                           batch->records.end());
      batch->batch.reset();
      if (batch->records.empty()) {
        retire_empty(*batch);
        batch = group.erase(batch);
        continue;
      }
      if (auto rebuilt = build(*batch); !rebuilt) {
        settle_all(*batch, rebuilt.error());
        retire_empty(*batch);
        batch = group.erase(batch);
        continue;
      }
      ++batch;
    }
  }

  void settle_all(Built& batch, const Error& error) {
    for (Record& r : batch.records) settle(batch, r, std::unexpected(error));
    std::vector<Record>().swap(batch.records);
  }

  // The producers' records in `group`, as the ranges the commit records:
  // each a run of consecutive numbers of one producer, in commit order.
  static std::vector<ProducerRange> producer_ranges(const std::vector<Built>& group) {
    std::vector<ProducerRange> ranges;
    for (const Built& batch : group) {
      for (const Record& r : batch.records) {
        if (!r.producer) continue;
        if (!ranges.empty() && ranges.back().producer == r.producer->id &&
            ranges.back().last + 1 == r.sequence) {
          ranges.back().last = r.sequence;
          ranges.back().time = batch.time;
        } else {
          ranges.push_back(ProducerRange{r.producer->id, r.sequence, r.sequence, batch.time});
        }
      }
    }
    return ranges;
  }

  // Checks the producers' records in `group` against the shard (its last
  // known state, or a fresh one): settles those it has committed already
  // (duplicates), makes a second copy of a record in the group follow the
  // first (below), and fails those that do not follow their producer's
  // sequence or would make one producer too many; rebuilds the batches
  // that lost records and drops the ones left empty. An error is fatal.
  //
  // A copy: a client that retried a request on this server while its first
  // try still waited here (the server paused, or its commits stalled)
  // enqueued the same records twice. The second copy is not committed, and
  // it is not settled now either: the first copy is not committed yet, and
  // may never be. Its token resolves with the first copy's.
  Status filter_producers(std::vector<Built>& group, bool fresh) {
    struct Expected {
      std::uint64_t committed = 0;  // the sequence number the shard expects
      std::uint64_t next = 0;       // ... once the records kept so far commit
      Time time = 0;                // when its last committed record was
      bool known = false;           // the shard keeps this producer already
      bool counted = false;         // counted as new against max_producers
      // Where record committed + i was kept: (batch, record) in `group`.
      std::vector<std::pair<std::size_t, std::size_t>> kept_at;
    };
    std::map<std::string, Expected, std::less<>> expected;
    for (const Built& batch : group) {
      for (const Record& r : batch.records) {
        if (r.producer) expected.try_emplace(r.producer->id);
      }
    }
    if (expected.empty()) return {};
    std::size_t producers = 0, max_producers = 0;
    for (auto& [id, e] : expected) {
      TM_ASSIGN(ProducerLookup lookup,
                with_retries(options.retry, [&] { return shard->lookup_producer(id, fresh); }));
      producers = lookup.producers;
      max_producers = lookup.max_producers;
      if (lookup.producer) {
        e.committed = e.next = lookup.producer->sequence + 1;
        e.time = lookup.producer->time;
        e.known = true;
      }
    }
    std::size_t new_producers = 0;
    for (auto batch = group.begin(); batch != group.end();) {
      const auto here = static_cast<std::size_t>(batch - group.begin());
      // Records kept move down in place, to records[kept]: a second vector
      // would hold the batch twice.
      std::vector<Record>& records = batch->records;
      std::size_t kept = 0;
      auto keep = [&](Record& r) {
        if (&records[kept] != &r) records[kept] = std::move(r);
        ++kept;
      };
      bool changed = false;
      for (Record& r : records) {
        if (!r.producer) {
          keep(r);
          continue;
        }
        Expected& e = expected.find(r.producer->id)->second;
        if (r.sequence < e.committed) {
          ++r.producer->duplicates;
          settle(*batch, r, e.time, /*duplicate=*/true);
          changed = true;
          continue;
        }
        if (r.sequence < e.next) {
          const auto [in_batch, at] = e.kept_at[r.sequence - e.committed];
          Record& original = in_batch == here ? records[at] : group[in_batch].records[at];
          if (!original.token) original.token = std::make_shared<CommitToken::State>();
          follow(*batch, r, original.token);
          changed = true;
          continue;
        }
        if (r.sequence > e.next) {
          settle(
              *batch, r,
              make_error(ErrorKind::kSequenceMismatch,
                         "producer " + r.producer->id + ": record " + std::to_string(r.sequence) +
                             " does not follow what shard " + shard->name() +
                             " has committed (it expects " + std::to_string(e.next) + ")"));
          changed = true;
          continue;
        }
        if (!e.known && !e.counted) {
          if (max_producers > 0 && producers + new_producers >= max_producers) {
            settle(*batch, r,
                   make_error(ErrorKind::kFull,
                              "shard " + shard->name() + " keeps " + std::to_string(max_producers) +
                                  " producers already (its most): producer " + r.producer->id +
                                  " cannot start until one expires"));
            changed = true;
            continue;
          }
          e.counted = true;
          ++new_producers;
        }
        ++e.next;
        e.kept_at.emplace_back(here, kept);
        keep(r);
      }
      records.erase(records.begin() + static_cast<std::ptrdiff_t>(kept), records.end());
      if (!changed) {
        ++batch;
        continue;
      }
      if (batch->records.empty()) {
        retire_empty(*batch);
        batch = group.erase(batch);
        continue;
      }
      batch->batch.reset();
      TM_TRY(build(*batch));
      ++batch;
    }
    return {};
  }
  // Rebuilds `batch` at a time >= at_least (after a definite mismatch: its
  // old parts were never committed and are deleted when replaced).
  Status retime(Built& batch, Time at_least) {
    batch.time = take_time(at_least);
    batch.batch.reset();
    {
      std::lock_guard lock(mu);
      ++stats.retimed_batches;
    }
    return build(batch);
  }

  // Resolves one record ahead of its batch (a producer's duplicate, or a
  // record refused): its lease, then its token. The batch still counts it
  // for canaries when it finishes.
  void settle(Built& batch, Record& r, Result<Time> outcome, bool duplicate = false) {
    batch.lease.shrink(r.charge);
    r.charge = 0;
    {
      std::lock_guard lock(mu);
      --in_flight;
      if (duplicate) ++stats.duplicates;
      if (!outcome) {
        failures.emplace_back(r.seq, outcome.error());
        if (failures.size() > kMaxRememberedFailures) failures.pop_front();
      }
    }
    capacity_cv.notify_all();
    if (r.token) r.token->resolve(outcome);
  }

  // Takes `copy`, a second copy of a producer's record, out of its batch:
  // it resolves as `original` (the token of the copy kept) does, counted as
  // a duplicate, with a failure remembered for canaries if it fails.
  void follow(Built& batch, Record& copy, const std::shared_ptr<CommitToken::State>& original) {
    batch.lease.shrink(copy.charge);
    copy.charge = 0;
    {
      std::lock_guard lock(mu);
      --in_flight;
      ++stats.duplicates;
    }
    ++copy.producer->duplicates;
    capacity_cv.notify_all();
    CommitToken(original).on_complete(
        [this, token = std::move(copy.token), seq = copy.seq](const Result<Time>& outcome) {
          if (!outcome) {
            std::lock_guard lock(mu);
            failures.emplace_back(seq, outcome.error());
            if (failures.size() > kMaxRememberedFailures) failures.pop_front();
          }
          if (token) token->resolve(outcome);
        });
  }

  // A batch whose every record was settled early: only canaries are left.
  void retire_empty(Built& batch) {
    batch.batch.reset();
    std::vector<Canary> ready;
    {
      std::lock_guard lock(mu);
      if (batch.last_seq) done_seq = std::max(done_seq, *batch.last_seq + 1);
      collect_ready_canaries(&ready);
    }
    resolve_canaries(ready);
  }

  // Resolves a batch's records: leases first, then tokens and canaries.
  // A batch committed gives `durable`, when its commit was, for the
  // records' commit latency.
  void finish(Built& batch, Result<Time> outcome,
              std::optional<std::chrono::steady_clock::time_point> durable = std::nullopt) {
    std::optional<std::uint64_t> last_seq = batch.last_seq;
    if (!batch.records.empty()) {
      last_seq = std::max(last_seq.value_or(0), batch.records.back().seq);
    }
    std::vector<std::shared_ptr<CommitToken::State>> tokens;
    // Gathered here, outside the lock, and added to the window at once.
    LatencyHistogram latencies;
    for (Record& r : batch.records) {
      if (r.token) tokens.push_back(std::move(r.token));
      if (durable) {
        latencies.add(std::chrono::duration_cast<std::chrono::microseconds>(*durable - r.enqueued));
      }
    }
    std::size_t count = batch.records.size();
    std::uint64_t first_seq = batch.records.empty() ? 0 : batch.records.front().seq;
    // The records' memory is freed before their charge returns to the pool
    // (one release for the whole batch: each wakes the pool's waiters), so
    // the pool never counts as free what is still held.
    std::vector<Record>().swap(batch.records);
    batch.batch.reset();
    batch.lease.release();
    // Figures first, so whoever a token wakes sees them; then the tokens;
    // only then do these records count as done for canaries, so a canary
    // never resolves before the tokens of the records ahead of it.
    {
      std::lock_guard lock(mu);
      in_flight -= count;
      if (outcome) {
        last_commit_time = std::max(last_commit_time, *outcome);
        stats.records_committed += count;
        ++stats.batches_committed;
        if (durable) commit_latency.add(latencies, *durable);
      } else if (count > 0) {
        failures.emplace_back(first_seq, outcome.error());
        if (failures.size() > kMaxRememberedFailures) failures.pop_front();
      }
    }
    capacity_cv.notify_all();
    for (auto& token : tokens) token->resolve(outcome);
    std::vector<Canary> ready;
    {
      std::lock_guard lock(mu);
      if (last_seq) done_seq = std::max(done_seq, *last_seq + 1);
      collect_ready_canaries(&ready);
    }
    resolve_canaries(ready);
  }

  // REQUIRES: mu held.
  void collect_ready_canaries(std::vector<Canary>* ready) {
    auto done = [&](const Canary& c) { return c.boundary <= done_seq || fatal; };
    for (Canary& c : canaries) {
      if (done(c)) ready->push_back(c);
    }
    std::erase_if(canaries, done);
  }

  void resolve_canaries(std::vector<Canary>& ready) {
    for (Canary& c : ready) {
      std::optional<Error> failure;
      Time time;
      {
        std::lock_guard lock(mu);
        if (fatal) failure = *fatal;
        for (const auto& [seq, error] : failures) {
          if (!failure && seq >= c.from && seq < c.boundary) failure = error;
        }
        time = last_commit_time;
      }
      if (failure) {
        c.token->resolve(std::unexpected(*failure));
      } else {
        c.token->resolve(time);
      }
    }
  }

  // Fails everything pending and closes. `current` and `group` are batches
  // held by the calling thread outside the queues.
  void set_fatal(const Error& error, Built* current, std::vector<Built>* group = nullptr) {
    std::deque<Record> queued;
    Built rest;
    {
      std::lock_guard lock(mu);
      if (!fatal) fatal = error;
      closing = true;
      queued.swap(queue);
      queued_bytes = 0;
      rest.lease = std::move(queued_lease);
      // Built batches stay: the committer fails them once their uploads end.
    }
    builder->notify();
    committer->notify();
    capacity_cv.notify_all();
    Error failed{ErrorKind::kClosed, "the appender stopped: " + error.to_string(), std::nullopt,
                 std::nullopt};
    if (current) finish(*current, std::unexpected(failed));
    if (group) {
      for (Built& batch : *group) finish(batch, std::unexpected(failed));
    }
    if (!queued.empty()) {
      rest.records.assign(std::make_move_iterator(queued.begin()),
                          std::make_move_iterator(queued.end()));
      finish(rest, std::unexpected(failed));
    }
    std::vector<Canary> ready;
    {
      std::lock_guard lock(mu);
      collect_ready_canaries(&ready);
    }
    resolve_canaries(ready);
  }
};

// --- Appender ---------------------------------------------------------------

Result<std::shared_ptr<Appender>> Appender::open(std::shared_ptr<Shard> shard,
                                                 AppenderOptions options) {
  if (!shard) return invalid_usage("an appender needs a shard");
  if (options.batch_max_records == 0 || options.batch_max_bytes == 0) {
    return invalid_usage("batch_max_records and batch_max_bytes must be positive");
  }
  if (options.queue_records && *options.queue_records == 0) {
    return invalid_usage("queue_records must be positive");
  }
  auto impl = std::make_unique<Impl>();
  impl->shard = shard;
  impl->options = options;
  // Records mode is bounded by count alone; its pool only measures.
  std::uint64_t capacity = options.queue_records ? MemoryPool::kUnlimited : options.queue_bytes;
  impl->pool =
      options.parent_pool
          ? options.parent_pool->child("appender " + shard->name(), capacity)
          : (options.queue_records ? MemoryPool::unlimited("appender " + shard->name())
                                   : MemoryPool::create("appender " + shard->name(), capacity));
  TM_ASSIGN(impl->writer, shard->open_writer());
  impl->next_time = impl->writer->upper().is_closed() ? 0 : impl->writer->upper().time();
  // The constructor is private; a local subclass lets make_shared reach it.
  struct Constructible : Appender {};
  std::shared_ptr<Appender> appender = std::make_shared<Constructible>();
  appender->impl_ = std::move(impl);
  Impl* raw = appender->impl_.get();
  raw->builder =
      std::make_unique<SerialTask>(&WorkPool::appenders(), [raw] { raw->run_builder(); });
  raw->committer =
      std::make_unique<SerialTask>(&WorkPool::appenders(), [raw] { raw->run_committer(); });
  return appender;
}

Appender::~Appender() {
  close();
}

void Appender::close() {
  Impl& impl = *impl_;
  {
    std::lock_guard lock(impl.mu);
    impl.closing = true;
  }
  // The builder cuts what is queued and is done; the committer commits it
  // and is done.
  impl.builder->notify();
  impl.committer->notify();
  impl.capacity_cv.notify_all();
  std::optional<Timers::Id> linger;
  {
    std::unique_lock lock(impl.mu);
    impl.done_cv.wait(lock, [&] { return impl.builder_done && impl.committer_done; });
    linger = impl.linger_timer;
  }
  if (linger) Timers::shared().cancel(*linger);
  impl.builder->stop();
  impl.committer->stop();
}

AppendSender Appender::sender() {
  return AppendSender(shared_from_this(), nullptr, 0);
}

Result<AppendSender> Appender::sender(std::string producer, std::uint64_t first_sequence) {
  TM_TRY(validate_producer_id(producer));
  auto tag = std::make_shared<AppendSender::ProducerTag>();
  tag->id = std::move(producer);
  return AppendSender(shared_from_this(), std::move(tag), first_sequence);
}

Status Appender::flush() {
  AppendSender s = sender();
  auto canary = s.canary();
  if (!canary) return std::unexpected(canary.error());
  auto result = canary->wait();
  if (!result) return std::unexpected(result.error());
  return {};
}

namespace {

AppenderLatency summarize(const LatencyWindow& window, LatencyWindow::Clock::time_point now) {
  const LatencyHistogram recent = window.recent(now);
  return AppenderLatency{window.count(), window.sum_micros(), recent.count(),
                         recent.quantile_micros(0.5), recent.quantile_micros(0.99)};
}

}  // namespace

AppenderStats Appender::stats() const {
  const auto now = LatencyWindow::Clock::now();
  AppenderStats out;
  LatencyWindow latency, call;
  {
    // Copied under the lock, read outside it.
    std::lock_guard lock(impl_->mu);
    out = impl_->stats;
    out.queued_records = impl_->in_flight;
    out.pool = impl_->pool->stats();
    latency = impl_->commit_latency;
    call = impl_->commit_call;
  }
  out.commit_latency = summarize(latency, now);
  out.commit_call = summarize(call, now);
  return out;
}

std::optional<Error> Appender::failure() const {
  std::lock_guard lock(impl_->mu);
  return impl_->fatal;
}

const std::shared_ptr<MemoryPool>& Appender::pool() const {
  return impl_->pool;
}

// --- AppendSender -----------------------------------------------------------

AppendSender::AppendSender(std::shared_ptr<Appender> appender,
                           std::shared_ptr<ProducerTag> producer, std::uint64_t first_sequence)
    : appender_(std::move(appender)),
      producer_(std::move(producer)),
      next_sequence_(first_sequence) {}
AppendSender::AppendSender(AppendSender&&) noexcept = default;
AppendSender& AppendSender::operator=(AppendSender&&) noexcept = default;
AppendSender::~AppendSender() = default;

Status AppendSender::enqueue(AppendRecord record) {
  return enqueue_many(std::span<AppendRecord>(&record, 1));
}

Status AppendSender::enqueue_many(std::span<AppendRecord> records) {
  if (records.empty()) return {};
  Appender::Impl& impl = *appender_->impl_;
  std::uint64_t total = 0, largest = 0;
  for (const AppendRecord& r : records) {
    total += Appender::Impl::charge(r);
    largest = std::max(largest, Appender::Impl::charge(r));
  }
  TM_ASSIGN(Lease lease, impl.admit(records.size(), largest, total));
  TM_TRY(impl.push(records, std::move(lease), nullptr, producer_, next_sequence_,
                   /*group=*/false, commit_here_));
  if (producer_) next_sequence_ += records.size();
  return {};
}

Result<CommitToken> AppendSender::enqueue_group(std::span<AppendRecord> records) {
  if (producer_) return invalid_usage("a producer's records are not queued as a group");
  if (records.empty()) return invalid_usage("a group needs records");
  Appender::Impl& impl = *appender_->impl_;
  std::uint64_t total = Appender::Impl::charge(records.back(), /*with_token=*/true);
  for (std::size_t i = 0; i + 1 < records.size(); ++i) total += Appender::Impl::charge(records[i]);
  // The whole group is one unit for the queue bound: it is committed at
  // once, so all of it waits in the queue together.
  TM_ASSIGN(Lease lease, impl.admit(records.size(), total, total));
  auto state = std::make_shared<CommitToken::State>();
  TM_TRY(impl.push(records, std::move(lease), state, nullptr, 0, /*group=*/true, commit_here_));
  return CommitToken(state);
}

std::uint64_t AppendSender::duplicates() const {
  return producer_ ? producer_->duplicates.load() : 0;
}

Result<CommitToken> AppendSender::enqueue_with_token(AppendRecord record) {
  return enqueue_with_token(&record);
}

Result<CommitToken> AppendSender::enqueue_with_token(AppendRecord* record) {
  Appender::Impl& impl = *appender_->impl_;
  std::uint64_t size = Appender::Impl::charge(*record, /*with_token=*/true);
  TM_ASSIGN(Lease lease, impl.admit(1, size, size));
  auto state = std::make_shared<CommitToken::State>();
  TM_TRY(impl.push(std::span<AppendRecord>(record, 1), std::move(lease), state, producer_,
                   next_sequence_, /*group=*/false, commit_here_));
  if (producer_) ++next_sequence_;
  return CommitToken(state);
}

Result<CommitToken> AppendSender::canary() {
  Appender::Impl& impl = *appender_->impl_;
  auto state = std::make_shared<CommitToken::State>();
  std::vector<Appender::Impl::Canary> ready;
  {
    std::lock_guard lock(impl.mu);
    Appender::Impl::Canary canary{impl.last_canary_boundary, impl.next_seq, state};
    impl.last_canary_boundary = impl.next_seq;
    impl.canaries.push_back(canary);
    impl.collect_ready_canaries(&ready);
  }
  impl.resolve_canaries(ready);
  return CommitToken(state);
}

void AppendSender::wait_for_capacity() {
  Appender::Impl& impl = *appender_->impl_;
  if (impl.options.queue_records) {
    std::unique_lock lock(impl.mu);
    impl.capacity_cv.wait(
        lock, [&] { return impl.closing || impl.in_flight < *impl.options.queue_records; });
    return;
  }
  impl.pool->wait_until_available();
}

}  // namespace tidemark
