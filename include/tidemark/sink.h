// Sinks: a shard's changes, exactly once, into a destination.
//
// A sink turns the shard's updates into diff pairs (DiffPair: for each key
// and time, the values it lost paired with the values it gained) and
// writes each pair as one message in an envelope:
//   upsert    {"time", "key", "value"}; value null when the key is gone
//   debezium  {"time", "key", "before", "after"}; a missing side is null
// as JSON lines or CSV rows in files, or as Kafka messages (key = the
// key's JSON text; an upsert delete is a tombstone).
//
// Destinations, by URL (SinkTarget::to):
//   file:///abs/dir          rolling files in a directory
//   s3://bucket/prefix?endpoint=http://host:port[&region=R&part_size=S]
//                            the same files as S3 objects (credentials from
//                            AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)
//   kafka://host:port[,host:port]/topic[?progress_topic=NAME]
//                            a transactional producer; progress in a topic
// A build without S3 or Kafka (TIDEMARK_WITH_S3 / TIDEMARK_WITH_KAFKA
// off) refuses those URLs with InvalidUsage; file:// is always there.
//
// Exactly once: a destination makes each interval of times visible
// atomically with its progress, and a restarted sink resumes from the
// progress the destination reads back, so nothing committed is written
// twice and nothing is skipped. The sink holds a critical reader named
// after it ("sink-<name>") so the shard's since never passes what it still
// has to read; Shard::release_reader drops that hold for a sink that will
// not run again.
//
// With no progress yet it emits the snapshot at as_of (default: upper - 1)
// as pairs at time as_of, committed as the interval [0, as_of + 1). A
// destination that commits a snapshot in parts (Kafka: one transaction
// each; files and S3: one file or object each) gets it in bounded parts: a part is committed once
// it holds snapshot_part_bytes or is snapshot_part_interval old, with a SnapshotPosition that says
// exactly which pairs are in, and the last part with the progress as_of + 1. A restarted sink that
// finds a snapshot in progress reopens it at the same as_of (its recorded as_of wins over
// options.as_of, as progress does), skips exactly the pairs committed and
// goes on (reading the committed pairs again to count them: time in what
// is committed, no memory). The hold of "sink-<name>" does not move until
// the snapshot is complete, so the since stays at or below as_of for the
// resume. From
// then on it follows the shard: for each new upper it walks the pairs of
// the times [progress, upper) and commits once the open interval holds
// roll_bytes or is commit_interval old, then moves its since hold to
// progress - 1. Polls of the upper slow down while nothing is pending (up
// to idle_poll_interval).
//
// Faults: its reads retry under the shard's ClientOptions::read_retry, and
// its polls of the upper and moves of its hold under `retry`; a failure
// past those ends the run with the error (a caller that runs it again
// resumes from the committed progress).
//
// Memory: the walker's (O(1) in diffs and group sizes, also while a
// resumed snapshot skips what is committed) plus the reads'
// (O(open parts x block), charged to options.read_memory when it has a
// pool) plus the destination's own bound (a file's write buffer, a Kafka
// producer's queue).
//
// SinkRun is the same sink taken one step at a time, so that many sinks
// can share a few threads: step() does the work that is ready (polls the
// upper once, then emits and commits an interval, or the snapshot or one
// part of it) and says how long to wait before the next step, and finish()
// commits what a stopped run has written. run_sink drives one on the caller's thread;
// `tidemark serve` drives its sinks so, on a shared pool.
//
// Thread-safety: run_sink runs on the caller's thread until `until` is
// reached, `stop` returns true, or an error. A SinkRun is used by one
// thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tidemark/client.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/memory_pool.h"
#include "tidemark/read.h"
#include "tidemark/retry.h"
#include "tidemark/update.h"

