// ConsensusLease: one holder at a time for a Consensus key, across the
// processes and machines that share the Consensus (SQLite on one machine,
// PostgreSQL across machines). Sinks hold one for themselves and one for
// each s3:// or kafka:// destination (sink_claim.h).
//
// The key's head is a LeaseRecord: who holds it (a random token per
// acquisition, the runner, its server id, its process), until when
// (expires_at_ms, wall clock) and its epoch (one more at every
// acquisition). Every change is a compare_and_set on the head, so two
// candidates never both win. A candidate takes the lease (take_over) when
//   - it is free: no record, or released by its holder;
//   - its holder is dead: a process of this machine (same boot and pid
//     namespace) that no longer runs, its pid and start time checked, so
//     a restart after a SIGKILL takes over at once and a reused pid cannot
//     pass for the holder;
//   - its holder is the same sink of the same server (same non-empty
//     owner and sink): a previous life of the candidate's server, which
//     holds its data directory's lock, so none other is alive (one server
//     runs one sink of a name at a time);
//   - it expired (now > expires_at_ms, by each machine's wall clock) and
//     its holder is not a live process of this machine. A live holder here
//     keeps it however long it stalls: it may be paused between its check
//     and its write, and it can be killed (the refusal names its pid).
//     Between servers (both holder and candidate have an owner) an expired
//     lease is taken even from a live process of this machine: a server
//     that stops renewing (paused, cut off) loses its sinks to the others,
//     wherever it runs, and learns it at its next check().
// Otherwise acquire() is Held, naming the holder and its expiry.
//
// The holder renews every `renew_every` (expires_at = now + duration) on
// the process's shared timers (util/periodic.h), and trusts the lease only until `duration -
// margin` after the start of its last renewal that landed: `margin` covers clock skew between
// machines and the time between check() and the write it guards. check() also reads the head, so a
// lease taken over is noticed at the next check even when clocks disagree. Destroying the lease
// stops the renewal and releases the record (best effort; an unreleased one expires or is found
// dead).
//
// A renewal is one compare_and_set against the last version it landed
// (the head is read only when it meets another version: taken over, or an
// earlier write of ours landed after all; a failed write is retried at the
// next renewal). The leases of a process on one Consensus with
// one renew_every renew together, on one timer task, in batches of at most
// kRenewalBatch through Consensus::compare_and_set_many: on SQLite a
// thousand leases cost one transaction (one sync) per period instead of a
// thousand. A lease that joins the group renews at the group's next tick,
// within renew_every; one that leaves (destroyed) never waits for a round
// in progress (a round may take a slow backend's timeout for each write),
// and its release allows for a renewal of that round landing after it.
// Versions do not pile up: every kTruncateEvery-th
// version truncates those below (one truncate_many per batch), so a lease
// keeps at most that many.
//
// Thread-safety: check() and record() may be called from any thread, the
// renewal runs on the shared timers. Memory: one record per lease, a
// pointer in its group, and a timer task per group.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "tidemark/location.h"
#include "util/process_identity.h"

namespace tidemark {

struct LeaseRecord {
  std::string token;    // this acquisition's random id; "" once released
  std::string subject;  // what is held, for messages: "sink files of shard s"
  std::string sink;     // "<shard>/<sink name>" of the holder
  std::string owner;    // the holder's server id; "" for a command
  std::string runner;   // "tidemark sink run", "tidemark serve on 127.0.0.1:6875"
  ProcessIdentity process;
  std::uint64_t epoch = 0;
  std::uint64_t acquired_at_ms = 0;
  std::uint64_t expires_at_ms = 0;

  bool released() const { return token.empty(); }
  // "<runner> (server <owner>; pid P on host H, started T), since A, lease until E".
  std::string describe_holder() const;

