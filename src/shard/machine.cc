#include "shard/machine.h"

#include <chrono>
#include <thread>

namespace tidemark {
namespace {

// How many times an indeterminate consensus write is retried before the
// caller is told the outcome is unknown.
constexpr int kIndeterminateRetries = 8;

void backoff(int attempt) {
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1 << attempt, 64)));
}

}  // namespace

ShardMachine::ShardMachine(std::string shard, std::shared_ptr<Consensus> consensus)
    : shard_(std::move(shard)),
      key_(shard_consensus_key(shard_)),
      consensus_(std::move(consensus)) {}

void ShardMachine::remember(const ShardState& state) {
  std::lock_guard lock(mu_);
  if (!cache_ || cache_->seqno < state.seqno) cache_ = state;
}

Result<ShardState> ShardMachine::fetch() {
  TM_ASSIGN(auto head, consensus_->head(key_));
  ShardState state;
  if (!head) {
    // Created shards start with no consensus entry: the initial state.
    state.name = shard_;
  } else {
    TM_ASSIGN(state, decode_state(shard_, *head));
  }
  remember(state);
  return state;
}

Result<ShardState> ShardMachine::cached() {
  {
    std::lock_guard lock(mu_);
    if (cache_) return *cache_;
  }
  return fetch();
}

Result<ShardState> ShardMachine::apply(const Transition& transition) {
  // Once a write may have landed, no later failure is definite: report
  // every infrastructure error from then on as indeterminate.
  bool uncertain = false;
  auto infrastructure_error = [&](Error error) {
    if (uncertain && !error.is(ErrorKind::kIndeterminate)) {
      error =
          Error{ErrorKind::kIndeterminate, "after an earlier indeterminate write: " + error.message,
                std::nullopt, std::nullopt};
    }
    return std::unexpected(std::move(error));
  };

  auto initial = cached();
  if (!initial) return infrastructure_error(initial.error());
  ShardState current = std::move(*initial);
  bool fresh = false;
  int indeterminate_attempts = 0;
  for (;;) {
    ShardState next = current;
    auto result = transition(next);
    if (!result) {
      // Judged on a fresh state, which includes our own write if it landed,
      // the transition's verdict is definite.
      if (fresh) return std::unexpected(result.error());
    } else if (*result == TransitionResult::kUnchanged) {
      return current;
    } else {
      next.seqno = current.seqno + 1;
      std::string encoded = encode_state(next);
      std::optional<SeqNo> expected;
      if (current.seqno > 0) expected = current.seqno;
      auto cas = consensus_->compare_and_set(key_, expected, VersionedData{next.seqno, encoded});
      if (cas && *cas == CasOutcome::kCommitted) {
        remember(next);
        return next;
      }
      if (!cas && !cas.error().is(ErrorKind::kIndeterminate)) {
        return infrastructure_error(cas.error());
      }
      if (!cas) {
        uncertain = true;
        if (++indeterminate_attempts > kIndeterminateRetries) return std::unexpected(cas.error());
        backoff(indeterminate_attempts);
        // Only our own bytes at our seqno prove the write landed; anything
        // else means re-running the transition on what is there.
        auto head = consensus_->head(key_);
        if (head && *head && (*head)->seqno == next.seqno && (*head)->data == encoded) {
          remember(next);
          return next;
        }
      }
    }
    auto latest = fetch();
    if (!latest) return infrastructure_error(latest.error());
    current = std::move(*latest);
    fresh = true;
  }
}

}  // namespace tidemark
