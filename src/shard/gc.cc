// collect_garbage: see src/shard/gc.h for the rules and why they are safe.
#include "shard/gc.h"

#include <set>
#include <tuple>
#include <unordered_set>

#include "shard/state.h"
#include "util/clock.h"
#include "util/try.h"

namespace tidemark {
namespace {

// How many versions one scan reads while folding.
constexpr std::size_t kScanPage = 256;

// Part keys referenced by some version as blob parts, split at
// seqno_since. An inline part is read from the state, never fetched: an
// object under its key (the copy an append wrote when the state had no
// room, before a retry committed the part inline after all) is no
// reference's, and goes as an orphan once its writer is gone. Copies of a
// part list share an identity, so each list is walked once per side; the
// lists are kept alive so an identity is never reused while it counts.
class PartsSeen {
 public:
  explicit PartsSeen(SeqNo since) : since_(since) {}

  void visit(const ShardState& state) {
    const bool live = state.seqno >= since_;
    auto& keys = live ? live_ : retired_;
    auto& seen = live ? seen_live_ : seen_retired_;
    for (const HollowBatch& batch : state.batches) {
      if (batch.parts.empty() || !seen.insert(batch.parts.identity()).second) continue;
      kept_.push_back(batch.parts);
      for (const PartRef& part : batch.parts) {
        if (!part.is_inline()) keys.insert(part.key);
      }
    }
  }

  bool live(const std::string& key) const { return live_.contains(key); }
  bool retired(const std::string& key) const { return retired_.contains(key); }

