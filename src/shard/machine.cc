#include "shard/machine.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "shard/change_watch.h"
#include "tidemark/retry.h"
#include "util/ids.h"
#include "util/try.h"

namespace tidemark {
namespace {

// How an indeterminate consensus write is retried (nine attempts in all,
// about a quarter of a second) before the caller is told the outcome is
// unknown.
constexpr RetryPolicy kIndeterminateRetry{
    std::chrono::milliseconds(2), std::chrono::milliseconds(64), 9, {}};
// How a rollup's upload is retried: its key is this attempt's own, so
// writing it again is harmless.
constexpr RetryPolicy kRollupUploadRetry{
    std::chrono::milliseconds(10), std::chrono::milliseconds(100), 5, {}};

std::int64_t steady_nanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct ShardMachine::Rider {
  explicit Rider(const Transition* t) : transition(t) {}
  enum class Stage : std::uint8_t { kQueued, kAboard, kCommitted, kReleased };
  const Transition* transition;
  Stage stage = Stage::kQueued;  // GUARDED_BY(riders_mu_)
  bool in_doubt = false;         // released after an indeterminate carrying write
  StatePtr committed;            // once kCommitted
};

// The riders one carrying apply has aboard: boarded after its own
// transition, committed with its write or released (to apply themselves)
// when that write fails, when the apply retries, or when it returns.
class ShardMachine::Carried {
 public:
  explicit Carried(ShardMachine* machine) : machine_(machine) {}
  ~Carried() { release(); }
  Carried(const Carried&) = delete;
  Carried& operator=(const Carried&) = delete;

  // Runs the queued riders' transitions on `state`, after the carrier's
  // own; one that fails or changes nothing is rolled back and released.
  void board(ShardState& state) {
    std::vector<Rider*> queued;
    {
      std::lock_guard lock(machine_->riders_mu_);
      queued.assign(machine_->riders_.begin(), machine_->riders_.end());
      machine_->riders_.clear();
      for (Rider* rider : queued) rider->stage = Rider::Stage::kAboard;
    }
    std::vector<Rider*> refused;
    for (Rider* rider : queued) {
      ShardState before = state;
      auto result = (*rider->transition)(state);
      if (result && *result == TransitionResult::kWrite) {
        aboard_.push_back(rider);
      } else {
        state = std::move(before);
        refused.push_back(rider);
      }
    }
    settle(refused, nullptr, false);
  }
  // The write carrying them may have landed: a released rider is in doubt.
  void doubt() { in_doubt_ = !aboard_.empty(); }
  void commit(const StatePtr& state) {
    machine_->riders_carried_.fetch_add(aboard_.size(), std::memory_order_relaxed);
    settle(aboard_, state, false);
  }
  void release() { settle(aboard_, nullptr, in_doubt_); }

 private:
  void settle(std::vector<Rider*>& riders, const StatePtr& committed, bool in_doubt) {
    if (riders.empty()) return;
    {
      std::lock_guard lock(machine_->riders_mu_);
      for (Rider* rider : riders) {
        if (committed) {
          rider->stage = Rider::Stage::kCommitted;
          rider->committed = committed;
        } else {
          rider->stage = Rider::Stage::kReleased;
          rider->in_doubt = in_doubt;
        }
      }
    }
    riders.clear();
    if (&riders == &aboard_) in_doubt_ = false;
    machine_->riders_cv_.notify_all();
  }

