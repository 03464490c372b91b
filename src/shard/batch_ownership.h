// BatchOwnership: who owns a Batch's parts, as compare_and_append learns
// it. A Batch deletes its parts when dropped while it owns them; once they
// are committed the shard owns them, and while the outcome of an append is
// unknown (Indeterminate) they must survive, as the shard may own them.
//
// Thread-safety: as the Batch's own.
#pragma once

#include "tidemark/batch.h"

namespace tidemark {

struct BatchOwnership {
  // The shard owns the parts now.
  static void committed(Batch& batch) { batch.state_ = Batch::OwnershipState::kCommitted; }
  // The append's outcome is unknown: the parts are never deleted by the batch.
  static void maybe_committed(Batch& batch) {
    batch.state_ = Batch::OwnershipState::kMaybeCommitted;
  }
};

}  // namespace tidemark
