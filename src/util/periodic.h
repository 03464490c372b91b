// PeriodicTask: runs a function every interval until stopped or until the
// function says it is done. Leases use it to heartbeat.
//
// It runs on the process's shared timers (util/executor.h: one timer
// thread, a pool of max(4, 2 x cores) threads), not on a thread of its
// own, so a process's threads do not grow with its leases.
//
// Thread-safety: start() and stop() from the owner; the function runs on a
// pool thread, never twice at once. stop() cancels it and waits for a run
// in progress (unless called from the function itself).
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>

#include "tidemark/error.h"
#include "util/executor.h"
#include "util/try.h"

namespace tidemark {

class PeriodicTask {
 public:
  PeriodicTask() = default;
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;
  ~PeriodicTask() { stop(); }

  // `task` returns false to end the loop. An error when the timers' thread
  // could not be started (util/thread.h). REQUIRES: not started yet.
  [[nodiscard]] Status start(std::chrono::milliseconds interval, std::function<bool()> task) {
    TM_ASSIGN(Timers::Id id, Timers::shared().every(interval, std::move(task)));
    std::lock_guard lock(mu_);
    id_ = id;
    return {};
  }

  // Runs the task as soon as possible (a run in progress runs again once it
  // returns), then on its interval again. A no-op when not started.
  void wake_now() {
    std::optional<Timers::Id> id;
    {
      std::lock_guard lock(mu_);
      id = id_;
    }
    if (id) Timers::shared().wake(*id);
  }

  void stop() {
    std::optional<Timers::Id> id;
    {
      std::lock_guard lock(mu_);
      id.swap(id_);
    }
    if (id) Timers::shared().cancel(*id);
  }

 private:
  std::mutex mu_;
  std::optional<Timers::Id> id_;  // GUARDED_BY(mu_)
};

}  // namespace tidemark
