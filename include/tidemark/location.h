// Blob and Consensus: the two places a shard lives.
//
// Blob is a durable key -> bytes store for immutable parts and rollups.
// Consensus is a linearizable log of versions per key, advanced only by
// compare_and_set, holding each shard's state. Backends:
//   Blob:      file (embedded default), mem (tests), s3 (scale-out)
//   Consensus: sqlite (embedded default), mem (tests), postgres (scale-out)
// Every backend passes the same conformance suite, installed with the
// headers for backends of your own (tidemark/testing/conformance.h).
//
// Errors: a failed call returns Determinate (certainly not applied) or
// Indeterminate (may have applied). A backend never reports success or a
// definite failure that it does not know.
//
// Thread-safety: every implementation is safe for concurrent use from many
// threads without external synchronization. The file and sqlite backends
// are also safe for several processes sharing one data directory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tidemark/error.h"

namespace tidemark {

class Blob {
 public:
  Blob() = default;
  Blob(const Blob&) = delete;
  Blob& operator=(const Blob&) = delete;
  virtual ~Blob() = default;

  // The whole object, or nullopt when there is none.
  [[nodiscard]] virtual Result<std::optional<std::string>> get(std::string_view key) = 0;

  // Bytes [offset, offset + length) of an object, shorter if the object ends
  // first. NotFound when there is no object.
  [[nodiscard]] virtual Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                                      std::uint64_t length) = 0;

  // Writes the whole object, replacing any previous one. Atomic (a reader
  // sees the old bytes or the new, never a mix) and durable when it returns.
  [[nodiscard]] virtual Status set(std::string_view key, std::string_view bytes) = 0;

  // Deletes the object; deleting an absent key succeeds.
  [[nodiscard]] virtual Status remove(std::string_view key) = 0;

  // Deletes every object named; durable when it returns, like remove(). A
  // backend may do it in fewer round trips or syncs than one remove() per
  // key (garbage collection deletes many objects at once). On an error
  // some may be deleted and some not.
  [[nodiscard]] virtual Status remove_many(const std::vector<std::string>& keys) {
    for (const std::string& key : keys) {
      if (auto removed = remove(key); !removed) return removed;
    }
    return {};
  }

  // Calls `visit(key, size)` for every object whose key starts with
  // `prefix`, in no particular order.
  [[nodiscard]] virtual Status list(
      std::string_view prefix,
      const std::function<void(std::string_view key, std::uint64_t size)>& visit) = 0;
};

using SeqNo = std::uint64_t;

struct VersionedData {
  SeqNo seqno = 0;
  std::string data;
  bool operator==(const VersionedData&) const = default;
};

enum class CasOutcome : std::uint8_t { kCommitted, kExpectationMismatch };

// One compare_and_set of a batch (Consensus::compare_and_set_many).
struct CasRequest {
  std::string key;
  std::optional<SeqNo> expected;
  VersionedData next;
};

// A hint from a Consensus backend that a key may have changed
// (Consensus::subscribe_change_hints). Only a hint: it may be spurious,
// repeated or late, and the subscriber reads the key to learn its state.
struct ChangeHint {
  enum class Kind : std::uint8_t {
    // A compare_and_set of `key` committed, in this process or another;
    // `seqno`, when set, is the version it wrote.
    kKey,
    // Any key may have changed: the hint channel was (re)connected, and
    // hints sent while it was down are lost, or hints were dropped to keep
    // the queue bounded. The channel is healthy from here on.
    kAll,
    // The hint channel is down: until the next kAll, changes give no hint.
    kLost,
  };
  Kind kind = Kind::kKey;
  std::string key;
  std::optional<SeqNo> seqno;
};

class Consensus {
 public:
  Consensus() = default;
  Consensus(const Consensus&) = delete;
  Consensus& operator=(const Consensus&) = delete;
  virtual ~Consensus() = default;

  // The latest version under `key`, or nullopt when there is none.
  [[nodiscard]] virtual Result<std::optional<VersionedData>> head(std::string_view key) = 0;

