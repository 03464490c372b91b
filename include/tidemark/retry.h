// RetryPolicy and Backoff: the one way Tidemark retries a call that failed
// for a reason that may pass (a Determinate or Indeterminate error: a
// backend down, slow or cut off for a moment).
//
// Waits grow exponentially with equal jitter: each is half the current
// ceiling plus a random part of the other half, and the ceiling doubles
// from `initial` up to `max`. Retries stop once `max_attempts` calls have
// been made or `deadline` has passed since the first one, whichever comes
// first (0 leaves that bound out; a policy sets at least one). The reads
// (snapshot, listen, sinks, compaction inputs), the appender, the shard
// state machine, the S3 client and the server's accept loop all use it,
// each with its own policy.
//
// Whether a retry is *safe* is the caller's business: reads always are;
// writes retry only what cannot apply twice (an idempotency token, a
// unique key, a compare-and-set against what they expect).
//
// Thread-safety: RetryPolicy is a plain value; a Backoff is used by one
// thread (it is one call's retry loop).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "tidemark/error.h"

namespace tidemark {

struct RetryPolicy {
  std::chrono::milliseconds initial{10};
  std::chrono::milliseconds max{1000};
  int max_attempts = 0;
  std::chrono::milliseconds deadline{0};
};

// Determinate and Indeterminate errors: the infrastructure failures that a
// later attempt may not meet.
bool is_retryable(const Error& error);

class Backoff {
 public:
  // The clock of the deadline starts here, with the first attempt.
  explicit Backoff(RetryPolicy policy);

  // After a failed attempt: false at once when the policy allows no more
  // (or `stop`, asked now and during the wait, says so); otherwise waits
  // (never past the deadline) and returns true.
  bool next(const std::function<bool()>& stop = {});
  // The same for a caller that waits by itself (on a timer): how long to
  // wait before the next attempt, which it counts, or nullopt when the
  // policy allows no more.
  std::optional<std::chrono::milliseconds> next_wait();

  // Attempts made so far (the first call counts as one).
  int attempts() const { return attempts_; }
  std::chrono::milliseconds elapsed() const;
  // "after N attempts in S s", for error messages.
  std::string describe() const;

 private:
  RetryPolicy policy_;
  std::chrono::steady_clock::time_point started_;
  std::chrono::milliseconds ceiling_;
  int attempts_ = 1;
};

// Calls `call` (returning a Result or Status) until it succeeds, fails with
// an error that is not retryable, or the policy gives up; returns its last
// result, whose message then says how long it tried.
template <typename Call>
auto with_retries(const RetryPolicy& policy, Call&& call, const std::function<bool()>& stop = {})
    -> decltype(call()) {
  Backoff backoff(policy);
  for (;;) {
    auto result = call();
    if (result || !is_retryable(result.error())) return result;
    if (!backoff.next(stop)) {
      if (backoff.attempts() > 1) {
        Error error = result.error();
        error.message += " (" + backoff.describe() + ")";
        return std::unexpected(std::move(error));
      }
      return result;
    }
  }
}

}  // namespace tidemark