  ShardMachine* const machine_;
  std::vector<Rider*> aboard_;
  bool in_doubt_ = false;
};

ShardMachine::ShardMachine(std::string shard, std::shared_ptr<Consensus> consensus,
                           std::shared_ptr<Blob> blob, std::uint64_t inline_rollup_max_bytes)
    : shard_(std::move(shard)),
      key_(shard_consensus_key(shard_)),
      consensus_(std::move(consensus)),
      blob_(std::move(blob)),
      inline_rollup_max_bytes_(inline_rollup_max_bytes) {}

Result<ShardState> ShardMachine::load_rollup(const RollupRef& rollup) {
  // A rollup without an id is a full version in consensus: look there
  // first (no blob round trip), then in blob, where shards written before
  // rollup ids existed keep theirs.
  auto in_consensus = [&]() -> Result<std::optional<ShardState>> {
    TM_ASSIGN(auto versions, consensus_->scan(key_, rollup.seqno, 1));
    if (versions.empty() || versions.front().seqno != rollup.seqno ||
        !is_full_version(versions.front().data)) {
      return std::optional<ShardState>();
    }
    TM_ASSIGN(ShardState state, decode_state(shard_, versions.front()));
    return std::optional<ShardState>(std::move(state));
  };
  if (rollup.id.empty()) {
    TM_ASSIGN(auto state, in_consensus());
    if (state) return std::move(*state);
  }
  TM_ASSIGN(auto bytes, blob_->get(rollup_key(shard_, rollup.seqno, rollup.id)));
  if (bytes) {
    TM_ASSIGN(ShardState state,
              decode_state(shard_, VersionedData{rollup.seqno, std::move(*bytes)}));
    state.rollup_id = rollup.id;
    return state;
  }
  if (!rollup.id.empty()) {
    TM_ASSIGN(auto state, in_consensus());
    if (state) return std::move(*state);
  }
  return make_error(ErrorKind::kNotFound, "rollup of shard " + shard_ + " at seqno " +
                                              std::to_string(rollup.seqno) + " is gone");
}

void ShardMachine::remember(const StatePtr& state) {
  {
    std::lock_guard lock(mu_);
    if (cache_ && cache_->seqno >= state->seqno) return;
    cache_ = state;
  }
  if (watch_) watch_->observe(key_, state->seqno, state->upper);
}

Result<StatePtr> ShardMachine::fold_to(const VersionedData& head) {
  TM_ASSIGN(RollupRef rollup, version_rollup(shard_, head));
  StatePtr base;
  {
    std::lock_guard lock(mu_);
    if (cache_ && cache_->seqno == head.seqno) return cache_;
    // The cached state is a valid starting point if it is on head's chain.
    if (cache_ && cache_->seqno >= rollup.seqno && cache_->seqno < head.seqno) base = cache_;
  }
  if (rollup.seqno == head.seqno) {
    TM_ASSIGN(ShardState state, decode_state(shard_, head));
    auto shared = std::make_shared<const ShardState>(std::move(state));
    remember(shared);
    return shared;
  }
  if (!base) {
    auto loaded = load_rollup(rollup);
    if (!loaded && loaded.error().is(ErrorKind::kNotFound)) {
      // Garbage collection moved on while we read: the caller reads the
      // head again.
      return make_error(ErrorKind::kDeterminate,
                        "state of shard " + shard_ + " changed while it was read; retry");
    }
    if (!loaded) return std::unexpected(loaded.error());
    base = std::make_shared<const ShardState>(std::move(*loaded));
    if (base->seqno == head.seqno) {
      remember(base);
      return base;
    }
  }
  SeqNo from = base->seqno + 1;
  TM_ASSIGN(auto versions, consensus_->scan(key_, from, head.seqno - from + 1));
  if (versions.empty() || versions.front().seqno != from || versions.back().seqno < head.seqno) {
    // Truncated underneath us: the caller reads the head again.
    return make_error(ErrorKind::kDeterminate,
                      "state of shard " + shard_ + " changed while it was read; retry");
  }
  for (const VersionedData& version : versions) {
    if (version.seqno != base->seqno + 1) {
      return corruption("state of shard " + shard_ + " has a gap before seqno " +
                        std::to_string(version.seqno));
    }
    TM_ASSIGN(ShardState next, apply_version(shard_, base.get(), version));
    base = std::make_shared<const ShardState>(std::move(next));
  }
  remember(base);
  return base;
}

bool ShardMachine::accepts(const ShardState& state) const {
  return !incarnation_ || (!state.deleted && state.incarnation == *incarnation_);
}

Result<StatePtr> ShardMachine::checked(Result<StatePtr> state) const {
  if (!state || accepts(**state)) return state;
  refused_.store(true, std::memory_order_relaxed);
  if ((*state)->deleted) {
    return make_error(ErrorKind::kNotFound, "shard " + shard_ + " was deleted");
  }
  return make_error(ErrorKind::kNotFound, "shard " + shard_ +
                                              " was deleted and created again since this "
                                              "handle opened it: open it anew");
}

Result<StatePtr> ShardMachine::fetch() {
  return checked(fetch_any());
}

Result<StatePtr> ShardMachine::fetch_any() {
  for (int attempt = 0;; ++attempt) {
    TM_ASSIGN(auto head, consensus_->head(key_));
    if (!head) {
      // Created shards start with no consensus entry: the initial state.
      auto initial = std::make_shared<ShardState>();
      initial->name = shard_;
      return StatePtr(std::move(initial));
    }
    auto state = fold_to(*head);
    if (state || attempt >= 3 || !state.error().is(ErrorKind::kDeterminate)) return state;
  }
}

Result<StatePtr> ShardMachine::cached() {
  {
    std::lock_guard lock(mu_);
    // A refused cached state is judged again on a fresh one: the shard
    // may have been created again since.
    if (cache_ && accepts(*cache_)) return cache_;
  }
  return fetch();
}

Result<StatePtr> ShardMachine::apply(const Transition& transition, Carry carry) {
  if (carry == Carry::kRiders) carrier_seen_ns_.store(steady_nanos(), std::memory_order_relaxed);
  return apply_impl(transition, carry, false);
}

Result<StatePtr> ShardMachine::apply_riding(const Transition& transition) {
  const std::int64_t since = steady_nanos() - carrier_seen_ns_.load(std::memory_order_relaxed);
  if (since > std::chrono::nanoseconds(kRideWindow).count()) {
    return apply_impl(transition, Carry::kNo, false);
  }
  Rider rider(&transition);
  std::unique_lock lock(riders_mu_);
  riders_.push_back(&rider);
  auto settled = [&] {
    return rider.stage == Rider::Stage::kCommitted || rider.stage == Rider::Stage::kReleased;
  };
  if (!riders_cv_.wait_for(lock, kRideWait, settled)) {
    if (rider.stage == Rider::Stage::kQueued) {
      riders_.erase(std::find(riders_.begin(), riders_.end(), &rider));
      rider.stage = Rider::Stage::kReleased;
    } else {
      riders_cv_.wait(lock, settled);  // aboard: its carrier's attempt settles it
    }
  }
  if (rider.stage == Rider::Stage::kCommitted) return rider.committed;
  const bool in_doubt = rider.in_doubt;
  lock.unlock();
  return apply_impl(transition, Carry::kNo, in_doubt);
}

std::size_t ShardMachine::riders_waiting() {
  std::lock_guard lock(riders_mu_);
  return riders_.size();
}

Result<StatePtr> ShardMachine::apply_impl(const Transition& transition, Carry carry,
                                          bool in_doubt) {
  // Once a write may have landed, no later failure is definite: report
  // every infrastructure error from then on as indeterminate.
  bool uncertain = in_doubt;
  Carried carried(this);
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
  StatePtr current = std::move(*initial);
  bool fresh = false;
  std::optional<Backoff> indeterminate_backoff;
  for (;;) {
    auto next = std::make_shared<ShardState>(*current);
    auto result = transition(*next);
    if (!result) {
      // Judged on a fresh state, which includes our own write if it landed,
      // the transition's verdict is definite. Except that a lost lease
      // takes the writer's memory of its own write (its last token) with
      // it: after an indeterminate attempt, that verdict is a "maybe".
      if (fresh && uncertain && result.error().is(ErrorKind::kLeaseExpired)) {
        return infrastructure_error(
            Error{ErrorKind::kIndeterminate, result.error().message, std::nullopt, std::nullopt});
      }
      if (fresh) return std::unexpected(result.error());
    } else if (*result == TransitionResult::kUnchanged) {
      return current;
    } else {
      if (carry == Carry::kRiders) carried.board(*next);
      next->seqno = current->seqno + 1;
      RollupRef rollup{current->rollup, current->rollup_id};
      // A diff, unless this is the shard's first version or the chain is
      // long. A long chain ends: a small state is written whole, as this
      // version (a full version, in this same consensus write); a larger
      // one makes `current` the new rollup, written to blob under a key of
      // this attempt's own before any version names it.
      std::string encoded;
      // The incarnation and the tombstone flag travel only in full versions.
      const bool first = current->seqno == 0 || !diff_can_carry(*current, *next);
      if (first || rollup.seqno == 0 || next->seqno - rollup.seqno >= kRollupInterval) {
        const bool may_inline = first || inline_rollup_max_bytes_ > 0;
        std::string whole = may_inline ? encode_state(*next) : std::string();
        if (first || (may_inline && whole.size() <= inline_rollup_max_bytes_)) {
          rollup = RollupRef{next->seqno, {}};
          encoded = std::move(whole);
        } else {
          rollup = RollupRef{current->seqno, random_id()};
          const std::string key = rollup_key(shard_, rollup.seqno, rollup.id);
          const std::string bytes = encode_state(*current);
          auto written = with_retries(kRollupUploadRetry, [&] { return blob_->set(key, bytes); });
          if (!written) return infrastructure_error(written.error());
        }
      }
      next->rollup = rollup.seqno;
      next->rollup_id = rollup.id;
      if (rollup.seqno != next->seqno) encoded = encode_diff(*current, *next, rollup);
      std::optional<SeqNo> expected;
      if (current->seqno > 0) expected = current->seqno;
      auto cas = consensus_->compare_and_set(key_, expected, VersionedData{next->seqno, encoded});
      if (cas && *cas == CasOutcome::kCommitted) {
        StatePtr committed = std::move(next);
        remember(committed);
        carried.commit(committed);
        return committed;
      }
      if (!cas && !cas.error().is(ErrorKind::kIndeterminate)) {
        return infrastructure_error(cas.error());
      }
      if (!cas) {
        uncertain = true;
        carried.doubt();
        if (!indeterminate_backoff) indeterminate_backoff.emplace(kIndeterminateRetry);
        if (!indeterminate_backoff->next()) return std::unexpected(cas.error());
        // Only our own bytes at our seqno prove the write landed; anything
        // else means re-running the transition on what is there.
        auto head = consensus_->head(key_);
        if (head && *head && (*head)->seqno == next->seqno && (*head)->data == encoded) {
          StatePtr committed = std::move(next);
          remember(committed);
          carried.commit(committed);
          return committed;
        }
      }
    }
    // The riders aboard apply themselves; the next attempt boards anew.
    carried.release();
    auto latest = fetch();
    if (!latest) return infrastructure_error(latest.error());
    current = std::move(*latest);
    fresh = true;
  }
}

}  // namespace tidemark
