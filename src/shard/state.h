// ShardState: everything consensus knows about one shard, and the pure
// transitions that change it.
//
// A state is versioned by the SeqNo of the consensus entry that holds it.
// Every change is a pure function of the previous state (no I/O, no clock),
// committed by ShardMachine with Consensus::compare_and_set and re-applied
// on a lost race. Keeping transitions pure is what makes that retry safe.
//
// Invariants of a valid state:
//   - since <= upper;
//   - batches are in time order with disjoint increasing descriptions below
//     upper: batches[i].desc.upper <= batches[i+1].desc.lower. Each is one
//     compare_and_append that carried data, or the compaction of a run of
//     adjacent ones (description: the first's lower to the last's upper);
//   - a part's registered range lies within its batch's description.
//
// Leases: writers and leased readers expire when their lease runs out, and
// producers when they have committed nothing for their expiry time.
// Every transition given a clock first drops expired entries; garbage
// collection treats a writer absent from the state as gone for good (a
// writer id is never registered twice), so its unreferenced parts are
// orphans.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tidemark/batch.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/location.h"
#include "tidemark/write.h"

namespace tidemark {

// An immutable, shared list of part references. Every transition copies
// the state; with this, copying a batch copies a pointer, not its parts, and
// comparing two copies is a pointer comparison.
class PartList {
 public:
  PartList() = default;
  explicit PartList(std::vector<PartRef> parts)
      : parts_(std::make_shared<const std::vector<PartRef>>(std::move(parts))) {}

  const std::vector<PartRef>& get() const { return parts_ ? *parts_ : no_parts(); }
  std::vector<PartRef>::const_iterator begin() const { return get().begin(); }
  std::vector<PartRef>::const_iterator end() const { return get().end(); }
  std::size_t size() const { return get().size(); }
  bool empty() const { return get().empty(); }
  const PartRef& operator[](std::size_t i) const { return get()[i]; }
  // Copies of a list share one identity (nullptr for an empty list).
  const void* identity() const { return parts_.get(); }

  friend bool operator==(const PartList& a, const PartList& b) {
    return a.parts_ == b.parts_ || a.get() == b.get();
  }

 private:
  static const std::vector<PartRef>& no_parts() {
    static const std::vector<PartRef> kEmpty;
    return kEmpty;
  }
  std::shared_ptr<const std::vector<PartRef>> parts_;
};

// A batch as the state registers it: its description and its parts, with
// none of their data.
struct HollowBatch {
  Description desc;
  PartList parts;
  // The parts form one sorted run (each part's updates sort before the
  // next part's): compaction output. A merge reads such a batch with one
  // part open at a time.
  bool ordered = false;

  std::uint64_t count() const;          // updates, over its parts
  std::uint64_t bytes() const;          // encoded bytes, over its parts
  std::uint64_t payload_bytes() const;  // uncompressed payload bytes, over its parts
  bool operator==(const HollowBatch&) const = default;
};

struct WriterState {
  // Idempotency token of this writer's last committed append: a retry of an
  // append whose outcome was indeterminate finds its own token here and
  // knows it already committed.
  std::string last_token;
  std::uint64_t lease_expires_ms = 0;  // wall-clock ms
  // The process that registered it (ClientOptions::owner), for people
  // reading `shard inspect`; empty in states written before owners were
  // kept (formats 3 to 6).
  std::string owner;
  bool operator==(const WriterState&) const = default;
};

// A reader's hold on history: the shard's since never passes `since` while
// the reader lives. A leased reader lives until its lease expires (it
// heartbeats to extend it); a critical reader (lease_expires_ms == 0) has no
// lease and lives until it is removed, across restarts of its process.
//
// A leased reader also holds a seqno: the oldest state version it may still
// read parts from. Garbage collection keeps every part referenced by a
// version at or above the least such hold. A critical reader holds no
// seqno (it reads through leased readers of its own).
struct ReaderState {
  Frontier since;
  std::uint64_t lease_expires_ms = 0;  // wall-clock ms; 0 for critical
  SeqNo seqno = 0;                     // leased: seqno hold; critical: 0
  std::string owner;                   // as WriterState::owner

