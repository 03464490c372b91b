// ShardMachine: commits pure state transitions through Consensus.
//
// States are stored as a chain of versions (state.h): diffs in consensus,
// each naming the rollup (a full state) its chain starts from. Every
// kRollupInterval versions the machine starts a new chain: a state of at
// most `inline_rollup_max_bytes` is written as the version itself (a full
// version, in the same consensus write: no blob write, no extra sync); a
// larger one is written to blob first, under a key no other write uses,
// and the diff after it names it. fetch() reads the head, then folds the
// diffs since its rollup (or since the cached state, when that is on the
// same chain) onto it.
//
// apply(transition) runs the transition on a copy of the latest known
// state and commits the result with compare_and_set(expected = its seqno).
// On a lost race it reloads and re-applies; on an indeterminate consensus
// error it reads the head to learn whether its own write landed (same
// seqno and bytes) and otherwise retries, a bounded number of times, before
// reporting Indeterminate. A transition that fails on a cached state is
// re-run once on a freshly fetched one, so a stale cache never produces a
// spurious error such as UpperMismatch.
//
// Riders: background work whose commit may wait (compaction's merges)
// hands its transition to apply_riding(). While appends commit in this
// process (apply(..., Carry::kRiders) within the last kRideWindow), it
// waits for the next such commit, which runs it after its own transition
// and writes both in its one consensus write: no write and no sync of its
// own, and no lost compare-and-set for the append that comes next. A rider
// that fails or changes nothing there, or whose carrying write fails, is
// rolled back out of that write and applies itself, as apply() would; so
// does one that waited kRideWait in vain. A rider released after an
// indeterminate carrying write starts its own apply in doubt (its later
// definite errors are reported as indeterminate), like a retry of apply().
// So a rider's transition must tolerate being run again on a state its
// earlier run may have reached (apply() asks the same of every transition
// after an indeterminate write).
//
// Thread-safety: safe for concurrent use; the cached state and the riders'
// queue are guarded by mutexes and no lock is held across I/O. A rider's
// transition runs on the carrying apply's thread while its own caller
// waits.
//
// Memory: the riders' queue holds a pointer per waiting caller (at most
// one per compaction pool thread); a carrier holds, besides its state, one
// copy of it at a time: the state before the rider whose transition runs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "shard/state.h"
#include "tidemark/client.h"
#include "tidemark/location.h"

namespace tidemark {

class ChangeWatch;

enum class TransitionResult : std::uint8_t { kWrite, kUnchanged };

// Mutates the state it is given (a private copy); must be pure.
using Transition = std::function<Result<TransitionResult>(ShardState& state)>;

// States are shared, immutable once published: readers hold them without
// copying, and the cache swaps pointers.
using StatePtr = std::shared_ptr<const ShardState>;

// Whether an apply carries the riders queued meanwhile (see above).
enum class Carry : std::uint8_t { kNo, kRiders };

// How recently a carrying apply must have run for a rider to wait for the
// next, and how long it waits. Under 1,000 clients the Appender commits
// about every 9 ms; an idle shard's compaction does not wait at all.
inline constexpr std::chrono::milliseconds kRideWindow{25};
inline constexpr std::chrono::milliseconds kRideWait{25};

class ShardMachine {
 public:
  // REQUIRES: the shard exists (see Client::create_shard).
  // inline_rollup_max_bytes: see above and ClientOptions (0: rollups always
  // go to blob).
  ShardMachine(std::string shard, std::shared_ptr<Consensus> consensus, std::shared_ptr<Blob> blob,
               std::uint64_t inline_rollup_max_bytes = ClientOptions().inline_rollup_max_bytes);
  ShardMachine(const ShardMachine&) = delete;
  ShardMachine& operator=(const ShardMachine&) = delete;

  const std::string& shard() const { return shard_; }
  const std::string& key() const { return key_; }

