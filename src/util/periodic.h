// PeriodicTask: runs a function on a thread of its own every interval until
// stopped or until the function says it is done. Leases use it to heartbeat.
//
// Thread-safety: start() and stop() from the owner; the task runs on its
// own thread. stop() wakes the thread at once and joins it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "tidemark/error.h"
#include "util/thread.h"

namespace tidemark {

class PeriodicTask {
 public:
  PeriodicTask() = default;
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;
  ~PeriodicTask() { stop(); }

  // `task` returns false to end the loop. An error when no thread could be
  // started (util/thread.h). REQUIRES: not started yet.
  [[nodiscard]] Status start(std::chrono::milliseconds interval, std::function<bool()> task) {
    TM_ASSIGN(thread_, start_thread("a heartbeat", [this, interval, task = std::move(task)] {
                std::unique_lock lock(mu_);
                for (;;) {
                  if (cv_.wait_for(lock, interval, [&] { return stopping_; })) return;
                  lock.unlock();
                  const bool again = task();
                  lock.lock();
                  if (!again) return;
                }
              }));
    return {};
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace tidemark
