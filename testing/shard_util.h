// Helpers shared by the shard tests: a reference model of a shard's
// collection and snapshot/listen collectors (and, from forwarding.h, the
// Blob and Consensus decorator bases).
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "location/forwarding.h"
#include "tidemark/client.h"
#include "tidemark/location.h"
#include "tidemark/read.h"
#include "tidemark/update.h"
#include "util/try.h"

namespace tidemark::testing {

// (key, value) -> diff, the consolidated collection at some as_of.
using Collection = std::map<std::pair<std::string, std::string>, Diff>;

// The reference model: a plain multiset of updates.
inline Collection model_at(const std::vector<Update>& updates, Time as_of) {
  Collection out;
  for (const Update& u : updates) {
    if (u.time <= as_of) out[{u.key, u.value}] += u.diff;
  }
  std::erase_if(out, [](const auto& entry) { return entry.second == 0; });
  return out;
}

// Reads the rest of a cursor, checking that rows come sorted and
// consolidated.
inline Result<Collection> read_cursor(SnapshotCursor& cursor) {
  Collection out;
  std::optional<std::pair<std::string, std::string>> previous;
  for (;;) {
    TM_ASSIGN(auto row, cursor.next());
    if (!row) break;
    std::pair<std::string, std::string> kv{std::string(row->key), std::string(row->value)};
    if (previous && !(*previous < kv)) return corruption("snapshot rows out of order");
    if (row->diff == 0) return corruption("snapshot emitted a zero diff");
    previous = kv;
    out[kv] = row->diff;
  }
  return out;
}

// Reads a whole snapshot, checking that rows come sorted and consolidated.
inline Result<Collection> read_snapshot(Shard& shard, Time as_of) {
  TM_ASSIGN(SnapshotCursor cursor, shard.snapshot(as_of));
  return read_cursor(cursor);
}

// A whole snapshot read under a leased reader's own lease.
inline Result<Collection> read_snapshot(ReadHandle& reader, Time as_of) {
  TM_ASSIGN(SnapshotCursor cursor, reader.snapshot(as_of));
  return read_cursor(cursor);
}

struct ListenOutput {
  std::vector<Update> updates;
  std::vector<Frontier> progress;
};

// Listens until the listener is done (it must have an `until`).
inline Result<ListenOutput> read_listen(Listener& listener) {
  ListenOutput out;
  for (;;) {
    TM_ASSIGN(auto event, listener.next());
    if (!event) break;
    if (event->kind == ListenEvent::Kind::kProgress) {
      out.progress.push_back(event->progress);
    } else {
      out.updates.push_back(
          Update{std::string(event->key), std::string(event->value), event->time, event->diff});
    }
  }
  return out;
}

}  // namespace tidemark::testing