 private:
  const SeqNo since_;
  std::unordered_set<std::string> live_, retired_;
  std::unordered_set<const void*> seen_live_, seen_retired_;
  std::vector<PartList> kept_;
};

// Rollups ordered by seqno, then id.
struct RollupOrder {
  bool operator()(const RollupRef& a, const RollupRef& b) const {
    return std::tie(a.seqno, a.id) < std::tie(b.seqno, b.id);
  }
};

Error retry_later(const std::string& shard, std::string what) {
  return Error{ErrorKind::kDeterminate,
               "garbage collection of shard " + shard + ": " + what + "; retry", std::nullopt,
               std::nullopt};
}

}  // namespace

Result<GcReport> collect_garbage(ShardContext& context, const std::function<bool()>& stop) {
  GcReport report;
  const std::string& shard = context.name;
  Blob& blob = *context.location.blob;
  Consensus& consensus = *context.location.consensus;
  const std::string key = shard_consensus_key(shard);

  // 1. Expired writers and readers leave the state first.
  TM_TRY(context.machine->apply([&](ShardState& state) -> Result<TransitionResult> {
    return expire_leases(state, wall_clock_millis()) ? TransitionResult::kWrite
                                                     : TransitionResult::kUnchanged;
  }));

  // 2. List, then read the head (the order matters: see gc.h).
  const std::string part_prefix = shard_part_prefix(shard);
  const std::string rollup_prefix = shard_rollup_prefix(shard);
  std::vector<std::string> parts, rollups;
  TM_TRY(blob.list(part_prefix, [&](std::string_view k, std::uint64_t) { parts.emplace_back(k); }));
  TM_TRY(blob.list(rollup_prefix,
                   [&](std::string_view k, std::uint64_t) { rollups.emplace_back(k); }));
  TM_ASSIGN(StatePtr head, context.machine->fetch());
  if (head->seqno == 0) return report;  // never written: no writer ever was

  // 3. Fold every retained version, oldest first. The oldest is a full
  // state, or the first version of a chain: the diff after it names the
  // rollup (its id) that holds it.
  TM_ASSIGN(auto oldest, consensus.scan(key, 0, 2));
  if (oldest.empty()) return std::unexpected(retry_later(shard, "its versions were truncated"));
  const SeqNo first = oldest.front().seqno;
  const SeqNo since = std::max(seqno_since(*head), first);
  ShardState current;
  if (is_full_version(oldest.front().data)) {
    TM_ASSIGN(current, decode_state(shard, oldest.front()));
  } else {
    if (oldest.size() < 2 || oldest[1].seqno != first + 1) {
      return std::unexpected(retry_later(shard, "its versions were truncated"));
    }
    TM_ASSIGN(RollupRef rollup, version_rollup(shard, oldest[1]));
    if (rollup.seqno != first) {
      return corruption("state of shard " + shard + ": the oldest version, " +
                        std::to_string(first) + ", is not the start of a chain");
    }
    auto loaded = context.machine->load_rollup(rollup);
    if (!loaded && loaded.error().is(ErrorKind::kNotFound)) {
      return std::unexpected(retry_later(shard, "another pass truncated it meanwhile"));
    }
    if (!loaded) return std::unexpected(loaded.error());
    current = std::move(*loaded);
  }
  PartsSeen seen(since);
  seen.visit(current);
  RollupRef keep_from{first, current.rollup_id};  // the rollup the version at `since` starts from
  // Every rollup a retained version names: the others at or after keep_from
  // were written by compare_and_sets that lost (see below).
  std::set<RollupRef, RollupOrder> named;
  for (SeqNo next = first + 1; next <= head->seqno;) {
    TM_ASSIGN(auto versions, consensus.scan(key, next, kScanPage));
    if (versions.empty() || versions.front().seqno != next) {
      return std::unexpected(retry_later(shard, "its versions were truncated"));
    }
    for (const VersionedData& version : versions) {
      if (version.seqno > head->seqno) break;
      if (version.seqno != next) {
        return corruption("state of shard " + shard + " has a gap before seqno " +
                          std::to_string(version.seqno));
      }
      TM_ASSIGN(current, apply_version(shard, &current, version));
      seen.visit(current);
      TM_ASSIGN(RollupRef rollup, version_rollup(shard, version));
      if (version.seqno == since) keep_from = rollup;
      named.insert(std::move(rollup));
      ++next;
    }
  }

  // 4. Parts: retired and no longer live, or orphans of writers gone.
  std::vector<std::string> doomed;
  for (std::string& part : parts) {
    if (seen.live(part)) {
      ++report.parts_live;
    } else if (seen.retired(part)) {
      ++report.parts_deleted;
      doomed.push_back(std::move(part));
    } else if (std::string_view writer = part_key_writer(part, part_prefix);
               !writer.empty() && !head->writers.contains(writer)) {
      ++report.orphans_deleted;
      doomed.push_back(std::move(part));
    }
  }
  // A few at a time, so a pass stops soon when asked (under blob latency
  // each delete is a round trip). Stopping here is safe: the next pass
  // finds the rest.
  constexpr std::size_t kDeleteStep = 16;
  for (std::size_t i = 0; i < doomed.size(); i += kDeleteStep) {
    if (stop && stop()) return report;
    const auto end =
        doomed.begin() + static_cast<std::ptrdiff_t>(std::min(doomed.size(), i + kDeleteStep));
    TM_TRY(blob.remove_many(
        std::vector<std::string>(doomed.begin() + static_cast<std::ptrdiff_t>(i), end)));
  }
  if (stop && stop()) return report;
  // Versions below the rollup the chain from `since` starts at, and only
  // then the rollups below it: the oldest retained version must always
  // find its rollup (a pass killed between the two leaves stale rollups,
  // which the next pass deletes).
  if (keep_from.seqno > first) {
    TM_ASSIGN(report.versions_truncated, consensus.truncate(key, keep_from.seqno));
  }
  // Rollups below keep_from, and rollups that no version names at a seqno
  // below the head: a compare_and_set that names a rollup at seqno r
  // expects r as the head, so once the head is past r, a rollup at r that
  // no version names never will be (its writer lost the race). One at the
  // head's seqno may still be named by a write in flight: it stays.
  doomed.clear();
  for (std::string& rollup : rollups) {
    std::optional<RollupRef> ref = parse_rollup_key(rollup, rollup_prefix);
    if (!ref) continue;
    const bool below = ref->seqno < keep_from.seqno;
    const bool lost = ref->seqno < head->seqno && !named.contains(*ref) && !(*ref == keep_from);
    if (below || lost) doomed.push_back(std::move(rollup));
  }
  TM_TRY(blob.remove_many(doomed));
  report.rollups_deleted = doomed.size();
  return report;
}

}  // namespace tidemark