  bool critical() const { return lease_expires_ms == 0; }
  bool operator==(const ReaderState&) const = default;
};

// What an idempotent producer has committed (managed appends that
// name a producer). A producer numbers its records 0, 1, 2, ... in the
// order it sends them; every record up to `sequence` is committed, and
// none after it. Updated by the same compare_and_append that commits the
// records, so the two never disagree. Dropped once `expires_ms` passes
// with nothing committed (each commit pushes it on).
struct ProducerState {
  std::uint64_t sequence = 0;    // the highest sequence number committed
  Time time = 0;                 // the commit time of that record
  std::uint64_t expires_ms = 0;  // wall-clock ms
  bool operator==(const ProducerState&) const = default;
};

struct ShardState {
  std::string name;
  SeqNo seqno = 0;  // of the consensus version holding this state
  Frontier upper = Frontier::at(0);
  Frontier since = Frontier::at(0);
  std::vector<HollowBatch> batches;
  std::map<std::string, WriterState, std::less<>> writers;
  std::map<std::string, ReaderState, std::less<>> readers;
  std::map<std::string, ProducerState, std::less<>> producers;
  // Deleting a shard leaves a tombstone: its last state, `deleted`, with no
  // batches, readers, writers or producers, so a handle opened before the
  // delete fails cleanly instead of writing into nothing. Creating the name
  // again turns the tombstone into a fresh state with the next incarnation;
  // a handle remembers the incarnation it opened and refuses any other
  // (ShardMachine). Both change only in full versions, never in a diff.
  std::uint64_t incarnation = 0;
  bool deleted = false;
  // Not stored: the rollup this version's chain starts from (its seqno, its
  // own for a full state, and the id in its blob key), set by decode_state,
  // apply_version and ShardMachine::load_rollup. The machine names it in
  // the next diff it writes.
  SeqNo rollup = 0;
  std::string rollup_id;

