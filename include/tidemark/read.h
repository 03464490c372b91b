// The read path: snapshots and listens.
//
// SnapshotCursor streams the consolidated contents of a shard at as_of,
// sorted by (key, value), with times advanced to as_of. It is a k-way merge
// over the parts, each read one block at a time: memory is
// O(open parts x block size), never O(data).
//
// Listener streams the updates after a ListenStart in time order, and a
// progress event each time the upper advances; it waits for new appends.
// It reads the shard's state only when woken by a change (the Client's
// change watch: at once for a change this process commits or reads, within
// ClientOptions::listen_poll_interval for one another process commits,
// whatever the number of listeners), and every kListenFallback regardless,
// so an idle listener costs no reads of its own.
//
// ReadHandle holds a reader's lease and since hold: the shard's since (below
// which history may be compacted) never passes an active hold. A leased
// handle heartbeats in the background and its hold is dropped when the
// handle is destroyed or its lease expires; a critical handle, opened by a
// stable id, holds across restarts until expire() (e.g. a sink's progress).
//
// Thread-safety: a cursor or listener is used from one thread at a time. A
// ReadHandle is safe for concurrent use.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/memory_pool.h"

namespace tidemark {

struct SnapshotRow {
  std::string_view key;
  std::string_view value;
  Diff diff = 0;
};

class SnapshotCursor {
 public:
  struct Impl;
  explicit SnapshotCursor(std::unique_ptr<Impl> impl);
  SnapshotCursor(SnapshotCursor&&) noexcept;
  SnapshotCursor& operator=(SnapshotCursor&&) noexcept;
  ~SnapshotCursor();

  Time as_of() const;
  // The next row, or nullopt at the end. The row's views stay valid until
  // the next call.
  [[nodiscard]] Result<std::optional<SnapshotRow>> next();

 private:
  std::unique_ptr<Impl> impl_;
};

struct ListenEvent {
  enum class Kind : std::uint8_t { kUpdate, kProgress };
  Kind kind = Kind::kUpdate;
  std::string_view key;
  std::string_view value;
  Time time = 0;
  Diff diff = 0;
  Frontier progress;  // for kProgress: every update at a time < progress has been emitted
};

// Where a listen starts. Two spellings, for two callers:
//
//  - after(T): the updates at times > T. What `listen --from T` means.
//  - at_progress(P): the updates at times >= P, where P is a progress
//    value a listener reported ("every time < P has been emitted"). A
//    consumer that stops after seeing progress P and listens again at P
//    misses nothing and sees nothing twice. at_progress(0) is the whole
//    history; at_progress(closed) is an empty listen that ends at once.
//
// Either way, times at or after the start read exactly only while the
// shard's since has not passed the time just before it (SinceViolation
// otherwise); at_progress(0) needs a since of 0.
class ListenStart {
 public:
  static constexpr ListenStart after(Time from) {
    return ListenStart(from == UINT64_MAX ? Frontier::closed() : Frontier::at(from + 1),
                       Frontier::at(from));
  }
  static constexpr ListenStart at_progress(Frontier progress) {
    return ListenStart(progress, progress);
  }
  // The first time the listen may emit (closed: none).
  constexpr Frontier lower() const { return lower_; }
  // The progress the listener starts from: the first progress event it
  // reports is past it.
  constexpr Frontier claimed() const { return claimed_; }
  // "from 7" or "at progress 8", for messages.
  std::string to_string() const {
    if (lower_ == claimed_) return "at progress " + lower_.to_string();
    return "from " + claimed_.to_string();
  }