  // Tells `watch` of every newer state this machine learns from now on.
  // REQUIRES: called before the machine is shared.
  void report_to(std::shared_ptr<ChangeWatch> watch) { watch_ = std::move(watch); }

  // From now on fetch(), latest_known() and apply() fail with NotFound
  // ("was deleted") on a tombstone or a state of another incarnation: a
  // handle opened before a delete never reads or writes what came after.
  // Without it (the delete itself, its garbage collection) every state is
  // accepted. REQUIRES: called before the machine is shared.
  void expect_incarnation(std::uint64_t incarnation) { incarnation_ = incarnation; }
  // True once expect_incarnation() refused a state.
  bool refused() const { return refused_.load(std::memory_order_relaxed); }

  // The latest state in consensus (and refreshes the cache).
  [[nodiscard]] Result<StatePtr> fetch();

  // The latest state this machine knows (its cache: what it last fetched
  // or committed), fetching only when it knows none. For decisions that
  // may lag, such as the write stall.
  [[nodiscard]] Result<StatePtr> latest_known() { return cached(); }

  // Commits `transition` and returns the state it produced (or found, when
  // the transition left it unchanged). With Carry::kRiders (appends), a
  // write also carries the riders queued meanwhile.
  [[nodiscard]] Result<StatePtr> apply(const Transition& transition, Carry carry = Carry::kNo);

  // As apply(), riding the next carrying apply when one is likely soon
  // (see above). For work whose commit may wait up to kRideWait.
  [[nodiscard]] Result<StatePtr> apply_riding(const Transition& transition);

  // Riders carried by a write that landed, and riders queued now waiting
  // for a carrier: for tests and figures.
  std::uint64_t riders_carried() const { return riders_carried_.load(std::memory_order_relaxed); }
  std::size_t riders_waiting();

  // The full state at `rollup`: the blob rollup, or the consensus version
  // at that seqno when it is a full state. NotFound when neither exists
  // (garbage collection moved past it).
  [[nodiscard]] Result<ShardState> load_rollup(const RollupRef& rollup);

 private:
  struct Rider;
  class Carried;
  // apply(); `in_doubt`: an earlier write of this transition may have
  // landed (a rider released after an indeterminate carrying write).
  [[nodiscard]] Result<StatePtr> apply_impl(const Transition& transition, Carry carry,
                                            bool in_doubt);
  // fetch() without the incarnation check.
  [[nodiscard]] Result<StatePtr> fetch_any();
  // The cached state, fetching it if there is none yet.
  [[nodiscard]] Result<StatePtr> cached();
  void remember(const StatePtr& state);
  // Reads the versions after the cached state (or from the rollup) up to
  // at least `head` and folds them.
  [[nodiscard]] Result<StatePtr> fold_to(const VersionedData& head);
  // False when expect_incarnation() refuses `state`.
  bool accepts(const ShardState& state) const;
  // `state`, unless expect_incarnation() refuses it.
  [[nodiscard]] Result<StatePtr> checked(Result<StatePtr> state) const;

  const std::string shard_;
  const std::string key_;
  const std::shared_ptr<Consensus> consensus_;
  const std::shared_ptr<Blob> blob_;
  const std::uint64_t inline_rollup_max_bytes_;
  std::shared_ptr<ChangeWatch> watch_;  // may be null
  std::optional<std::uint64_t> incarnation_;
  mutable std::atomic<bool> refused_{false};
  std::mutex mu_;
  StatePtr cache_;  // GUARDED_BY(mu_)

  std::mutex riders_mu_;
  std::condition_variable riders_cv_;  // a rider was committed or released
  std::deque<Rider*> riders_;          // GUARDED_BY(riders_mu_): queued, not yet carried
  // Steady-clock nanoseconds when a carrying apply last started.
  std::atomic<std::int64_t> carrier_seen_ns_{0};
  std::atomic<std::uint64_t> riders_carried_{0};
};

}  // namespace tidemark
