// Read-ahead for the merge (issue #22): while a PartReader decodes one block,
// the bytes of the next blocks are already being fetched, on the process's
// blob_io() threads, so a read over a slow blob (S3, or 200 ms of latency)
// is not one round trip per block, one after another.
//
// ReadAheadSource is a part's FetchRange. It knows nothing of blocks: it
// serves the reader's ranged reads from spans of the object it fetched
// ahead (up to kSpanBytes each, consecutive, up to the start of the tail
// that PartReader::open fetches anyway), and after each read it tops up
// the spans in flight ahead of it. A read no span covers (the footer, a
// read out of order, what a span ended short of) goes to the blob as
// before; so does everything while read-ahead is off (a part with a block
// over MergeCursor::kDeferBlockBytes, whose huge blocks keep loading only
// when the merge reaches them). A span whose fetch failed is forgotten, and
// the read that needed it fetches its own bytes: so a failing blob fails
// the read of the very block it fails without read-ahead, with the same
// error, and a damaged block fails its checksum where it always did.
//
// Budget: every span is granted by the cursor's ReadAheadBudget before it
// is issued: at most kCursorBytes per cursor, of which at most
// kCursorFetches fetches in flight at once (a span fetched and waiting for
// its reader holds bytes, not a fetch: a merge of many small parts keeps
// one span of each, up to kCursorBytes, rather than only kCursorFetches of
// them), and, when
// the read has a memory pool, its bytes try_reserve()d from that pool (never
// past its capacity), only while the pool keeps free besides it as much
// room as the merge's own blocks hold (MergeCursor charges those without
// waiting, so read-ahead must not be what makes them overdraw; the merge
// starts reading ahead only once every input holds its first block). A span held, fetched or in
// flight, keeps its grant until the reader has read past it (or the source is dropped). When no
// grant is left, read-ahead shrinks, down to none: the reader then fetches
// block by block as before. Nothing waits for a grant, so read-ahead never
// deadlocks; a reader waits only for a span of its own, and takes over a
// span no thread has started yet (a full or missing blob_io() pool costs
// time, never progress).
//
// Lifetime: a queued span is cancelled when its source goes; one being
// fetched holds the blob, its key and its grant itself (shared), so a
// source (or the cursor) may be destroyed with fetches in flight: they end
// on their own and release their bytes.
//
// Thread-safety: ReadAheadBudget is safe from any thread. A ReadAheadSource
// is used by one thread at a time (its reader's); its spans are shared with
// the jobs that fetch them under a mutex of their own.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "tidemark/error.h"
#include "tidemark/location.h"
#include "tidemark/memory_pool.h"

namespace tidemark {

class ReadAheadBudget;

// Bytes of read-ahead granted, returned when destroyed.
class ReadAheadGrant {
 public:
  ReadAheadGrant() = default;
  ReadAheadGrant(ReadAheadGrant&& other) noexcept { *this = std::move(other); }
  ReadAheadGrant& operator=(ReadAheadGrant&& other) noexcept;
  ~ReadAheadGrant();
  std::uint64_t bytes() const { return bytes_; }
  // Its fetch has ended (or never will): the cursor may start another,
  // while the bytes stay granted until this is destroyed.
  void end_fetch();

 private:
  friend class ReadAheadBudget;
  void release();
  std::shared_ptr<ReadAheadBudget> budget_;
  std::uint64_t bytes_ = 0;
  bool fetching_ = false;       // counted in the budget's fetches in flight
  std::optional<Lease> lease_;  // from the read's pool, when it has one
};

class ReadAheadBudget : public std::enable_shared_from_this<ReadAheadBudget> {
 public:
  static constexpr std::uint64_t kCursorBytes = 16 << 20;
  static constexpr std::size_t kCursorFetches = 16;

  // `pool` may be null (the read charges nothing): then only the cursor's
  // own bounds apply.
  explicit ReadAheadBudget(std::shared_ptr<MemoryPool> pool) : pool_(std::move(pool)) {
    set_inputs(1);
  }

  // The merge reads `inputs` parts (or runs) at once: each gets a fair
  // share of kCursorBytes, room for the span it reads and one ahead. So
  // spans are share / 2, between kMinSpanBytes and ReadAheadSource::kSpanBytes,
  // and a part keeps up to share / span of them (1 to kSpansPerPart).
  // One input: 1 MiB spans, 8 ahead; 32: 256 KiB, 2; 64: 128 KiB, 2. (A
  // merge of 64 parts whose keys interleave reads from all of them at
  // once: with 1 MiB spans, a third of them held no span and were read
  // block by block.) Call before any source reads through this budget.
  static constexpr std::uint64_t kMinSpanBytes = 64 << 10;
  void set_inputs(std::size_t inputs);
  std::uint64_t span_bytes() const { return span_bytes_; }
  std::size_t spans_ahead() const { return spans_ahead_; }