  // Appends `next` if the latest seqno is `expected` (nullopt: no version
  // yet). A lost race is kExpectationMismatch, not an error. Durable when
  // it returns kCommitted.
  // REQUIRES: next.seqno > expected (when expected is set); else InvalidUsage.
  [[nodiscard]] virtual Result<CasOutcome> compare_and_set(std::string_view key,
                                                           std::optional<SeqNo> expected,
                                                           VersionedData next) = 0;

  // Up to `limit` versions with seqno >= from, in increasing seqno order.
  [[nodiscard]] virtual Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                                                std::size_t limit) = 0;

  // The latest seqno under each key (nullopt: none), in the keys' order.
  // The default asks head() for each; a backend may read them all at once.
  [[nodiscard]] virtual Result<std::vector<std::optional<SeqNo>>> head_seqnos(
      const std::vector<std::string>& keys);

  // Deletes versions with seqno < `seqno` and returns how many it deleted.
  // REQUIRES: seqno <= the head's seqno; else InvalidUsage.
  [[nodiscard]] virtual Result<std::size_t> truncate(std::string_view key, SeqNo seqno) = 0;

  // Several compare_and_sets, applied in order as if one after another,
  // each landing or not on its own (a mismatch or an invalid request does
  // not stop the others): one result per request, in order. Not atomic
  // together, but a backend may commit them in one transaction, so that
  // many small writes (lease renewals) cost one durable commit. The
  // default calls compare_and_set for each.
  [[nodiscard]] virtual std::vector<Result<CasOutcome>> compare_and_set_many(
      const std::vector<CasRequest>& requests);

  // truncate() for each (key, seqno), in order, each on its own, with the
  // same batching freedom as compare_and_set_many. The default calls
  // truncate for each.
  [[nodiscard]] virtual std::vector<Result<std::size_t>> truncate_many(
      const std::vector<std::pair<std::string, SeqNo>>& truncations);

  // Optional: hints that keys changed, from whichever process changed them
  // (PostgreSQL's LISTEN/NOTIFY), so that a watcher need not poll quickly.
  // Calls `on_hint` for each hint (ChangeHint above) until
  // unsubscribe_change_hints(id), from a thread of the backend's: it must
  // be quick and must not block or call back into the backend. The first
  // hint is kAll once the channel is up (until then changes give none).
  // nullopt when the backend offers no hints (the default: SQLite and
  // memory backends, whose other processes, if any, are seen by polling).
  [[nodiscard]] virtual std::optional<std::uint64_t> subscribe_change_hints(
      std::function<void(const ChangeHint&)> on_hint);
  // After it returns `on_hint` is not called again, except by a call
  // already in progress on another thread. Unknown ids are ignored.
  virtual void unsubscribe_change_hints(std::uint64_t id);
};

// Opens a backend by URL:
//   blob:      file:///abs/dir, mem://,
//              s3://bucket/prefix?endpoint=http://host:port[&NAME=VALUE...]
//              (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY;
//              objects addressed path-style, {endpoint}/{bucket}/{key}).
//              Parameters: endpoint (required: http[s]://host[:port][/path]),
//              region (SigV4 signing region, default us-east-1),
//              multipart_threshold (default 16MiB, at most 5GiB),
//              part_size (default 8MiB, 5MiB to 5GiB), list_page_size
//              (1 to 1000, default 1000), list_version (2, the default, or
//              1 for servers whose ListObjectsV2 paging is broken),
//              max_attempts (tries per request, 1 to 20, default 8),
//              stall_timeout (seconds without progress before a transfer
//              is retried, 1 to 3600, default 30), call_timeout (seconds
//              after which a call starts no new attempt, 1 to 3600,
//              default 60). Sizes are bytes or units such as "8MiB".
//   consensus: sqlite:///abs/path.db, mem://,
//              postgres://user:password@host:port/db (or postgresql://)
// An unknown scheme or a malformed URL is InvalidUsage. postgres:// connects
// (and creates its tables) here: an unreachable server is Determinate. s3://
// does no I/O until the first call.
[[nodiscard]] Result<std::shared_ptr<Blob>> open_blob(std::string_view url);
[[nodiscard]] Result<std::shared_ptr<Consensus>> open_consensus(std::string_view url);

// The pair a shard lives in.
struct Location {
  std::shared_ptr<Blob> blob;
  std::shared_ptr<Consensus> consensus;
};

}  // namespace tidemark
