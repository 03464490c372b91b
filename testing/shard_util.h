// Helpers shared by the shard tests: a reference model of a shard's
// collection, snapshot/listen collectors, and Blob and Consensus decorator
// bases.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tidemark/client.h"
#include "tidemark/location.h"
#include "tidemark/read.h"
#include "tidemark/update.h"

namespace tidemark::testing {

// A Blob that forwards every call to `inner`; tests override the calls
// they watch or slow down.
class ForwardingBlob : public Blob {
 public:
  explicit ForwardingBlob(std::shared_ptr<Blob> inner) : inner_(std::move(inner)) {}
  Result<std::optional<std::string>> get(std::string_view key) override { return inner_->get(key); }
  Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                std::uint64_t length) override {
    return inner_->get_range(key, offset, length);
  }
  Status set(std::string_view key, std::string_view bytes) override {
    return inner_->set(key, bytes);
  }
  Status remove(std::string_view key) override { return inner_->remove(key); }
  // Forwarded whole: the default would turn an S3 blob's batched delete
  // into single ones.
  Status remove_many(const std::vector<std::string>& keys) override {
    return inner_->remove_many(keys);
  }
  Status list(std::string_view prefix,
              const std::function<void(std::string_view, std::uint64_t)>& visit) override {
    return inner_->list(prefix, visit);
  }

 private:
  std::shared_ptr<Blob> inner_;
};

// A Consensus that forwards every single call to `inner`; tests override the
// calls they watch, slow down or fail. The batched calls (head_seqnos,
// compare_and_set_many, truncate_many) keep Consensus's defaults, which go
// through this object's single calls, so an override of a single call sees
// them too; a test that watches a batch whole overrides it and forwards it
// to inner().
class ForwardingConsensus : public Consensus {
 public:
  explicit ForwardingConsensus(std::shared_ptr<Consensus> inner) : inner_(std::move(inner)) {}
  Result<std::optional<VersionedData>> head(std::string_view key) override {
    return inner_->head(key);
  }
  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    return inner_->compare_and_set(key, expected, std::move(next));
  }
  Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                          std::size_t limit) override {
    return inner_->scan(key, from, limit);
  }
  Result<std::size_t> truncate(std::string_view key, SeqNo seqno) override {
    return inner_->truncate(key, seqno);
  }

 protected:
  Consensus& inner() const { return *inner_; }

 private:
  std::shared_ptr<Consensus> inner_;
};

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