 private:
  constexpr ListenStart(Frontier lower, Frontier claimed) : lower_(lower), claimed_(claimed) {}
  Frontier lower_;
  Frontier claimed_;
};

// A listener that is never woken still looks at its shard this often.
inline constexpr std::chrono::seconds kListenFallback{30};

class Listener {
 public:
  virtual ~Listener() = default;
  // The next event, waiting for new appends when there is none yet.
  // nullopt once `until` is reached. Views stay valid until the next call.
  [[nodiscard]] virtual Result<std::optional<ListenEvent>> next() = 0;
  // The next event if one is ready now, reading the shard only if it may
  // have changed; nullopt inside the Result means "nothing yet".
  [[nodiscard]] virtual Result<std::optional<ListenEvent>> poll() = 0;
  virtual bool done() const = 0;
  // For a caller that polls: `wake` is called (from any thread; it must be
  // quick and must not call into the listener) whenever poll() may have
  // something new after returning nothing, until the listener is
  // destroyed; it replaces any earlier one. True when wakes will come, so
  // that a poll every kListenFallback is enough; false when the caller
  // must poll on its own (say every 50 ms).
  virtual bool set_wake(std::function<void()> wake) {
    (void)wake;
    return false;
  }
};

// A snapshot and the changes after it, in one stream (what Materialize
// calls SUBSCRIBE): the consolidated contents at `as_of`, each row as an
// update at time as_of, then every update at a time after as_of in time
// order with progress events, as a Listener after as_of would give them.
// No time is missing between the two and none is read twice: the snapshot
// covers every time <= as_of, the changes every time > as_of, both under
// one reader's hold. A consumer resumes at a progress value it saw with a
// plain listen (ListenStart::at_progress).
struct SnapshotListen {
  // The snapshot's time. nullopt when the shard had no complete time yet
  // (an upper of 0): the snapshot is empty and the changes start at 0.
  std::optional<Time> as_of;
  std::unique_ptr<Listener> listener;
};

// What a read's decoded blocks are charged to. A snapshot holds one block
// per part it merges (a listen, per part of the batch it reads), each up to
// the part's block size (64 KiB of payload by default), or one whole update
// when that is larger. With a pool, the block a part is about to load is
// charged to it first and released when the next replaces it or the part
// is done: a block of up to 1 MiB decoded at once, even past the pool's
// capacity (a merge needs one per part, and refusing them would make a
// shard with many small parts unreadable), a larger one (a huge update)
// only when it fits, waiting up to `wait` for room. One that cannot get
// its bytes in time fails the read with Full, naming the pool: nothing is
// lost (read again later, or with more memory). So huge updates are read
// within the pool, and ordinary blocks are counted in it. The default (no
// pool) charges nothing.
//
// Read-ahead (where fetching parts is slow, as from S3): a snapshot or
// listen may also fetch spans of its parts ahead of the merge, at most 16
// MiB and 16 fetches in flight per read. With a pool each span's bytes are
// taken from it only when they fit (never forced past its capacity), so
// fetching ahead never crowds out the merge's own blocks; a span that
// does not fit is simply not fetched early. Without a pool the 16 MiB
// bound alone applies. Compaction never reads ahead.
struct ReadMemory {
  std::shared_ptr<MemoryPool> pool;
  std::chrono::milliseconds wait{10'000};
};

struct ReaderOptions {
  // A leased reader whose lease runs out (no heartbeat for this long) loses
  // its hold.
  std::chrono::milliseconds lease{60'000};
  // Heartbeat in the background every lease / 3. Off only in tests that
  // let a lease expire.
  bool heartbeat = true;
};

class ReadHandle {
 public:
  struct Impl;
  explicit ReadHandle(std::unique_ptr<Impl> impl);
  ~ReadHandle();  // leased: drops the hold; critical: keeps it
  ReadHandle(const ReadHandle&) = delete;
  ReadHandle& operator=(const ReadHandle&) = delete;

  const std::string& id() const;
  bool critical() const;
  // This reader's hold, as the shard last recorded it.
  [[nodiscard]] Result<Frontier> since();
  // Lets history below `since` be compacted: moves the hold forward (never
  // back). NotFound if the lease expired.
  [[nodiscard]] Status downgrade_since(Frontier since);
  // Extends the lease now (the background heartbeat does this too).
  [[nodiscard]] Status heartbeat();
  // Drops the hold now, critical or not.
  [[nodiscard]] Status expire();

  // Reads under this reader's lease: garbage collection keeps every part
  // they may fetch while the lease lives. A critical handle has no lease
  // and reads through a leased reader of its own.
  [[nodiscard]] Result<SnapshotCursor> snapshot(Time as_of, const ReadMemory& memory = {});
  [[nodiscard]] Result<std::unique_ptr<Listener>> listen(ListenStart start,
                                                         std::optional<Time> until = std::nullopt,
                                                         const ReadMemory& memory = {});
  // listen(ListenStart::after(from), ...).
  [[nodiscard]] Result<std::unique_ptr<Listener>> listen(Time from,
                                                         std::optional<Time> until = std::nullopt,
                                                         const ReadMemory& memory = {});
  // The snapshot at `as_of` (default: the latest complete time, upper - 1)
  // and then the changes after it (SnapshotListen). NotReady when as_of is
  // not final yet, SinceViolation when it is below the since,
  // InvalidUsage when `until` is not after as_of.
  [[nodiscard]] Result<SnapshotListen> listen_snapshot(std::optional<Time> as_of,
                                                       std::optional<Time> until = std::nullopt,
                                                       const ReadMemory& memory = {});

 private:
  friend class Shard;
  // Reads that own `self` (this handle) and drop its hold when done.
  [[nodiscard]] Result<SnapshotCursor> snapshot_owned(Time as_of, std::unique_ptr<ReadHandle> self,
                                                      const ReadMemory& memory);
  [[nodiscard]] Result<SnapshotListen> listen_snapshot_owned(std::optional<Time> as_of,
                                                             std::optional<Time> until,
                                                             std::unique_ptr<ReadHandle> self,
                                                             const ReadMemory& memory);
  [[nodiscard]] Result<std::unique_ptr<Listener>> listen_owned(ListenStart start,
                                                               std::optional<Time> until,
                                                               std::unique_ptr<ReadHandle> self,
                                                               const ReadMemory& memory);

  std::unique_ptr<Impl> impl_;
};

}  // namespace tidemark
