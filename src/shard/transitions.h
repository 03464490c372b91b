// The pure transitions of a ShardState: leases, writers, readers and their
// holds on since and on versions, deleting and creating again, producers,
// and compare_and_append. Each changes the state it is given and nothing
// else (no I/O, no clock: the time is an argument), so ShardMachine can
// apply one again to the state it lost a race to. Compaction's transition
// is apply_compaction (spine.h).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shard/state.h"
#include "tidemark/batch.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/write.h"

namespace tidemark {

// Drops writers and leased readers whose lease ran out before `now_ms`, and
// producers that expired. True if it dropped any.
bool expire_leases(ShardState& state, std::uint64_t now_ms);

// Writers. Registers a writer (idempotent: a registered writer's lease is
// extended).
// `owner` names the registering process (kept for `shard inspect`).
void register_writer(ShardState& state, std::string_view writer_id, std::uint64_t lease_expires_ms,
                     std::uint64_t now_ms, std::string_view owner = {});
// Extends a writer's lease; NotFound when it has expired.
[[nodiscard]] Status heartbeat_writer(ShardState& state, std::string_view writer_id,
                                      std::uint64_t lease_expires_ms, std::uint64_t now_ms);
// Drops a writer: it can never append again.
void remove_writer(ShardState& state, std::string_view writer_id, std::uint64_t now_ms);

// Readers. Every reader transition first drops leased readers whose lease
// expired before `now_ms`, and ends by advancing since to the least hold
// (never past upper, never backwards; with no readers it stays).
//
// Registers a reader holding the current since. A leased reader's seqno
// hold starts at the version this transition writes (state.seqno + 1). A
// critical reader that exists already keeps its hold (a restarted sink
// finds it again).
void register_reader(ShardState& state, std::string_view reader_id, bool critical,
                     std::uint64_t lease_expires_ms, std::uint64_t now_ms,
                     std::string_view owner = {});
// Extends a leased reader's lease and moves its seqno hold forward to
// `pinned` (the oldest version its open cursors use), or, with nothing
// pinned, to the version this transition writes. NotFound when it expired.
[[nodiscard]] Status heartbeat_reader(ShardState& state, std::string_view reader_id,
                                      std::uint64_t lease_expires_ms, std::uint64_t now_ms,
                                      std::optional<SeqNo> pinned = std::nullopt);
// heartbeat_reader for several readers in one transition (one expiry pass,
// one advance of since). The ids of those that expired go to `expired`.
struct ReaderBeat {
  std::string_view reader_id;
  std::uint64_t lease_expires_ms = 0;
  std::optional<SeqNo> pinned;
};
void heartbeat_readers(ShardState& state, std::span<const ReaderBeat> beats, std::uint64_t now_ms,
                       std::vector<std::string>* expired);
// Moves a reader's hold forward to `since` (a hold never moves back: an
// earlier frontier leaves it). NotFound when the reader has expired.
[[nodiscard]] Status downgrade_reader_since(ShardState& state, std::string_view reader_id,
                                            Frontier since, std::uint64_t now_ms);
// Drops a reader (leased or critical) and its hold.
void remove_reader(ShardState& state, std::string_view reader_id, std::uint64_t now_ms);

// Deleting. bury() makes the state a tombstone: deleted, and nothing left
// that references data or holds it (batches, readers, writers, producers);
// the frontiers stay, so a late handle's error can say where the shard
// stood. Held (naming them) while critical readers, a sink's hold, remain:
// they are released first (`shard release`), or dropped too with `force`.
// Unchanged (false) on a tombstone. revive() turns a tombstone into the
// empty state of the next incarnation (false if it is not a tombstone).
[[nodiscard]] Result<bool> bury(ShardState& state, bool force);
bool revive(ShardState& state);

// The oldest version any live reader may still read: the least seqno hold
// of the leased readers, or the state's own seqno. Garbage collection keeps
// everything versions at or after it reference.
SeqNo seqno_since(const ShardState& state);

// Producers. A producer id matches [A-Za-z0-9._-]{1,128}.
[[nodiscard]] Status validate_producer_id(std::string_view id);

// Where records of `producer` numbered from `first` stand against the
// state: the next ones it expects (kNext), or some already committed
// (kDuplicate: those below `expected`), or a gap before them (kGap: the
// shard expects `expected`; an unknown producer starts at 0), or a new
// producer when the shard already keeps `max_producers` (kFull; 0 means
// no limit).
struct ProducerCheck {
  enum class Verdict : std::uint8_t { kNext, kDuplicate, kGap, kFull };
  Verdict verdict = Verdict::kNext;
  std::uint64_t expected = 0;  // the sequence number the shard expects next
};
ProducerCheck check_producer(const ShardState& state, std::string_view producer,
                             std::uint64_t first, std::size_t max_producers);

struct AppendRequest {
  std::string_view writer_id;
  std::string_view idempotency_token;
  Frontier expected_upper;
  Frontier new_upper;
  // The parts of every batch of the call, each carrying its batch's
  // registered range. They become one HollowBatch [expected, new_upper).
  std::span<const PartRef> parts;
  // The parts form one sorted run (the call's one batch is ordered): the
  // HollowBatch is registered ordered.
  bool ordered = false;
  // Extends the writer's lease when nonzero.
  std::uint64_t lease_expires_ms = 0;
  // Idempotent producers' records in this append, in commit order. Each
  // range must be kNext for check_producer on the state as the ranges
  // before it leave it; the producer then stands at its `last`, expiring at
  // producer_expires_ms.
  std::span<const ProducerRange> producers;
  std::uint64_t producer_expires_ms = 0;
  std::size_t max_producers = 0;
  // The writer was registered (by the handle appending): if it is gone, its
  // lease expired, which is LeaseExpired rather than InvalidUsage.
  bool writer_registered = false;
};

enum class AppendOutcome : std::uint8_t {
  kApplied,           // the state now holds the parts and the new upper
  kAlreadyCommitted,  // this token committed earlier: nothing to change
};

// compare_and_append as a transition, with every rule of an append:
// unknown writer is InvalidUsage (LeaseExpired when it was registered); a
// part written by a writer that is gone is LeaseExpired (garbage
// collection may have deleted it: the batch must be built again); an upper that is not
// `expected_upper` is UpperMismatch{expected, current}; a producer range that does not continue its
// producer's sequence is SequenceMismatch (nothing changes: the caller re-checks its records
// against the state and drops or fails the ones that are not next). The request's shape is checked
// first by validate_append_shape.
[[nodiscard]] Result<AppendOutcome> apply_append(ShardState& state, const AppendRequest& request);

// Checks an append's shape without a state: lower <= upper, an empty
// interval carries no data, and every batch lies in [expected, new_upper).
[[nodiscard]] Status validate_append_shape(Frontier expected_upper, Frontier new_upper,
                                           std::span<const Description> batches, bool has_data);

std::unexpected<Error> upper_mismatch(Frontier expected, Frontier current);

}  // namespace tidemark
