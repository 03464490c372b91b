#include "tidemark/retry.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

namespace tidemark {
namespace {

// A stop predicate is asked at least this often during a wait.
constexpr std::chrono::milliseconds kStopCheck{50};

std::minstd_rand& jitter_source() {
  thread_local std::minstd_rand random(std::random_device{}());
  return random;
}

}  // namespace

bool is_retryable(const Error& error) {
  return error.is(ErrorKind::kDeterminate) || error.is(ErrorKind::kIndeterminate);
}

Backoff::Backoff(RetryPolicy policy)
    : policy_(policy),
      started_(std::chrono::steady_clock::now()),
      ceiling_(std::max(policy.initial, std::chrono::milliseconds(1))) {}

std::chrono::milliseconds Backoff::elapsed() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               started_);
}

std::string Backoff::describe() const {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", static_cast<double>(elapsed().count()) / 1000);
  return "gave up after " + std::to_string(attempts_) + (attempts_ == 1 ? " attempt" : " attempts") +
         " in " + seconds + " s";
}

bool Backoff::next(const std::function<bool()>& stop) {
  using namespace std::chrono;
  if (policy_.max_attempts > 0 && attempts_ >= policy_.max_attempts) return false;
  if (policy_.max_attempts <= 0 && policy_.deadline.count() <= 0) return false;
  if (stop && stop()) return false;
  const auto now = steady_clock::now();
  auto until = now;
  {
    const auto half = ceiling_.count() / 2;
    std::uniform_int_distribution<long> jitter(0, ceiling_.count() - half);
    until += milliseconds(half + jitter(jitter_source()));
  }
  if (policy_.deadline.count() > 0) {
    const auto deadline = started_ + policy_.deadline;
    if (now >= deadline) return false;
    until = std::min(until, deadline);
  }
  ceiling_ = std::min(ceiling_ * 2, std::max(policy_.max, milliseconds(1)));
  while (steady_clock::now() < until) {
    if (stop && stop()) return false;
    std::this_thread::sleep_for(std::min<steady_clock::duration>(until - steady_clock::now(),
                                                                 kStopCheck));
  }
  ++attempts_;
  return true;
}

}  // namespace tidemark
