// Cancellation: a flag one thread raises so that another thread's blocking
// calls (an S3 request, a Kafka transaction, a backoff between retries)
// give up promptly with an error instead of running to their timeouts.
//
// Whoever blocks checks cancelled() between slices of its wait (each slice
// at most about a second: libcurl's progress callback, a Kafka call's
// timeout) and returns cancelled_error(). A cancelled call that may have
// changed something reports Indeterminate like any other interrupted call.
//
// Thread-safety: every method is safe from any thread. Once cancelled,
// always cancelled.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>

#include "tidemark/error.h"

namespace tidemark {

class Cancellation {
 public:
  void cancel() {
    {
      std::lock_guard lock(mutex_);
      cancelled_.store(true, std::memory_order_release);
    }
    woken_.notify_all();
  }

  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Waits `duration`, or less if cancelled meanwhile; true if cancelled.
  template <typename Rep, typename Period>
  bool wait_for(std::chrono::duration<Rep, Period> duration) const {
    std::unique_lock lock(mutex_);
    return woken_.wait_for(lock, duration, [&] { return cancelled(); });
  }

 private:
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable woken_;
};

// True when `c` is set and cancelled (a null Cancellation never is).
inline bool is_cancelled(const Cancellation* c) {
  return c != nullptr && c->cancelled();
}

// The error of a call given up because it was cancelled: Determinate, or
// Indeterminate when `may_have_applied`.
inline std::unexpected<Error> cancelled_error(std::string_view what,
                                              bool may_have_applied = false) {
  return make_error(may_have_applied ? ErrorKind::kIndeterminate : ErrorKind::kDeterminate,
                    std::string(what) + ": cancelled (the sink or server is stopping)");
}

}  // namespace tidemark
