// How a ShardState is stored: full states and diffs in binary (formats 3
// to 8), the rollups a chain of diffs starts from, and the registry of
// shard names.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shard/state.h"
#include "tidemark/error.h"
#include "tidemark/location.h"

namespace tidemark {

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
// Decoding validates every field and the invariants of a valid state
// (state.h); a malformed
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

// The registry of shard names (registry_consensus_key).
std::string encode_registry(const std::vector<std::string>& names);
[[nodiscard]] Result<std::vector<std::string>> decode_registry(std::string_view data);

}  // namespace tidemark
