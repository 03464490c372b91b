#include "util/executor.h"

#include <algorithm>
#include <atomic>

#include "util/thread.h"
#include "util/try.h"

namespace tidemark {
namespace {

std::size_t cores() {
  return std::max<std::size_t>(1, std::thread::hardware_concurrency());
}

// The task a Timers thread is running on this thread, so that a task may
// cancel itself without waiting for itself.
thread_local const void* current_timers = nullptr;
thread_local Timers::Id current_task = 0;

}  // namespace

// --- WorkPool -----------------------------------------------------------------

WorkPool::WorkPool(std::string name, std::size_t max_threads)
    : name_(std::move(name)), max_threads_(std::max<std::size_t>(1, max_threads)) {}

WorkPool::~WorkPool() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    queue_.clear();
    threads.swap(threads_);
  }
  work_.notify_all();
  for (std::thread& t : threads) t.join();
}

Status WorkPool::submit(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return make_error(ErrorKind::kClosed, name_ + " is stopping");
    queue_.push_back(std::move(job));
    if (queue_.size() > idle_ && threads_.size() < max_threads_) {
      auto started = start_thread(name_, [this] { run(); });
      if (started) {
        threads_.push_back(std::move(*started));
      } else if (threads_.empty()) {
        queue_.pop_back();
        return std::unexpected(started.error());
      }
      // Otherwise the job waits for a thread that runs.
    }
  }
  work_.notify_one();
  return {};
}

std::size_t WorkPool::threads() const {
  std::lock_guard lock(mu_);
  return threads_.size();
}

void WorkPool::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    ++idle_;
    work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (stopping_) return;
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // whatever it owns goes outside the lock
    lock.lock();
  }
}

WorkPool& WorkPool::compaction() {
  // Never destroyed: shards closing at exit may still hand it work.
  static WorkPool* pool = new WorkPool("background compaction", std::max<std::size_t>(2, cores()));
  return *pool;
}

WorkPool& WorkPool::appenders() {
  // Never destroyed, like compaction()'s.
  static WorkPool* pool = new WorkPool("appenders", std::max<std::size_t>(16, 8 * cores()));
  return *pool;
}

WorkPool& WorkPool::batch_builds() {
  // Never destroyed, like compaction()'s.
  static WorkPool* pool = new WorkPool("batch builds", std::max<std::size_t>(32, 16 * cores()));
  return *pool;
}

WorkPool& WorkPool::blob_io() {
  // Never destroyed, like compaction()'s.
  static WorkPool* pool = new WorkPool("blob transfers", std::max<std::size_t>(32, 16 * cores()));
  return *pool;
}

void for_each_helped(WorkPool& pool, std::size_t helpers, std::size_t count,
                     const std::function<void(std::size_t)>& fn) {
  struct Shared {
    std::mutex mu;
    std::condition_variable idle;
    bool closed = false;  // GUARDED_BY(mu): late helpers do nothing
    int active = 0;       // GUARDED_BY(mu): helpers inside work()
    std::atomic<std::size_t> next{0};
  };
  auto shared = std::make_shared<Shared>();
  const auto work = [&fn, count, raw = shared.get()] {
    for (std::size_t i; (i = raw->next.fetch_add(1)) < count;) fn(i);
  };
  for (std::size_t h = 0; h < helpers && h + 1 < count; ++h) {
    auto submitted = pool.submit([shared, &work] {
      {
        std::lock_guard lock(shared->mu);
        if (shared->closed) return;
        ++shared->active;
      }
      work();
      std::lock_guard lock(shared->mu);
      if (--shared->active == 0) shared->idle.notify_all();
    });
    if (!submitted) break;  // done without
  }
  work();
  std::unique_lock lock(shared->mu);
  shared->closed = true;
  shared->idle.wait(lock, [&] { return shared->active == 0; });
}

// --- SerialTask ---------------------------------------------------------------

struct SerialTask::State {
  std::function<void()> fn;
  std::mutex mu;
  std::condition_variable idle;
  bool queued = false;   // a run is wanted and has not started
  bool running = false;  // a run is in progress
  bool stopped = false;
  std::thread::id runner;  // of the run in progress
};

SerialTask::SerialTask(WorkPool* pool, std::function<void()> fn)
    : pool_(pool), state_(std::make_shared<State>()) {
  state_->fn = std::move(fn);
}

SerialTask::~SerialTask() {
  stop();
}

bool SerialTask::want_run() {
  std::lock_guard lock(state_->mu);
  if (state_->stopped || state_->queued) return false;
  state_->queued = true;
  return !state_->running;  // the run in progress queues it when it ends
}

void SerialTask::notify() {
  if (want_run()) submit(state_, pool_);
}

void SerialTask::run_here() {
  if (want_run()) run(state_, pool_);
}

void SerialTask::submit(const std::shared_ptr<State>& state, WorkPool* pool) {
  if (!pool->submit([state, pool] { run(state, pool); })) run(state, pool);
}

void SerialTask::run(const std::shared_ptr<State>& state, WorkPool* pool) {
  for (;;) {
    {
      std::lock_guard lock(state->mu);
      if (state->stopped || state->running || !state->queued) return;
      state->queued = false;
      state->running = true;
      state->runner = std::this_thread::get_id();
    }
    state->fn();
    bool again;
    {
      std::lock_guard lock(state->mu);
      state->running = false;
      state->runner = {};
      again = state->queued && !state->stopped;
    }
    state->idle.notify_all();
    if (!again) return;
    // Notified meanwhile: on a pool thread if one can be had, else here
    // (a loop, not a call: a task that keeps notifying itself inline must
    // not grow the stack).
    if (pool->submit([state, pool] { run(state, pool); })) return;
  }
}

