// KafkaDestination: a sink's output as Kafka messages, exactly once
// (`kafka://host:port[,host:port]/topic`).
//
// Each interval [lower, upper) is one Kafka transaction of a transactional
// producer (librdkafka): the pairs' messages go to the topic (key: the key's
// JSON text; value: the envelope's; the time in a `tidemark-time` header),
// and the last message of the transaction is a progress record in the
// progress topic (default "<topic>-progress"):
//
//   key   the sink's id (also the producer's transactional.id)
//   value {"frontier": U, "topic": "<topic>", "offsets": [[partition, first, last], ...]}
//         and, for a part of a snapshot in progress,
//         "snapshot": {"as_of": T, "key_hex": "<hex of the key's bytes>",
//                      "key_pairs": n, "pairs": N}
//
// `offsets` are the data messages of this transaction, per partition (from
// the delivery reports), so an auditor can tell which messages a frontier
// covers. Both commit or neither does.
//
// Snapshots in parts: the snapshot is several transactions, each bounded by
// the sink (SinkOptions::snapshot_part_bytes and snapshot_part_interval, 64
// MiB or 60 s by default, so each part is well within
// transaction_timeout). Each part's progress record has "snapshot" (a
// SnapshotPosition: the pairs are written key by key in increasing key
// order, and the part ends after the key_pairs-th pair of the key
// key_hex, N pairs from the snapshot's start) and "frontier" 0: nothing is
// complete yet. The last part's record is {"frontier": as_of + 1, ...}
// without "snapshot", as a snapshot in one transaction has always been
// written (and a record without "snapshot" is read as it always was). A
// restarted sink finds the position in the last record and goes on after
// it, at the same as_of.
//
// What a read_committed consumer sees of the data topic meanwhile: a
// prefix of the snapshot in key order (all of a key's messages except,
// possibly, the last key's: a key whose diff fans out into many messages
// may be split between two transactions), growing one transaction at a
// time. The snapshot is complete when the progress record without
// "snapshot" (frontier as_of + 1) is committed; a consumer that needs a
// consistent state waits for it.
//
// Opening: init_transactions() first (which fences an older producer with
// the same id and aborts its open transaction), then the progress topic is
// read with isolation.level=read_committed to its end; the last record with
// this sink's key is the progress. A restarted sink resumes there.
//
// One sink per topic: the transactional id fences only a producer with the
// same id, so the runner claims the topic before open() (options.claim, a
// lease in the location's Consensus keyed by brokers and topic: see
// sink_claim.h) and commit() checks the claim right before
// commit_transaction (the transaction is aborted when it fails). Without a
// claim the caller promises that no other sink writes the topic.
//
// Ordering inside a commit: every data message is acknowledged (flush)
// before the progress record is produced. A real broker needs only the
// transaction for exactness; the flush also makes librdkafka's mock cluster
// exact, which keeps aborted transactions visible to every consumer: there
// a progress record is visible only when all its data is, so "committed"
// can be read as "has a progress record" and a data message counts only
// inside a progress record's offsets (what the Kafka tests check).
//
// Memory: the producer's queue is bounded by `queue_bytes`, reserved from
// the sink's MemoryPool for the destination's lifetime: half of it as
// librdkafka's queue.buffering.max.kbytes (payload bytes), the other half
// as queue.buffering.max.messages at kMessageOverheadBytes each (librdkafka's
// per-message bookkeeping). A full queue is backpressure: write() serves
// delivery reports and waits. Plus O(partitions) offsets and one encoded
// message.
//
// Transactions: each must finish within transaction_timeout (default 10
// minutes; a broker refuses more than its transaction.max.timeout.ms, 15
// minutes by default): intervals are committed every commit_interval, and
// a snapshot is cut in parts (above), however large it is.
//
// Errors: an unreachable cluster, or a topic that does not exist, is
// Determinate after operation_timeout. A failed delivery (librdkafka gives
// up on a message after message.timeout.ms, 5 minutes) or a transaction
// error that requires it aborts the open transaction (Determinate: nothing
// of it is visible). A commit whose outcome is unknown (a timeout, or a
// fatal error such as being fenced by another sink with the same id) is
// Indeterminate: a reopened destination reads the truth from the progress
// topic. A message over the producer's message.max.bytes (1 MB) is
// TooLarge.
//
// Cancellation: librdkafka's blocking calls take a timeout and cannot be
// interrupted, so with options.cancel each waits in slices (init, commit
// and abort_transaction resume where they were when called again after a
// timeout; flush and metadata requests are simply repeated) and gives up
// between two once cancelled: Determinate, or Indeterminate for a commit.
//
// Thread-safety: one sink uses a destination from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sink/destination.h"
#include "sink/destination_claim.h"
#include "sink/envelope.h"
#include "tidemark/memory_pool.h"
#include "util/cancel.h"