namespace tidemark {

enum class Envelope : std::uint8_t { kUpsert, kDebezium };
enum class SinkFormat : std::uint8_t { kJson, kCsv };

// "upsert" / "debezium", "json" / "csv"; InvalidUsage otherwise.
[[nodiscard]] Result<Envelope> parse_envelope(std::string_view text);
[[nodiscard]] Result<SinkFormat> parse_sink_format(std::string_view text);

// One change of one key at one time. The views are valid until the sink's
// next pair.
struct DiffPair {
  std::string_view key;
  Time time = 0;
  std::optional<std::string_view> before;  // nullopt: an insert
  std::optional<std::string_view> after;   // nullopt: a delete
  // 0 for the first pair of its (key, time), then 1, 2, ...: for upsert,
  // anything above 0 is a primary-key violation.
  std::uint64_t index_in_group = 0;
};

// How far a snapshot committed in parts has got: exact, in the order the
// sink writes the snapshot's pairs (keys in increasing order; within a key
// the DiffPairWalker's pairs, index_in_group 0, 1, ...). Every pair of the
// keys before `key` is committed, and the first `key_pairs` pairs of `key`
// (so a key whose diff fans out into many messages can be cut anywhere);
// `pairs` counts them all, from the snapshot's first pair.
//
// A destination that cannot keep the key (a file or object name has room
// for a few hundred bytes, a key may have megabytes) keeps `check` instead:
// snapshot_pair_check(key, key_pairs) of the last committed pair. A
// position read back from such a destination has `check` set and `key`
// empty, and a resumed sink compares the digest where it would compare
// the key.
struct SnapshotPosition {
  Time as_of = 0;
  std::string key;              // the key of the last committed pair
  std::uint64_t key_pairs = 0;  // >= 1
  std::uint64_t pairs = 0;      // >= key_pairs
  std::optional<std::uint64_t> check = std::nullopt;
  bool operator==(const SnapshotPosition&) const = default;
};

// A 64-bit digest (xxh3) of the last committed pair of a snapshot part: its
// key and its index in the key plus one. Not a secret: a check that a
// resumed snapshot is the one the parts were cut from.
std::uint64_t snapshot_pair_check(std::string_view key, std::uint64_t key_pairs);

// Where a sink's messages go; implement it for a destination of your own
// and run it with run_sink(shard, destination, options).
//
// A destination receives the diff pairs of one interval of times at a time,
// [lower, upper), between begin(lower) and commit(upper), and makes them
// visible atomically with its progress: after commit(upper) returns OK,
// progress() is upper and a restarted sink reads that same progress back.
// Pairs written after begin() and never committed are never visible as
// output (a file's temporary is deleted; an S3 upload is aborted; a Kafka
// transaction is aborted).
//
// The built-in ones (files, S3 objects, a Kafka topic) are opened from
// their URL by run_sink(client, shard, target, options). A destination
// of your own must also be the only writer of what it writes: run_sink
// does not claim it.
//
// Thread-safety: one sink uses a destination from one thread.
class SinkDestination {
 public:
  virtual ~SinkDestination() = default;

  // The largest committed upper: every pair at a time below it is
  // committed. nullopt when nothing is committed yet.
  virtual std::optional<Frontier> progress() const = 0;

  // Starts an interval at `lower`. REQUIRES: none open; lower not closed;
  // lower >= progress() when set.
  [[nodiscard]] virtual Status begin(Frontier lower) = 0;
  // Emits the message of one pair. REQUIRES: an interval open; the pair's
  // time >= its lower.
  [[nodiscard]] virtual Status write(const DiffPair& pair) = 0;
  // Bytes emitted into the open interval so far (for rolling).
  virtual std::uint64_t open_bytes() const = 0;
  // Commits the open interval as [lower, upper) together with the progress
  // upper. REQUIRES: upper > every time written, upper > lower, upper not
  // closed. An Indeterminate error means the commit may have happened;
  // progress() then says what this process knows, and a reopened
  // destination reads the truth.
  [[nodiscard]] virtual Status commit(Frontier upper) = 0;

  virtual std::uint64_t primary_key_violations() const = 0;

  // A snapshot in parts (optional: a destination that does not override
  // these gets its snapshot as one interval). True if it does.
  virtual bool commits_snapshot_in_parts() const { return false; }
  // The snapshot in progress, as its last committed part recorded it;
  // nullopt when none is (then progress() says where the sink is).
  // REQUIRES for it to be set: progress() is nullopt.
  virtual std::optional<SnapshotPosition> snapshot_position() const { return std::nullopt; }
  // Commits the open interval (begun at lower 0) as the part of the
  // snapshot that ends at `position`, atomically with that position;
  // progress() stays nullopt, and the sink begins the next part. The
  // snapshot's last part is committed with commit(as_of + 1). Errors as for
  // commit(). REQUIRES: commits_snapshot_in_parts(); every pair written
  // since begin() is at position.as_of and ends at `position`.
  [[nodiscard]] virtual Status commit_snapshot_part(const SnapshotPosition& position) {
    (void)position;
    return invalid_usage("this destination commits a snapshot whole");
  }
};

struct SinkProgress {
  Frontier frontier;          // every pair at a time < frontier is committed
  Frontier target;            // the frontier the open interval will commit
  bool snapshot = false;      // the open interval is the snapshot
  std::uint64_t pairs = 0;    // emitted by this run
  std::uint64_t commits = 0;  // intervals committed by this run
  std::uint64_t primary_key_violations = 0;
};

struct SinkOptions {
  static constexpr std::uint64_t kTickPairs = 1 << 16;