  // Equal when what is stored is equal (`rollup` is bookkeeping).
  bool operator==(const ShardState& other) const {
    return name == other.name && seqno == other.seqno && upper == other.upper &&
           since == other.since && batches == other.batches && writers == other.writers &&
           readers == other.readers && producers == other.producers &&
           incarnation == other.incarnation && deleted == other.deleted;
  }
};

// The bytes of the inline parts (PartRef::data) the state holds.
std::uint64_t inline_bytes(const ShardState& state);

// The consensus key of a shard's state, and the blob prefix of its parts.
std::string shard_consensus_key(std::string_view shard);
std::string shard_part_prefix(std::string_view shard);
// A part's key names the writer that wrote it: <prefix><writer>_<random>.
std::string part_key(std::string_view shard, std::string_view writer_id);
// The writer named in a part key under `prefix`; empty if it names none.
std::string_view part_key_writer(std::string_view key, std::string_view prefix);
// Rollups: the full state at a seqno, stored in blob under a key made of
// the seqno and an id the writer draws at random: <seqno, 20 digits>-<id>.
// Every write of a rollup goes to a key of its own, and only the diff whose
// compare_and_set won names it, so no object is ever written twice and a
// reader never meets one being rewritten (some S3-compatible stores write
// in place: a rewritten key read mid-write was torn). An empty id is the
// key of format 4, which named rollups by seqno alone.
std::string shard_rollup_prefix(std::string_view shard);
std::string rollup_key(std::string_view shard, SeqNo seqno, std::string_view id);
// The seqno and id of a rollup key under `prefix`; nullopt if it is not one.
struct RollupRef {
  SeqNo seqno = 0;
  std::string id;
  bool operator==(const RollupRef&) const = default;
};
std::optional<RollupRef> parse_rollup_key(std::string_view key, std::string_view prefix);

// Shard names match [A-Za-z0-9._-]{1,128}; ".", ".." and names starting
// with ".tmp-" (reserved for blob files being written) are refused too.
[[nodiscard]] Status validate_shard_name(std::string_view name);

// How states are stored. Each consensus version is either a full state
// (the first version of a shard, and the first of each later chain when
// the state is small) or a diff against the version just before it, which
// names the rollup (seqno r, id) its chain starts from. The full state at
// r is the consensus version r itself when that is a full state (its id is
// then empty), else the blob object rollup_key(shard, r, id). Between
// rollups a consensus write is a diff, so what a compare_and_set writes
// does not grow with the shard; every kRollupInterval versions the machine
// starts a new chain, so reading a state reads one full state and folds at
// most that many diffs. A small state (ClientOptions::
// inline_rollup_max_bytes) is written as a full version, in the commit
// itself; a larger one goes to blob first.
inline constexpr SeqNo kRollupInterval = 128;

// A full state: binary, with a leading format version (7; 3 and 5 are read
// too). Format 7 added the incarnation, the tombstone flag and the owners of
// readers and writers.
// Decoding validates every field and the invariants above; a malformed
// state is a Corruption error naming the shard and seqno.
std::string encode_state(const ShardState& state);
[[nodiscard]] Result<ShardState> decode_state(std::string_view shard, const VersionedData& data);

// A diff taking `before` to `after` (format 8, with owners; 4 and 6 are
// read too): frontiers, writers, readers and producers changed or removed,
// and the batches as one splice (common prefix and suffix kept). The
// incarnation and the tombstone flag are not in diffs: a change of either
// is written as a full version (diff_can_carry).
std::string encode_diff(const ShardState& before, const ShardState& after, const RollupRef& rollup);

bool is_full_version(std::string_view data);
// False when `after` differs from `before` in what only a full version
// carries (the incarnation, the tombstone flag).
bool diff_can_carry(const ShardState& before, const ShardState& after);
// The full state a version's chain starts from (its own seqno and no id for
// a full state).
[[nodiscard]] Result<RollupRef> version_rollup(std::string_view shard, const VersionedData& data);
// The state a version holds: a full state decoded, or a diff applied to
// `before`, which must be the state at seqno data.seqno - 1.
[[nodiscard]] Result<ShardState> apply_version(std::string_view shard, const ShardState* before,
                                               const VersionedData& data);

// The registry of shard names, one consensus key for the whole location.
std::string registry_consensus_key();
std::string encode_registry(const std::vector<std::string>& names);
[[nodiscard]] Result<std::vector<std::string>> decode_registry(std::string_view data);

// --- Pure transitions -------------------------------------------------------

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

// --- Compaction (the spine) ----------------------------------------------

// What a read of the whole shard merges at once (MergeCursor inputs): one
// per part of an unordered batch, one per ordered batch (its parts open
// one at a time). Each holds an open block while the read runs, so this is
// what the write stall (WriteHandle::wait_for_compaction) keeps bounded.
std::size_t read_inputs(const ShardState& state);
//
// Batches are kept in geometric size classes: a merge is due when some
// batch b[i] is at most kSpineGrowth times the total size of the batches
// after it; it takes b[i] and every batch after it. Once merged, sizes at
// least triple from the newest batch back, so n appends of similar size
// leave O(log n) batches, and each byte is rewritten O(log n) times.
//
// Sizes are uncompressed payload bytes (HollowBatch::payload_bytes), what
// a merge decodes and encodes again. Encoded sizes misled it: a part of
// one small update is mostly its fixed framing, while in a merged part an
// update that compresses well costs a few bytes, so one append weighed as
// much as dozens of merged updates and the merged batch was rewritten with
// every few appends (about 850 updates per merge and over 100 rewrites of
// each update, for 100-byte appends of one repeated character).
//
// Small merges wait for width: a due merge whose run totals less than
// kSpineMinMergeBytes waits until it spans kSpineMinMergeBatches batches.
// Without this, a stream of tiny appends merged its tail on nearly every
// append (each merge a part write, a CaS and later a delete). So the spine
// holds at most kSpineMinMergeBatches - 1 extra small batches at its tail.
inline constexpr std::uint64_t kSpineGrowth = 2;
inline constexpr std::uint64_t kSpineMinMergeBytes = 256 << 10;
inline constexpr std::size_t kSpineMinMergeBatches = 8;
// Whatever the sizes and widths, a spine whose whole-shard read would merge
// more than this many inputs (read_inputs) merges its shortest tail that
// brings them to half of it: otherwise a tail of wide loose batches (a
// busy appender's commits) could pass the write stall's trigger
// (WriteHandle::kStallReadInputs) with no merge due, and every commit would
// wait out the stall's 10 s.
inline constexpr std::size_t kSpineMaxReadInputs = 48;

// A run of adjacent batches [begin, end) to merge into one.
struct MergeRequest {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// The merge the spine needs next: the oldest batch that breaks the size
// rule (and whose run is wide or big enough), with every batch after it,
// or the tail kSpineMaxReadInputs asks for. nullopt when the spine is in
// shape. Once the state's inline parts reach
// `inline_drain_bytes`, the oldest batch holding one and every batch after
// it instead (a merge writes its output to the blob store), even when that
// is a single batch.
inline constexpr std::uint64_t kNoInlineDrain = UINT64_MAX;
std::optional<MergeRequest> next_merge(const ShardState& state,
                                       std::uint64_t inline_drain_bytes = kNoInlineDrain);

enum class CompactionOutcome : std::uint8_t {
  kApplied,         // the inputs were replaced by the output
  kAlreadyApplied,  // the output is registered already (a retried write)
  kInputsGone,      // the inputs are no longer all there: nothing changed
};

// Replaces `inputs` (adjacent batches, exactly as the compactor read them)
// with `output`, if they are still in the state. The writer must be live
// (its parts would otherwise be orphans GC may delete): NotFound if not.
// An output of inline parts only has no blob object to orphan: its
// `writer_id` may be empty (a merge that registered no writer).
// REQUIRES: output.desc spans the inputs' descriptions.
[[nodiscard]] Result<CompactionOutcome> apply_compaction(ShardState& state,
                                                         std::string_view writer_id,
                                                         std::span<const HollowBatch> inputs,
                                                         const HollowBatch& output,
                                                         std::uint64_t now_ms);

}  // namespace tidemark