  // A grant of `bytes` for one fetch, or nullopt when it does not fit now
  // (or the budget is paused). The fetch counts as in flight until the
  // grant's end_fetch() (or its end).
  [[nodiscard]] std::optional<ReadAheadGrant> try_take(std::uint64_t bytes);

  // While paused nothing is granted.
  void pause(bool paused) { paused_.store(paused, std::memory_order_relaxed); }
  // What the merge's own blocks hold of the pool (and room it keeps for its
  // caller, MergeCursor::leave_room_for) changes by `delta`: a grant leaves
  // at least that much room free besides itself.
  void add_merge_blocks(std::int64_t delta) {
    merge_blocks_.fetch_add(delta, std::memory_order_relaxed);
  }

  // For tests: the most bytes granted at once so far.
  std::uint64_t peak_bytes() const;
  std::uint64_t bytes() const;

 private:
  friend class ReadAheadGrant;
  void give_back(std::uint64_t bytes, bool fetching);
  void fetch_ended();

  const std::shared_ptr<MemoryPool> pool_;
  std::uint64_t span_bytes_;  // set_inputs(), before any source
  std::size_t spans_ahead_;
  std::atomic<bool> paused_{false};
  std::atomic<std::int64_t> merge_blocks_{0};
  mutable std::mutex mu_;
  std::uint64_t bytes_ = 0;  // GUARDED_BY(mu_)
  std::uint64_t peak_ = 0;   // GUARDED_BY(mu_)
  std::size_t fetches_ = 0;  // GUARDED_BY(mu_), in flight
};

class ReadAheadSource {
 public:
  // The largest span (a merge of few inputs).
  static constexpr std::uint64_t kSpanBytes = 1 << 20;
  // The most spans in flight or fetched ahead of the reader, per part.
  static constexpr std::size_t kSpansPerPart = 8;

  // Spans of at most `bytes` (0: kSpanBytes) for budgets whose
  // set_inputs() comes from now on (tests).
  static void set_span_bytes_for_testing(std::uint64_t bytes);
  static std::uint64_t max_span_bytes();

  // Reads `key` (an object of `size` bytes) from `blob`.
  ReadAheadSource(std::shared_ptr<Blob> blob, std::string key, std::uint64_t size,
                  std::shared_ptr<ReadAheadBudget> budget);
  ~ReadAheadSource();  // drop()
  ReadAheadSource(const ReadAheadSource&) = delete;
  ReadAheadSource& operator=(const ReadAheadSource&) = delete;

  // Bytes [offset, offset + length) of the object, like Blob::get_range
  // (shorter when the object ends first).
  [[nodiscard]] Result<std::string> fetch(std::uint64_t offset, std::uint64_t length);

  // From now on each fetch tops up the spans ahead of it.
  void enable() { enabled_ = true; }
  // Issues spans from `offset` on now (when enabled), as if a read had
  // just ended there. False when the budget refused one (it is spent for
  // now); true when as many spans as wanted are issued (or none is).
  bool read_ahead_from(std::uint64_t offset);
  // read_ahead_from() where the last read below the tail ended (when there
  // was one). The merge calls it again for parts whose spans the budget
  // refused, once a part is done (MergeCursor::top_up_read_ahead).
  bool resume() { return last_end_ > 0 ? read_ahead_from(last_end_) : true; }
  // Forgets every span not read yet (cancelling those not started) and the
  // one being read: their bytes go back to the budget (a span being
  // fetched, once its fetch ends). Read-ahead goes on with the next fetch.
  void drop();

 private:
  struct Span;
  static void run(const std::shared_ptr<Span>& span, const std::shared_ptr<Blob>& blob,
                  const std::string& key);
  // Waits for `span` (fetching it here when no thread has started it).
  void wait(const std::shared_ptr<Span>& span);
  // A span no thread has started is never fetched; its bytes go back now.
  static void cancel(Span& span);

  const std::shared_ptr<Blob> blob_;
  const std::shared_ptr<const std::string> key_;
  const std::uint64_t size_;
  const std::uint64_t limit_;  // spans end here: the start of the tail open() reads
  const std::shared_ptr<ReadAheadBudget> budget_;
  const std::uint64_t span_bytes_;  // the budget's
  const std::size_t spans_ahead_;
  bool enabled_ = false;
  std::uint64_t next_issue_ = 0;             // where the next span starts
  std::uint64_t last_end_ = 0;               // where the last read below limit_ ended
  std::deque<std::shared_ptr<Span>> spans_;  // ascending, not read yet
  // The span being read: its bytes and its grant.
  std::string current_;
  std::uint64_t current_offset_ = 0;
  ReadAheadGrant current_grant_;
};

}  // namespace tidemark
