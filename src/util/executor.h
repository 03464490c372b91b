// Shared executors: a bounded number of threads for work that every shard
// and sink would otherwise keep a thread of its own for (compaction passes,
// lease heartbeats), so that the threads of a process do not grow with the
// shards it has open.
//
// WorkPool runs submitted jobs, oldest first, on at most `max_threads`
// threads, started as jobs arrive and kept for the pool's life. A job
// never blocks the submitter. Memory: the queue holds the jobs submitted
// and not yet started; every caller in Tidemark keeps at most one job of
// its own queued or running (a compactor, a heartbeat), so the queue is
// O(shards + leases), a std::function each.
//
// Timers runs periodic tasks: one timer thread keeps the deadlines (a
// heap) and hands each due task to its WorkPool; a task runs again
// `interval` (or the delay its run returned) after its previous run ended,
// so a task never runs twice at once. Memory: O(tasks) (the heap holds at
// most one entry per wait or wake of a task).
//
// SerialTask is a function run on a WorkPool whenever it is notified,
// never twice at once: notify() queues a run unless one is queued already,
// and a notify() during a run queues one more after it, so no notification
// is lost. An appender's builder and committer are SerialTasks on the
// appenders' pool: an appender waiting for records holds no thread.
// Memory: one queued job at most.
//
// Both shared instances (compaction(), Timers::shared()) are created on
// first use and live until the process exits (never destroyed, so no
// shard or lease outlives them). Their sizes come from the cores:
// compaction max(2, cores) threads, heartbeats max(4, 2 x cores) (a
// heartbeat mostly waits on its consensus). Failing to start a thread
// fails the one submit or task that needed it (a Determinate error,
// util/thread.h) only when the pool has no thread at all; otherwise the
// job waits for one that runs.
//
// Thread-safety: every method is safe from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tidemark/error.h"

namespace tidemark {

class WorkPool {
 public:
  WorkPool(std::string name, std::size_t max_threads);
  ~WorkPool();  // drops queued jobs, waits for running ones
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues `job`, starting a thread for it when every thread is busy and
  // there are fewer than max_threads. An error only when the pool has no
  // thread and none could be started (the job is not queued).
  [[nodiscard]] Status submit(std::function<void()> job);

  std::size_t threads() const;
  std::size_t max_threads() const { return max_threads_; }

  // The process's pool for background compaction: max(2, cores) threads.
  static WorkPool& compaction();
  // The process's pool for appenders' builders and committers:
  // max(16, 8 x cores) threads (a commit mostly waits on a sync).
  static WorkPool& appenders();
  // The process's pool for building a batch (an appender's batch cut
  // into parts): max(32, 16 x cores) threads. A job here may wait for
  // blob_io() jobs, never for another pool's.
  static WorkPool& batch_builds();
  // The process's pool for single blob transfers (a part's upload, the
  // opening of parts for a merge): max(32, 16 x cores) threads, mostly
  // waiting on the blob. A job here never waits for another job.
  static WorkPool& blob_io();

 private:
  void run();

  const std::string name_;
  const std::size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable work_;
  std::deque<std::function<void()>> queue_;  // GUARDED_BY(mu_)
  std::size_t idle_ = 0;                     // GUARDED_BY(mu_)
  bool stopping_ = false;                    // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;         // GUARDED_BY(mu_)
};

// Runs `f` on `pool` and returns its future; when the pool has no thread
// and none can be started, runs `f` here, now: the work is done either
// way, sooner or later. `f` (which may own large buffers) is moved once,
// never copied. Do not wait on the future from a job of the same pool
// (the pools above say which may wait for which).
template <typename F>
std::future<std::invoke_result_t<std::decay_t<F>&>> submit_or_inline(WorkPool& pool, F&& f) {
  using R = std::invoke_result_t<std::decay_t<F>&>;
  auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
  std::future<R> future = task->get_future();
  if (!pool.submit([task] { (*task)(); })) (*task)();
  return future;
}

// Calls fn(0) .. fn(count - 1) on this thread and on up to `helpers` jobs
// of `pool` that join in while work is left; returns when every call has
// returned. A helper that starts after the work is done does nothing, so
// this never waits for a queued job: it may be called from any thread,
// including another pool's job. fn(i) must touch only state of its own i.
void for_each_helped(WorkPool& pool, std::size_t helpers, std::size_t count,
                     const std::function<void(std::size_t)>& fn);

class SerialTask {
 public:
  // Runs on `pool`, which must outlive this.
  SerialTask(WorkPool* pool, std::function<void()> fn);
  ~SerialTask();  // stop()
  SerialTask(const SerialTask&) = delete;
  SerialTask& operator=(const SerialTask&) = delete;

