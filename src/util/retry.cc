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
  return "gave up after " + std::to_string(attempts_) +
         (attempts_ == 1 ? " attempt" : " attempts") + " in " + seconds + " s";
}

std::optional<std::chrono::milliseconds> Backoff::next_wait() {
  using namespace std::chrono;
  if (policy_.max_attempts > 0 && attempts_ >= policy_.max_attempts) return std::nullopt;
  if (policy_.max_attempts <= 0 && policy_.deadline.count() <= 0) return std::nullopt;
  const auto half = ceiling_.count() / 2;
  std::uniform_int_distribution<long> jitter(0, ceiling_.count() - half);
  auto wait = milliseconds(half + jitter(jitter_source()));
  if (policy_.deadline.count() > 0) {
    const auto left = ceil<milliseconds>(started_ + policy_.deadline - steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    wait = std::min(wait, left);
  }
  ceiling_ = std::min(ceiling_ * 2, std::max(policy_.max, milliseconds(1)));
  ++attempts_;
  return wait;
}

bool Backoff::next(const std::function<bool()>& stop) {
  using namespace std::chrono;
  if (stop && stop()) return false;
  const auto wait = next_wait();
  if (!wait) return false;
  const auto until = steady_clock::now() + *wait;
  while (steady_clock::now() < until) {
    if (stop && stop()) {
      --attempts_;  // the attempt it counted will not be made
      return false;
    }
    std::this_thread::sleep_for(
        std::min<steady_clock::duration>(until - steady_clock::now(), kStopCheck));
  }
  return true;
}

}  // namespace tidemark
