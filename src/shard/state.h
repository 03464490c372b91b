// ShardState: everything consensus knows about one shard, and the keys it,
// its parts and its rollups are stored under.
//
// A state is versioned by the SeqNo of the consensus entry that holds it.
// Every change is a pure function of the previous state (transitions.h; no
// I/O, no clock), committed by ShardMachine with Consensus::compare_and_set
// and re-applied on a lost race. Keeping transitions pure is what makes
// that retry safe. How a state is stored is state_codec.h; which batches
// compaction merges is spine.h. This header ends by including those three,
// so a caller of state.h has all of them.
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
#include <string>
#include <string_view>
#include <vector>

#include "tidemark/batch.h"
#include "tidemark/client.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/location.h"

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

// validate_shard_name: tidemark/client.h.

// The registry of shard names, one consensus key for the whole location
// (its encoding: state_codec.h).
std::string registry_consensus_key();

}  // namespace tidemark

// Each includes this header; a caller of state.h gets them all.
#include "shard/spine.h"        // IWYU pragma: export
#include "shard/state_codec.h"  // IWYU pragma: export
#include "shard/transitions.h"  // IWYU pragma: export