namespace tidemark {

struct KafkaAddress {
  std::string brokers;  // "host:port[,host:port]"
  std::string topic;
  std::string progress_topic;

  // kafka://host:port[,host:port]/topic[?progress_topic=NAME]; InvalidUsage
  // naming what is wrong otherwise.
  [[nodiscard]] static Result<KafkaAddress> parse(std::string_view url);
};

struct KafkaDestinationOptions {
  // The producer's transactional.id and the progress record's key. One
  // sink, one id: two running sinks with one id fence each other.
  std::string sink_id;
  // The pool the producer's queue is reserved from (unlimited if null).
  std::shared_ptr<MemoryPool> pool;
  // How long open() waits for the pool to have room for the queue; none:
  // as long as it takes. Past it, open() fails with Full naming the pool.
  std::optional<std::chrono::milliseconds> pool_wait;
  // Checked before each commit_transaction (none: unclaimed).
  std::shared_ptr<DestinationClaim> claim = nullptr;
  std::uint64_t queue_bytes = 16ull << 20;
  std::chrono::milliseconds transaction_timeout{600'000};
  std::chrono::milliseconds operation_timeout{30'000};
  // Once cancelled (the sink is deleted, the server stops), every blocking
  // call gives up within kCancelSliceMs (kafka_reader.h); none: never.
  std::shared_ptr<const Cancellation> cancel = nullptr;
  // Called with each error librdkafka reports and retries by itself (a
  // broker it cannot reach, a connection refused), "kafka: " and its text:
  // what a status can show while a call waits on it. Runs on librdkafka's
  // threads: must be quick and must not call the destination.
  std::function<void(const std::string&)> on_trouble = nullptr;
};

class KafkaDestination final : public SinkDestination {
 public:
  static constexpr std::uint64_t kMessageOverheadBytes = 512;

  // Reserves the queue's bytes, connects, fences older producers with the
  // same id, and reads the progress. Only json is a Kafka format.
  [[nodiscard]] static Result<std::unique_ptr<KafkaDestination>> open(
      const KafkaAddress& address, Envelope envelope, const KafkaDestinationOptions& options);
  ~KafkaDestination() override;  // an open transaction is aborted

  std::optional<Frontier> progress() const override;
  [[nodiscard]] Status begin(Frontier lower) override;
  [[nodiscard]] Status write(const DiffPair& pair) override;
  std::uint64_t open_bytes() const override;
  [[nodiscard]] Status commit(Frontier upper) override;
  std::uint64_t primary_key_violations() const override;
  bool commits_snapshot_in_parts() const override { return true; }
  std::optional<SnapshotPosition> snapshot_position() const override;
  [[nodiscard]] Status commit_snapshot_part(const SnapshotPosition& position) override;

 private:
  struct State;
  explicit KafkaDestination(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The value of a progress record, and its parse (Corruption if malformed).
struct KafkaProgressRecord {
  Frontier frontier;
  std::string topic;
  struct Range {
    std::int32_t partition = 0;
    std::int64_t first = 0;
    std::int64_t last = 0;
  };
  std::vector<Range> offsets;
  // Set on the parts of a snapshot in progress (frontier is then 0).
  std::optional<SnapshotPosition> snapshot;

  std::string to_json() const;
  [[nodiscard]] static Result<KafkaProgressRecord> parse(std::string_view text);
};

}  // namespace tidemark
