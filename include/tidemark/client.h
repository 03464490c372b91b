// Client and Shard: the entry points of the embedded engine.
//
// A Client opens a Location (Blob + Consensus) and manages the shards in
// it. A Shard is a handle to one shard: it inspects the shard, opens
// writers, and starts snapshots and listens. Handles are cheap; every
// process (or thread) may open its own.
//
// Thread-safety: Client and Shard are safe for concurrent use.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/location.h"
#include "tidemark/read.h"
#include "tidemark/retry.h"

namespace tidemark {

class WriteHandle;
class SnapshotCursor;
class Listener;
class ReadHandle;
struct ReaderOptions;
struct ShardContext;
class ChangeWatch;

struct ClientOptions {
  // The batch builder cuts a part once its buffered updates reach this many
  // bytes; the builder's memory is about this times (1 + uploads in flight).
  std::uint64_t part_target_bytes = 8ull << 20;
  std::size_t max_uploads_in_flight = 2;
  // Uncompressed bytes per block inside a part: a reader's memory per open
  // part is about one block.
  std::size_t block_bytes = 64 << 10;
  int zstd_level = 1;
  // A part whose encoding is at most this many bytes travels inline, in
  // the consensus write that appends it, instead of as a blob object: a
  // small append then costs one consensus write (one sync on the embedded
  // default, one commit on PostgreSQL) and no file or object. 0: never.
  std::uint64_t inline_part_max_bytes = 4096;
  // The most inline bytes the shard's state may hold after an append of
  // this client's: past that, the append writes its parts to the blob
  // store as usual. Compaction moves inline parts into blob parts (it
  // merges them once they reach half of this), so the state, which every
  // consensus read of a rollup carries, stays small.
  std::uint64_t inline_state_max_bytes = 256 << 10;
  // Every 128 versions a shard's state starts a new chain from a full
  // copy of itself (a rollup), so that reading it never folds more than
  // that many diffs. A full state of at most this many bytes is written
  // in the commit that ends the chain (one consensus write, no extra sync
  // or object); a larger one is first written to the blob store. 0: always
  // the blob store.
  std::uint64_t inline_rollup_max_bytes = 1 << 20;
  // Compaction merges a batch with the batches after it once they hold
  // (spine_fanout - 1) times its data, like a counter in this base: a
  // shard of n similar appends keeps about (spine_fanout - 1) log(n) /
  // log(spine_fanout) batches, and each byte is rewritten about
  // log(n) / log(spine_fanout) times. Higher: less merge work, more
  // batches for a whole-shard read to merge (each holds one open block
  // while it reads). 2 merges the most and keeps the fewest batches. Taken
  // within [2, 64].
  std::uint64_t spine_fanout = 4;
  // Listen orders each batch's updates by time within this buffer. A
  // batch whose updates span several times and do not fit it is sorted
  // externally: runs of this size are written to scratch files and merged
  // (at most 64 at once), so a listen holds about this plus up to 4 MiB of
  // merge buffers (less for a smaller buffer), whatever the batch.
  std::uint64_t listen_buffer_bytes = 8ull << 20;
  // Where those scratch files go; made if missing. They have no name
  // (O_TMPFILE, or unlinked as soon as made): closed when merged or when
  // the listener is done, freed by the kernel if the process dies. A
  // listen that cannot write there fails with an error naming the
  // directory. Empty: the system's temporary directory (TMPDIR, else
  // /tmp). The command line and `tidemark serve` use DATA/scratch in the
  // data directory.
  std::string scratch_directory;
  // How soon a listener learns of a change another process commits: while
  // anything listens, the heads of the shards listened to are read this
  // often, in one batched read for all of them whatever the number of
  // listeners. A change this process commits or reads wakes its listeners
  // at once; a listener reads its shard only when woken (and every
  // kListenFallback, read.h). On a consensus with change hints
  // (PostgreSQL's LISTEN/NOTIFY) another process's commit wakes listeners
  // at once too, and this poll runs only while the hint channel is down.
  std::chrono::milliseconds listen_poll_interval{50};
  // How soon Shard::subscribe's subscribers learn of a change another
  // process commits: one read of every subscribed shard's head per
  // interval (a change this process makes or reads wakes them at once).
  // With change hints (above) this is only the fallback: a hint wakes at
  // once.
  std::chrono::milliseconds change_poll_interval{1000};
  // Writers hold a lease they heartbeat every lease / 3. A writer whose
  // process died loses it, and garbage collection then deletes the parts it
  // wrote that the shard never took.
  std::chrono::milliseconds writer_lease{60'000};
  // Leased readers that snapshots and listens without a ReadHandle of
  // their own open for their duration.
  std::chrono::milliseconds reader_lease{60'000};
  // How the read path (snapshots, listens, sinks, compaction's inputs)
  // retries a blob or consensus call that failed for a reason that may
  // pass: with backoff, until this deadline has passed since the call
  // first failed (retry.h). A stream resumes where it was; past the
  // deadline the read fails with the last error.
  RetryPolicy read_retry{std::chrono::milliseconds(10), std::chrono::milliseconds(1000), 0,
                         std::chrono::milliseconds(30'000)};
  // How a write that is safe to repeat retries a failure that may pass: a
  // part's upload (its key is its own), a compare_and_append (under its
  // idempotency token: repeated, it commits once), a writer's registration.
  // The bound is short: the appender and the compactor retry whole batches
  // and merges above it, and a caller learns of an outage soon.
  RetryPolicy write_retry{std::chrono::milliseconds(10), std::chrono::milliseconds(100), 5, {}};
  // A background compactor per opened shard: an append that leaves the
  // spine out of shape hands it the merge, and it collects garbage after.
  // Every shard's passes share one pool of max(2, cores) threads in the
  // process, oldest request first.
  // Without it the caller compacts (Shard::compact): until then every
  // append adds inputs to each read, and a read holds a block per input.
  bool background_compaction = true;
  // Idempotent producers (appender.h): a producer that commits nothing for
  // producer_expiry is forgotten (a retry after that appends again), and a
  // shard keeps at most max_producers (a new one beyond is refused).
  std::chrono::milliseconds producer_expiry{7LL * 24 * 3600 * 1000};
  std::size_t max_producers = 1000;
  // Who this client is, recorded with every reader and writer it registers
  // so that `shard inspect` can say which process holds what (at most 256
  // bytes are kept). Empty: "<host name>:<process id>".
  std::string owner;
};

// What Shard::compact did.
struct CompactionReport {
  std::uint64_t merges = 0;          // merges registered
  std::uint64_t merges_lost = 0;     // outputs dropped: inputs changed meanwhile
  std::uint64_t batches_merged = 0;  // input batches replaced
  std::uint64_t parts_written = 0;
  std::uint64_t bytes_written = 0;  // encoded bytes of the parts written
};

// What Shard::collect_garbage did.
struct GcReport {
  std::uint64_t parts_deleted = 0;    // replaced by compaction, no reader left
  std::uint64_t orphans_deleted = 0;  // never registered, writer gone
  std::uint64_t rollups_deleted = 0;
  std::uint64_t versions_truncated = 0;
  std::uint64_t parts_live = 0;  // referenced by a version still needed
};

// What `tidemark shard inspect` prints.
// A hold on the shard's since (read.h): the since never passes it while
// the reader lives.
struct ReaderInfo {
  std::string id;
  Frontier since;
  // Critical: held across restarts until released (id "c-" and the name
  // it was opened by: a sink's is "c-sink-<sink name>"); leased ("r-..."):
  // gone once its lease runs out.
  bool critical = false;
  std::uint64_t lease_expires_ms = 0;  // leased: wall-clock ms; critical: 0
  // The process that registered it (ClientOptions::owner); empty when an
  // older Tidemark registered it.
  std::string owner;
};

// A registered writer and its lease.
struct WriterInfo {
  std::string id;
  std::uint64_t lease_expires_ms = 0;  // wall-clock ms
  std::string owner;                   // as ReaderInfo::owner
};

// What Client::delete_shard did.
struct DeleteReport {
  std::uint64_t objects_deleted = 0;     // parts and rollups removed from the blob store
  std::uint64_t versions_truncated = 0;  // state versions removed from consensus
};

struct ShardInfo {
  std::string name;
  Frontier upper;
  Frontier since;
  SeqNo seqno = 0;
  std::uint64_t batches = 0;
  std::uint64_t parts = 0;
  // Of those, parts held inline in the state (PartRef::data), with no blob
  // object: parts - inline_parts objects are in the blob store.
  std::uint64_t inline_parts = 0;
  std::uint64_t updates = 0;        // stored updates, before consolidation
  std::uint64_t bytes = 0;          // encoded bytes of all parts
  std::vector<ReaderInfo> readers;  // by id; what holds the since
  std::vector<WriterInfo> writers;  // by id

  // {"name", "upper", "since", "seqno", "batches", "parts", "inline_parts",
  //  "updates", "bytes", "readers": [{"id", "since", "critical",
  //  "expires_ms", "owner"}], "writers": [{"id", "expires_ms", "owner"}]}
  //  (expires_ms null for a critical reader, owner null when unknown)
  std::string to_json() const;
};

// What a shard has committed for an idempotent producer (appender.h).
struct ProducerInfo {
  std::uint64_t sequence = 0;    // every record up to this number is committed
  Time time = 0;                 // the commit time of record `sequence`
  std::uint64_t expires_ms = 0;  // forgotten after this wall-clock ms unless it commits
};

struct ProducerLookup {
  std::optional<ProducerInfo> producer;  // nullopt: unknown (never seen, or expired)
  std::size_t producers = 0;             // how many producers the shard keeps
  std::size_t max_producers = 0;         // the most it keeps (ClientOptions; 0: no limit)
};

// A subscription to a shard's changes (Shard::subscribe); it ends when
// destroyed or reset.
class Subscription {
 public:
  Subscription() = default;
  Subscription(Subscription&& other) noexcept;
  Subscription& operator=(Subscription&& other) noexcept;
  ~Subscription();
  // Ends it: once this returns the function is not called again, except
  // by a call already in progress on another thread.
  void reset();

 private:
  friend class Shard;
  std::shared_ptr<ChangeWatch> watch_;
  std::uint64_t id_ = 0;
};

// Opened by Client::open_shard.
class Shard {
 public:
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& name() const;

  // Reads, retried as ClientOptions::read_retry says (as snapshots are).
  [[nodiscard]] Result<ShardInfo> inspect();
  // The shard's current upper, read from consensus (retried the same way)
  // when `fresh`; else the last state this process saw (a status that must
  // not wait on a retry).
  [[nodiscard]] Result<Frontier> upper(bool fresh = true);
  // What the shard has committed for `producer`: read from consensus when
  // `fresh`, else from the last state this process saw.
  [[nodiscard]] Result<ProducerLookup> lookup_producer(std::string_view producer,
                                                       bool fresh = true);

  // Calls `wake` after each change of this shard: at once when this
  // process commits or reads a new upper (an append, a read of the upper),
  // and within ClientOptions::change_poll_interval of a commit by another
  // process, at once on a consensus with change hints (that one may be any
  // change: read the upper to see). Subscribe,
  // then read: every change after that read wakes. `wake` runs on the
  // thread that learned of the change; it must be quick, must not block
  // and must not call into the shard. Shared by every Shard of the Client:
  // subscribers cost nothing while nothing changes but one batched head
  // read per interval.
  [[nodiscard]] Result<Subscription> subscribe(std::function<void()> wake);

  // Registers a new writer with the shard, leased (ClientOptions::writer_lease)
  // and heartbeating until the handle is destroyed.
  [[nodiscard]] Result<std::unique_ptr<WriteHandle>> open_writer();

  // A leased reader holding the shard's current since.
  [[nodiscard]] Result<std::unique_ptr<ReadHandle>> open_reader(const ReaderOptions& options);
  // A critical reader: `reader_id` names it across restarts; reopening
  // finds its hold where it was left.
  [[nodiscard]] Result<std::unique_ptr<ReadHandle>> open_critical_reader(
      std::string_view reader_id);
  // Drops the hold of reader `reader_id` (ShardInfo::readers), leased or
  // critical, so the since may move past it. For a hold nothing uses any
  // more, such as that of a sink that will not run again (run again, it
  // resumes only if the since has not passed its progress meanwhile).
  // The since then follows the remaining holds; it never moves back.
  // NotFound when there is no such reader.
  [[nodiscard]] Status release_reader(std::string_view reader_id);

  // True once a call on this handle found the shard deleted (every call
  // then fails with NotFound): open it anew, it may have been created
  // again (Client::delete_shard).
  bool deleted() const;

  // Consolidated contents at `as_of`. NotReady when as_of >= upper (not yet
  // final); SinceViolation when as_of < since.
  // `memory`: what the read's decoded blocks are charged to (read.h).
  [[nodiscard]] Result<SnapshotCursor> snapshot(Time as_of, const ReadMemory& memory = {});

  // Updates after `start` (read.h), in time order, with progress as the
  // upper advances; stops at `until` when given (updates at times < until
  // only). A snapshot opens a leased reader of its own for its duration;
  // the listens of a shard in one process share one, held where the first
  // of them found the since. So garbage collection never deletes a part
  // they may still fetch.
  [[nodiscard]] Result<std::unique_ptr<Listener>> listen(ListenStart start,
                                                         std::optional<Time> until = std::nullopt,
                                                         const ReadMemory& memory = {});
  // listen(ListenStart::after(from), ...): updates at times > from.
  [[nodiscard]] Result<std::unique_ptr<Listener>> listen(Time from,
                                                         std::optional<Time> until = std::nullopt,
                                                         const ReadMemory& memory = {});
  // The consolidated snapshot at `as_of` (default: the latest complete
  // time), then every change after it, in one listener (read.h,
  // SnapshotListen); under a leased reader of its own like listen.
  [[nodiscard]] Result<SnapshotListen> listen_snapshot(std::optional<Time> as_of = std::nullopt,
                                                       std::optional<Time> until = std::nullopt,
                                                       const ReadMemory& memory = {});

  // Runs the merges the spine needs until it is in shape,
  // each streaming in bounded memory and registered only if its inputs are
  // still there. What the background compactor and `tidemark compact` run.
  [[nodiscard]] Result<CompactionReport> compact();
  // Deletes the parts no live state version references (once no leased
  // reader may fetch them), the parts of writers that are gone which the
  // shard never took, old rollups, and truncates old consensus versions.
  [[nodiscard]] Result<GcReport> collect_garbage();

 private:
  friend class Client;
  friend class ReadHandle;  // a critical handle reads through its shard
  explicit Shard(std::shared_ptr<ShardContext> context);

  std::shared_ptr<ShardContext> context_;
};

// Shard names match [A-Za-z0-9._-]{1,128}; ".", ".." and names starting
// with ".tmp-" (reserved for blob files being written) are refused too:
// InvalidUsage saying why. Client::create_shard checks it; a program may
// check a name before it gets that far.
[[nodiscard]] Status validate_shard_name(std::string_view name);

class Client {
 public:
  [[nodiscard]] static Result<std::shared_ptr<Client>> open(Location location,
                                                            ClientOptions options = {});
  // Opens the location named by two URLs.
  [[nodiscard]] static Result<std::shared_ptr<Client>> open(std::string_view blob_url,
                                                            std::string_view consensus_url,
                                                            ClientOptions options = {});

  Client(Location location, ClientOptions options);
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // AlreadyExists when a shard of that name exists; InvalidUsage for a name
  // outside [A-Za-z0-9._-]{1,128}.
  [[nodiscard]] Status create_shard(std::string_view name);
  [[nodiscard]] Result<std::vector<std::string>> list_shards();
  // NotFound when there is no such shard.
  [[nodiscard]] Result<std::shared_ptr<Shard>> open_shard(std::string_view name);
  // Deletes a shard and its data. In order: its state becomes a tombstone
  // (every handle on it, in any process, fails from its next call with
  // NotFound "was deleted"), garbage collection removes its parts, rollups
  // and old versions, and only then does its name leave the list, so a
  // delete cut short (a kill, an unreachable store) leaves the shard
  // listed and deleted: run it again to finish. The name may then be
  // created again; the new shard starts empty and shares nothing with the
  // old one. Held while a critical reader (a sink's hold) remains, unless
  // `force`; NotFound when there is no such shard. A part a writer was
  // uploading at that moment may be left behind in the blob store (its
  // writer's commit fails); the next shard of that name collects it.
  [[nodiscard]] Result<DeleteReport> delete_shard(std::string_view name, bool force = false);

  const Location& location() const { return location_; }
  const ClientOptions& options() const { return options_; }

 private:
  // A shard's context, without the change watch or a compactor.
  std::shared_ptr<ShardContext> make_context(std::string_view name);
  // Applies `edit` to the registry's names with compare-and-set until it
  // lands (false from `edit`: leave the registry as it is).
  [[nodiscard]] Status update_registry(
      const std::function<Result<bool>(std::vector<std::string>&)>& edit);

  Location location_;
  ClientOptions options_;
  std::shared_ptr<ChangeWatch> changes_;
};

}  // namespace tidemark