  std::string to_json() const;
  // Corruption naming what is wrong.
  [[nodiscard]] static Result<LeaseRecord> parse(std::string_view json);
};

enum class Takeover : std::uint8_t { kFree, kExpired, kHolderDead, kSameRunner, kRefused };

// Whether `candidate` may take the lease whose head is `current` at
// `now_ms`, given the liveness of current's process (see above). Pure.
Takeover take_over(const std::optional<LeaseRecord>& current, const LeaseRecord& candidate,
                   std::uint64_t now_ms, Liveness holder);

// The head record of the lease `key`: nullopt when there is none;
// Corruption when it cannot be parsed. A reader's view, for status pages:
// whether it still holds is the holder's own check().
[[nodiscard]] Result<std::optional<LeaseRecord>> read_lease(Consensus& consensus,
                                                            std::string_view key);

// A holder that stops renewing loses the lease `duration` after its last
// renewal landed (so a server's sink is taken over within duration plus
// the other servers' look, SinkManager::kReconcileEvery), and stops
// trusting it itself `duration - margin` after that renewal started.
struct LeaseOptions {
  std::chrono::milliseconds duration{8'000};
  std::chrono::milliseconds renew_every{2'000};
  std::chrono::milliseconds margin{3'000};
};

class RenewalGroup;

class ConsensusLease {
 public:
  static constexpr SeqNo kTruncateEvery = 6;
  static constexpr std::size_t kRenewalBatch = 256;

  ConsensusLease(const ConsensusLease&) = delete;
  ConsensusLease& operator=(const ConsensusLease&) = delete;
  ~ConsensusLease();  // stops renewing, releases the lease

  // Takes the lease on `key` for `holder` (its subject, sink, owner,
  // runner and process; token, epoch and times are set here). Held naming
  // the holder when it may not; infrastructure errors as Consensus gives
  // them. REQUIRES: options.margin < options.duration.
  [[nodiscard]] static Result<std::unique_ptr<ConsensusLease>> acquire(
      std::shared_ptr<Consensus> consensus, std::string key, LeaseRecord holder,
      LeaseOptions options = {});

  // OK while this lease holds; Held when it is lost for good (taken over,
  // naming the new holder, or deleted); Determinate or Indeterminate when
  // it cannot tell now (not renewed in time, the head cannot be read).
  [[nodiscard]] Status check();

  // The record as acquired (token, epoch).
  const LeaseRecord& record() const { return state_->record; }
  const std::string& key() const { return state_->key; }

 private:
  friend class RenewalGroup;
  // What the renewals touch, shared with the lease's RenewalGroup so that a
  // round in progress may finish with it after the lease is gone (leaving
  // the group never waits for a round: a round may take a slow backend's
  // timeout for each of its writes).
  struct State {
    State(std::shared_ptr<Consensus> c, std::string k, LeaseRecord r, LeaseOptions o, SeqNo s,
          std::chrono::steady_clock::time_point l)
        : consensus(std::move(c)),
          key(std::move(k)),
          record(std::move(r)),
          options(o),
          seqno(s),
          landed(l) {}
    // A renewal is next_renewal() (nullopt once the lease is lost or
    // released), then renewed() with the outcome of its write, which
    // started at `started`; true when the versions below the new one
    // should be truncated.
    std::optional<CasRequest> next_renewal();
    bool renewed(const CasRequest& request, const Result<CasOutcome>& outcome,
                 std::chrono::steady_clock::time_point started);

    const std::shared_ptr<Consensus> consensus;
    const std::string key;
    const LeaseRecord record;  // token, epoch; its expiry is the first one
    const LeaseOptions options;
    mutable std::mutex mu;
    SeqNo seqno;                                   // guarded by mu: our last landed version
    std::chrono::steady_clock::time_point landed;  // guarded by mu: when that write started
    std::optional<LeaseRecord> lost_to;            // guarded by mu
    bool released = false;                         // guarded by mu: renew no more
  };

  explicit ConsensusLease(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void release();
  // Held: the lease went to `holder`.
  std::unexpected<Error> taken_over(const LeaseRecord& holder) const;

  const std::shared_ptr<State> state_;
  std::shared_ptr<RenewalGroup> group_;  // renews it while it is a member
};

}  // namespace tidemark