void SerialTask::stop() {
  std::unique_lock lock(state_->mu);
  state_->stopped = true;
  if (state_->runner == std::this_thread::get_id()) return;
  state_->idle.wait(lock, [&] { return !state_->running; });
}

// --- Timers -------------------------------------------------------------------

Timers::Timers(WorkPool* pool) : pool_(pool) {}

Timers::~Timers() {
  {
    std::unique_lock lock(mu_);
    stopping_ = true;
    for (auto& [id, task] : tasks_) task->cancelled = true;
    earlier_.notify_all();
    changed_.wait(lock, [&] {
      return std::none_of(tasks_.begin(), tasks_.end(),
                          [](const auto& entry) { return entry.second->running; });
    });
    tasks_.clear();
  }
  if (thread_.joinable()) thread_.join();
}

Status Timers::start_thread_locked() {
  if (thread_.joinable()) return {};
  TM_ASSIGN(thread_, start_thread("the timers", [this] { run(); }));
  return {};
}

Result<Timers::Id> Timers::every(std::chrono::milliseconds interval, std::function<bool()> task) {
  interval = std::max(interval, std::chrono::milliseconds(1));
  return schedule(interval, [interval, fn = std::move(task)]() {
    return fn() ? std::optional(interval) : std::nullopt;
  });
}

Result<Timers::Id> Timers::schedule(std::chrono::milliseconds first, Step task) {
  std::lock_guard lock(mu_);
  if (stopping_) return make_error(ErrorKind::kClosed, "the timers are stopping");
  TM_TRY(start_thread_locked());
  const Id id = next_id_++;
  auto entry = std::make_shared<Task>();
  entry->fn = std::move(task);
  entry->due = std::chrono::steady_clock::now() + std::max(first, std::chrono::milliseconds(0));
  tasks_.emplace(id, entry);
  push_due_locked(entry->due, id);
  return id;
}

void Timers::wake(Id id) {
  std::lock_guard lock(mu_);
  auto it = tasks_.find(id);
  if (it == tasks_.end() || it->second->cancelled) return;
  Task& task = *it->second;
  if (task.running) {
    task.woken = true;
    return;
  }
  task.due = std::chrono::steady_clock::now();
  push_due_locked(task.due, id);
}

void Timers::push_due_locked(std::chrono::steady_clock::time_point when, Id id) {
  // The timer thread sleeps until the earliest entry: it need only wake for
  // an earlier one (most entries go behind others, and waking it for each
  // cost a context switch per run).
  const bool earliest = due_.empty() || when < due_.top().first;
  due_.emplace(when, id);
  if (earliest) earlier_.notify_one();
}

void Timers::cancel(Id id) {
  std::unique_lock lock(mu_);
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return;
  std::shared_ptr<Task> task = it->second;
  task->cancelled = true;
  // Only a run that has started is waited for: one still queued for a
  // pool thread sees `cancelled` and skips the function (waiting for it
  // could deadlock a pool whose every thread is in a cancel).
  if (task->started && !(current_timers == this && current_task == id)) {
    changed_.wait(lock, [&] { return !task->started; });
  }
  // A run in progress (this very task) erases it when it returns.
  if (!task->running) tasks_.erase(id);
}

std::size_t Timers::tasks() const {
  std::lock_guard lock(mu_);
  return tasks_.size();
}

void Timers::run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (due_.empty()) {
      earlier_.wait(lock);
      continue;
    }
    const auto [when, id] = due_.top();
    if (std::chrono::steady_clock::now() < when) {
      earlier_.wait_until(lock, when);
      continue;
    }
    due_.pop();
    auto it = tasks_.find(id);
    if (it == tasks_.end()) continue;
    std::shared_ptr<Task> task = it->second;
    if (task->cancelled) {
      if (!task->running) tasks_.erase(it);
      continue;
    }
    // An entry left by a wake(), or for a run that has since started.
    if (task->running || task->due != when) continue;
    task->running = true;
    lock.unlock();
    if (!pool_->submit([this, id, task] { run_task(id, task); })) {
      run_task(id, task);  // no thread to be had: here, late rather than never
    }
    lock.lock();
  }
}

void Timers::run_task(Id id, const std::shared_ptr<Task>& task) {
  bool cancelled;
  {
    std::lock_guard lock(mu_);
    cancelled = task->cancelled || stopping_;  // while it waited for a thread
    task->started = !cancelled;
  }
  current_timers = this;
  current_task = id;
  std::optional<std::chrono::milliseconds> next;
  if (!cancelled) next = task->fn();
  current_timers = nullptr;
  current_task = 0;
  std::lock_guard lock(mu_);
  task->running = false;
  task->started = false;
  if (!next || task->cancelled || stopping_) {
    auto it = tasks_.find(id);
    if (it != tasks_.end() && it->second == task) tasks_.erase(it);
  } else {
    if (task->woken) next = std::chrono::milliseconds(0);
    task->woken = false;
    task->due = std::chrono::steady_clock::now() + std::max(*next, std::chrono::milliseconds(0));
    push_due_locked(task->due, id);
  }
  changed_.notify_all();  // a cancel() waiting for this run
}

Timers& Timers::shared() {
  // Never destroyed (see the header), like its pool.
  static WorkPool* pool = new WorkPool("heartbeats", std::max<std::size_t>(4, 2 * cores()));
  static Timers* timers = new Timers(pool);
  return *timers;
}

}  // namespace tidemark