  // Queues a run (see above). When the pool has no thread and none can be
  // started, runs it on the calling thread instead: late rather than never.
  void notify();
  // Runs the function now, on the calling thread, when no run is queued or
  // in progress (saving the hop to a pool thread); otherwise the same as
  // notify(). A notify() during that run queues the next run on the pool.
  void run_here();
  // No run starts after this; waits for a run in progress unless called
  // from the function itself.
  void stop();

 private:
  struct State;
  // Marks a run as wanted; true when the caller must start it (none was
  // queued or running).
  bool want_run();
  static void run(const std::shared_ptr<State>& state, WorkPool* pool);
  static void submit(const std::shared_ptr<State>& state, WorkPool* pool);

  WorkPool* const pool_;
  const std::shared_ptr<State> state_;
};

class Timers {
 public:
  using Id = std::uint64_t;

  // Tasks run on `pool`, which must outlive this.
  explicit Timers(WorkPool* pool);
  ~Timers();  // cancels every task (waiting for those running)
  Timers(const Timers&) = delete;
  Timers& operator=(const Timers&) = delete;

  // Runs `task` every `interval` (first after one interval) until it
  // returns false or is cancelled. An error when the timer thread cannot
  // be started.
  [[nodiscard]] Result<Id> every(std::chrono::milliseconds interval, std::function<bool()> task);

  // Runs `task` after `first`, then again after whatever delay each run
  // returns (zero: queued at once), until a run returns nullopt or the
  // task is cancelled. An error when the timer thread cannot be started.
  using Step = std::function<std::optional<std::chrono::milliseconds>()>;
  [[nodiscard]] Result<Id> schedule(std::chrono::milliseconds first, Step task);

  // Makes task `id` due now: a task waiting runs at once, one running runs
  // again as soon as it returns (unless it ends). A no-op if it has ended.
  void wake(Id id);

  // Cancels task `id` (a no-op if it has ended) and, unless called from
  // the task itself, waits for a run of its function in progress to end:
  // once it returns the function is never called again.
  void cancel(Id id);

  std::size_t tasks() const;
  // The most threads its tasks run on (its pool's).
  std::size_t pool_threads_max() const { return pool_->max_threads(); }

  // The process's timers for heartbeats and lease renewals, on a pool of
  // max(4, 2 x cores) threads.
  static Timers& shared();

 private:
  struct Task {
    Step fn;
    std::chrono::steady_clock::time_point due;  // of its next run, when waiting
    bool running = false;                       // queued on the pool or running
    bool started = false;                       // its function is running
    bool cancelled = false;
    bool woken = false;  // wake() while running: run again at once
  };
  using Due = std::pair<std::chrono::steady_clock::time_point, Id>;

  Status start_thread_locked();
  void push_due_locked(std::chrono::steady_clock::time_point when, Id id);
  void run();
  void run_task(Id id, const std::shared_ptr<Task>& task);

  WorkPool* const pool_;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a run ended (for cancel and the destructor)
  std::condition_variable earlier_;  // for the timer thread: an earlier entry, or stopping
  std::map<Id, std::shared_ptr<Task>> tasks_;                       // GUARDED_BY(mu_)
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due_;  // GUARDED_BY(mu_)
  Id next_id_ = 1;                                                  // GUARDED_BY(mu_)
  bool stopping_ = false;                                           // GUARDED_BY(mu_)
  std::thread thread_;                                              // started under mu_
};

}  // namespace tidemark
