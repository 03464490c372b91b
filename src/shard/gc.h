// Garbage collection of one shard: the parts and rollups no reader can
// reach any more are deleted, and the consensus versions before them
// truncated.
//
// collect_garbage:
//   1. drops expired leases (committed only if any expired);
//   2. lists the shard's parts and rollups, THEN reads the head state: a
//      writer that uploaded a listed part registered before the listing,
//      so it is in the head unless it is gone for good;
//   3. folds every retained version, oldest first, into the set of parts
//      referenced at or after seqno_since (live) and before it (retired);
//   4. deletes listed parts that are retired and not live, and parts no
//      retained version references whose writer is not in the head (crash
//      orphans); then truncates consensus below the rollup seqno_since's
//      version starts from; then deletes the rollups below that one.
// That order makes a pass that dies midway harmless: parts go while the
// versions that show them retired are still there, and the oldest
// retained version always finds its rollup. The next pass finishes.
//
// Thread-safety: collect_garbage may run concurrently with itself and with
// compact_shard (compactor.h) in any number of threads and processes; lost
// races cost work, never data.
#pragma once

#include <functional>

#include "shard/context.h"
#include "tidemark/client.h"

namespace tidemark {

// `stop` (when given) is asked between steps of deletes: once it returns
// true the pass ends (what is left, the next pass deletes).
[[nodiscard]] Result<GcReport> collect_garbage(ShardContext& context,
                                               const std::function<bool()>& stop = {});

}  // namespace tidemark