  std::string sink_name;
  std::optional<Time> as_of;
  std::optional<Time> until;  // stop once the committed frontier reaches it
  std::uint64_t roll_bytes = 64ull << 20;
  std::chrono::milliseconds commit_interval{1000};
  // A snapshot into a destination that commits it in parts: a part is
  // committed once it holds snapshot_part_bytes or is
  // snapshot_part_interval old, whichever comes first (each part then is a
  // Kafka transaction well within its 10-minute timeout).
  std::uint64_t snapshot_part_bytes = 64ull << 20;
  std::chrono::milliseconds snapshot_part_interval{60'000};
  // How often the shard's upper is polled while an interval is open; with
  // nothing pending the polls slow down, doubling up to idle_poll_interval
  // (a sink that has been idle sees the next change within that).
  std::chrono::milliseconds poll_interval{50};
  std::chrono::milliseconds idle_poll_interval{1000};
  std::function<void(const SinkProgress&)> on_progress;  // after each commit
  std::function<void(const SinkProgress&)> on_tick;      // every kTickPairs pairs
  std::function<bool()> stop;
  // What its reads charge their decoded blocks to (read.h); none: nothing.
  ReadMemory read_memory;
  // Waits between polls: sleeps the time given, or less once `stop` would
  // say true (a condition variable the stopper notifies). None: sleeps in
  // steps of 50 ms, asking `stop` after each.
  std::function<void(std::chrono::milliseconds)> sleep;
  RetryPolicy retry{std::chrono::milliseconds(10), std::chrono::milliseconds(1000), 0,
                    std::chrono::milliseconds(30'000)};
};

class SinkRun {
 public:
  // Opens the sink's critical reader. `shard` and `destination` must
  // outlive the run.
  [[nodiscard]] static Result<std::unique_ptr<SinkRun>> open(Shard& shard,
                                                             SinkDestination& destination,
                                                             SinkOptions options);
  ~SinkRun();
  SinkRun(const SinkRun&) = delete;
  SinkRun& operator=(const SinkRun&) = delete;

  // Does the work that is ready. Returns how long to wait before the next
  // step (zero: at once; the waits grow while nothing is pending, up to
  // idle_poll_interval, and never pass an open interval's commit time), or
  // nullopt once the run is over (`until` reached, or the shard closed:
  // everything written is committed).
  [[nodiscard]] Result<std::optional<std::chrono::milliseconds>> step();
  // Commits the open interval, if any, or the open part of a snapshot in
  // parts (a stopped sink keeps what it wrote).
  [[nodiscard]] Status finish();
  const SinkProgress& progress() const { return progress_; }
  // Since when the run has had nothing in hand: its snapshot and every
  // interval it opened are committed, and nothing has been committed
  // since. nullopt while it has work in hand. `tidemark serve` closes
  // the destinations of sinks idle for long.
  std::optional<std::chrono::steady_clock::time_point> idle_since() const;

 private:
  SinkRun(Shard& shard, SinkDestination& destination, SinkOptions options,
          std::unique_ptr<ReadHandle> reader);
  struct Snapshot;
  Result<std::optional<std::chrono::milliseconds>> snapshot_step();
  Status open_snapshot(Time as_of);
  Status commit_snapshot_part();
  Result<std::optional<std::chrono::milliseconds>> follow_step();
  Status commit();
  void report();
  std::chrono::milliseconds backoff(std::optional<std::chrono::steady_clock::time_point> deadline);

  Shard& shard_;
  SinkDestination& destination_;
  const SinkOptions options_;
  std::unique_ptr<ReadHandle> reader_;
  SinkProgress progress_;
  bool snapshot_done_;
  bool interval_open_ = false;
  std::chrono::steady_clock::time_point opened_at_;
  std::chrono::steady_clock::time_point committed_at_;  // or opened, if none yet
  Frontier written_;                                    // pairs below it are in the open interval
  std::chrono::milliseconds wait_{0};                   // the next wait while nothing is pending
  std::unique_ptr<Snapshot> snapshot_;                  // the snapshot being written, if any
};

// Runs the sink on the caller's thread into a destination the caller
// opened (and alone writes to) until options.until, options.stop or an
// error; returns what it did.
[[nodiscard]] Result<SinkProgress> run_sink(Shard& shard, SinkDestination& destination,
                                            const SinkOptions& options);

// A destination named by its URL (see the top), and how its messages are
// written.
struct SinkTarget {
  std::string to;
  Envelope envelope = Envelope::kUpsert;
  SinkFormat format = SinkFormat::kJson;
  // Who runs the sink, as the leases and lock files name it to another
  // runner that finds them held.
  std::string runner = "embedded";
  // Where the destination's buffer is reserved (a Kafka producer's queue,
  // an S3 upload's part). None: a pool of its own of 64 MiB.
  std::shared_ptr<MemoryPool> pool;
};

// Checks a destination URL for a format without touching anything:
// InvalidUsage naming what is wrong.
[[nodiscard]] Status check_sink_destination(std::string_view to, SinkFormat format);

// Runs sink options.sink_name of `shard` into `target`, as `tidemark sink
// run` does: claims the sink and its destination, so that a sink has one
// runner at a time and a destination one sink, across the processes that
// share the client's location (Held, naming the holder, when another
// runner has either); opens the destination (deleting what a crashed run
// left uncommitted); then runs as run_sink(shard, destination, options).
// `client` must be the one `shard` was opened from.
[[nodiscard]] Result<SinkProgress> run_sink(Client& client, Shard& shard, const SinkTarget& target,
                                            const SinkOptions& options);

}  // namespace tidemark
