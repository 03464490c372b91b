#include "shard/compactor.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "part/part.h"
#include "shard/gc.h"
#include "shard/merge.h"
#include "shard/run_writer.h"
#include "shard/state.h"
#include "util/clock.h"
#include "util/executor.h"
#include "util/ids.h"
#include "util/try.h"

namespace tidemark {
namespace {

// Passes of compact_shard stop after this many merges, so a shard under
// heavy contention does not keep one caller forever.
constexpr int kMaxMergesPerPass = 64;

// Whether a merge of inline inputs (`total` bytes encoded, in `count`
// parts) is tried without registering a writer, for an output that fits
// one inline part (`part_bytes`); when it does not fit, the merge is done
// again as a registered writer. Inputs of one part's worth always are (a
// merged part is rarely larger than the parts it came from). So are many
// small ones of up to two parts' worth, a quarter part each on average:
// merged, they lose each part's framing and their updates compress
// together. Under 100 clients' one-record appends, the compactor's merges
// of 8-10 such inputs took 4-8.4 KiB encoded, and in three runs 1,979 of
// 2,049 tries came out inline; before, each of those passes registered
// first, a consensus write of its own and a lost compare-and-set for the
// next append. Fewer, larger inputs rarely shrink enough: under 1,000
// clients, with every input of up to two parts tried, 71 of 71 tries (all
// averaging over 1.5 KiB an input) did not fit, each a merge of hundreds
// of KB decoded for nothing.
bool try_unregistered(std::uint64_t total, std::size_t count, std::uint64_t part_bytes) {
  return total <= part_bytes || (total <= 2 * part_bytes && total <= count * (part_bytes / 4));
}

// Who a compaction pass is to the shard: a writer (its parts are named
// after it, so a dead compactor's parts are orphans GC recognizes) and a
// leased reader (its seqno hold keeps GC from deleting the inputs of a
// merge in progress). Registered by the pass's first merge that may write
// to the blob store, renewed between parts; the commit of each merge also
// renews both leases and moves the hold to the version it writes (the next
// merge reads that version or a later one), and the commit of the pass's
// last merge removes both: that merge's output is referenced from then on,
// so it needs no writer. A pass of one merge costs two consensus writes
// (register, merge), not five; a merge of inline parts into one inline
// part needs no registration (nothing of it is in the blob store for GC to
// miss or delete), so a pass of those costs one write per merge.
class PassWriter {
 public:
  PassWriter(ShardContext& context, PassCommits commits)
      : context_(context),
        commits_(commits),
        id_("c" + random_id()),
        reader_id_("r-" + id_),
        lease_ms_(static_cast<std::uint64_t>(context.options.writer_lease.count())) {}
  PassWriter(const PassWriter&) = delete;
  PassWriter& operator=(const PassWriter&) = delete;
  ~PassWriter() {
    if (!registered_) return;
    (void)context_.machine->apply([&](ShardState& state) -> Result<TransitionResult> {
      const std::uint64_t now = wall_clock_millis();
      remove_writer(state, id_, now);
      remove_reader(state, reader_id_, now);
      return TransitionResult::kWrite;
    });
  }

  // Commits `transition` for the pass: a registration or a merge.
  Result<StatePtr> commit(const Transition& transition) {
    if (commits_ == PassCommits::kRideAppends) return context_.machine->apply_riding(transition);
    return context_.machine->apply(transition);
  }

  const std::string& id() const { return id_; }
  bool registered() const { return registered_; }

  Status open() {
    if (lease_ms_ == 0) return invalid_usage("a writer lease must be positive");
    const std::uint64_t now = wall_clock_millis();
    TM_ASSIGN(StatePtr state, commit([&](ShardState& s) -> Result<TransitionResult> {
                register_writer(s, id_, now + lease_ms_, now, context_.options.owner);
                register_reader(s, reader_id_, false, now + lease_ms_, now, context_.options.owner);
                return TransitionResult::kWrite;
              }));
    registered_ = true;
    // The hold keep_alive keeps: at or below the version the first merge
    // reads, never moved past it mid-merge.
    hold_ = state->readers.at(reader_id_).seqno;
    renewed_ms_ = now;
    return {};
  }

  // In the transition committing a merge that is not the pass's last:
  // renews both leases and moves the hold to the version it writes.
  Status step(ShardState& state, std::uint64_t now) const {
    TM_TRY(heartbeat_writer(state, id_, now + lease_ms_, now));
    return heartbeat_reader(state, reader_id_, now + lease_ms_, now);
  }
  // Once that transition landed, as `state`.
  void stepped(const ShardState& state, std::uint64_t now) {
    hold_ = state.readers.at(reader_id_).seqno;
    renewed_ms_ = now;
  }
  // In the transition committing the pass's last merge: leaves the shard.
  void leave(ShardState& state, std::uint64_t now) const {
    remove_writer(state, id_, now);
    remove_reader(state, reader_id_, now);
  }
  // Once that transition landed: nothing is left to remove.
  void left() { registered_ = false; }

  // Renews both leases once a third of them has passed, keeping the hold.
  Status keep_alive() {
    if (!registered_ || wall_clock_millis() < renewed_ms_ + lease_ms_ / 3) return {};
    return renew(hold_);
  }

 private:
  Status renew(std::optional<SeqNo> hold) {
    const std::uint64_t now = wall_clock_millis();
    auto state = context_.machine->apply([&](ShardState& s) -> Result<TransitionResult> {
      TM_TRY(heartbeat_writer(s, id_, now + lease_ms_, wall_clock_millis()));
      TM_TRY(heartbeat_reader(s, reader_id_, now + lease_ms_, wall_clock_millis(), hold));
      return TransitionResult::kWrite;
    });
    if (!state && state.error().is(ErrorKind::kNotFound)) {
      // This pass's own registration lapsed: the pass ends, retryably.
      return make_error(ErrorKind::kLeaseExpired, "the compaction pass lost its lease (" +
                                                      state.error().message +
                                                      "): nothing was replaced; compact again");
    }
    if (!state) return std::unexpected(state.error());
    hold_ = (*state)->readers.at(reader_id_).seqno;
    renewed_ms_ = now;
    return {};
  }

  ShardContext& context_;
  const PassCommits commits_;
  const std::string id_;
  const std::string reader_id_;
  const std::uint64_t lease_ms_;
  bool registered_ = false;
  std::uint64_t renewed_ms_ = 0;
  std::optional<SeqNo> hold_;
};

// Each batch one input of a merge (its parts one run).
std::vector<MergeCursor::PartRun> merge_runs(std::span<const HollowBatch> inputs) {
  std::vector<MergeCursor::PartRun> runs;
  runs.reserve(inputs.size());
  for (const HollowBatch& batch : inputs) {
    runs.push_back(MergeCursor::PartRun{batch.parts.get(), batch.ordered});
  }
  return runs;
}

// What a merge of `inputs` (adjacent batches of `state`) writes: its
// description, and the time every earlier time advances to (since, clamped
// into the description), so that every read at an as_of >= since sees the
// same collection.
struct MergeShape {
  Description desc;
  Time advance_to = 0;
};
MergeShape merge_shape(const ShardState& state, std::span<const HollowBatch> inputs) {
  const Description desc{inputs.front().desc.lower, inputs.back().desc.upper, state.since};
  const Time cap = desc.upper.is_closed() ? UINT64_MAX : desc.upper.time() - 1;
  return MergeShape{desc, state.since.is_closed() ? cap : std::min(state.since.time(), cap)};
}

bool all_inline(std::span<const HollowBatch> batches) {
  return std::all_of(batches.begin(), batches.end(), [](const HollowBatch& b) {
    return std::all_of(b.parts.begin(), b.parts.end(),
                       [](const PartRef& p) { return p.is_inline(); });
  });
}

std::uint64_t total_bytes(std::span<const HollowBatch> batches) {
  std::uint64_t bytes = 0;
  for (const HollowBatch& batch : batches) bytes += batch.bytes();
  return bytes;
}

// Where a pass looks for merges: the whole spine, or (a tail pass) only
// above the merge this process's compactor has in flight (nothing once it
// has none).
std::optional<std::size_t> first_batch(const ShardContext& context, const ShardState& state,
                                       bool tail) {
  if (!tail) return 0;
  return context.first_above_merge(state);
}

// One merge, if the spine needs one. False when it is in shape, or when
// this merge was the pass's last (`last`, or the spine in shape after it):
// its commit removed the pass's writer. A `tail` pass merges above the
// compactor's merge in flight only (ShardContext::begin_merge).
Result<bool> merge_once(ShardContext& context, PassWriter& writer, bool last, bool tail,
                        CompactionReport& report, const std::function<bool()>& stop) {
  TM_ASSIGN(StatePtr state, context.machine->fetch());
  const std::optional<std::size_t> first = first_batch(context, *state, tail);
  if (!first) return false;
  const std::optional<MergeRequest> request = next_merge(*state, context.spine_rules(), *first);
  if (!request) return false;
  const std::span<const HollowBatch> requested(state->batches.data() + request->begin,
                                               request->end - request->begin);
  TM_ASSIGN(const MergeRequest fitted, fit_merge(*context.read_blob, requested));
  const std::vector<HollowBatch> inputs(
      requested.begin() + static_cast<std::ptrdiff_t>(fitted.begin),
      requested.begin() + static_cast<std::ptrdiff_t>(fitted.end));
  // A tail pass holds the open blocks of small inputs only (beside the
  // running pass's merge): larger ones are the running pass's next.
  if (tail && total_bytes(inputs) > kTailMergeMaxBytes) return false;
  const auto [desc, advance_to] = merge_shape(*state, inputs);

  // Inline inputs only, while the state's inline parts are below the drain
  // mark: a small output stays inline (no file), and the state's inline
  // bytes do not grow (one part of the merged updates is no larger than
  // the parts they came from). A drain writes to blob.
  const bool keep_inline =
      all_inline(inputs) && inline_bytes(*state) < context.inline_drain_bytes();
  // Small inputs: an inline output without registering (try_unregistered).
  const bool unregistered =
      keep_inline && !writer.registered() &&
      try_unregistered(total_bytes(inputs), inputs.size(), context.inline_merge_max_bytes());
  // Registering first, then reading the state again: the hold must be at or
  // below the version the merge reads.
  auto register_and_retry = [&]() -> Result<bool> {
    TM_TRY(writer.open());
    return merge_once(context, writer, last, tail, report, stop);
  };
  if (!unregistered && !writer.registered()) return register_and_retry();
  const InlineOutput inline_output = unregistered  ? InlineOutput::kOnly
                                     : keep_inline ? InlineOutput::kWhenSmall
                                                   : InlineOutput::kNever;
  // Meanwhile appends and a tail pass merge above these inputs only.
  struct MergeInFlight {
    ShardContext* context;
    ~MergeInFlight() {
      if (context != nullptr) context->end_merge();
    }
  } in_flight{tail ? nullptr : &context};
  if (!tail) context.begin_merge(inputs.back().desc.upper);
  RunWriter out(
      context, writer.id(), desc, [&] { return writer.keep_alive(); }, inline_output);
  if (auto merged = merge_into(context, merge_runs(inputs), advance_to, out, "a compaction", stop);
      !merged) {
    out.drop();
    // Stopped: the inputs are untouched and the pass ends.
    if (merged.error().is(ErrorKind::kClosed) && stop && stop()) return false;
    if (unregistered && merged.error().is(ErrorKind::kTooLarge)) return register_and_retry();
    return std::unexpected(merged.error());
  }
  const HollowBatch output{desc, PartList(out.written()), true};
  CompactionOutcome outcome = CompactionOutcome::kInputsGone;
  bool leaving = false;
  const std::uint64_t now = wall_clock_millis();
  auto applied = writer.commit([&](ShardState& s) -> Result<TransitionResult> {
    TM_ASSIGN(outcome, apply_compaction(s, unregistered ? "" : writer.id(), inputs, output, now));
    if (outcome != CompactionOutcome::kApplied) return TransitionResult::kUnchanged;
    const std::optional<std::size_t> next_first = first_batch(context, s, tail);
    leaving = last || !next_first || !next_merge(s, context.spine_rules(), *next_first);
    if (!writer.registered()) return TransitionResult::kWrite;
    if (leaving) {
      writer.leave(s, now);
    } else {
      TM_TRY(writer.step(s, now));
    }
    return TransitionResult::kWrite;
  });
  if (!applied) {
    // Maybe registered: garbage collection sorts it out once this writer
    // is gone.
    if (!applied.error().is(ErrorKind::kIndeterminate)) out.drop();
    return std::unexpected(applied.error());
  }
  if (outcome == CompactionOutcome::kInputsGone) {
    // (kAlreadyApplied is our own earlier attempt: registered, keep it.)
    out.drop();
    ++report.merges_lost;
    return true;
  }
  ++report.merges;
  report.batches_merged += inputs.size();
  report.parts_written += output.parts.size();
  report.bytes_written += out.bytes();
  if (outcome == CompactionOutcome::kAlreadyApplied || !writer.registered()) return !leaving;
  if (leaving) {
    writer.left();
    return false;
  }
  writer.stepped(**applied, now);
  return true;
}

}  // namespace

Result<MergeRequest> fit_merge(Blob& blob, std::span<const HollowBatch> inputs,
                               std::uint64_t budget) {
  const std::vector<MergeCursor::PartRun> runs = merge_runs(inputs);
  // The parts' references alone first: they settle small merges without I/O.
  TM_ASSIGN(std::vector<std::uint64_t> blocks, open_block_bytes(blob, runs, false));
  std::uint64_t total = 0;
  for (std::uint64_t input : blocks) total += input;
  if (total <= budget) return MergeRequest{0, inputs.size()};
  TM_ASSIGN(blocks, open_block_bytes(blob, runs, true));
  // data[i]: the encoded bytes of inputs [0, i), to compare windows.
  std::vector<std::uint64_t> data(inputs.size() + 1, 0);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    data[i + 1] = data[i] + inputs[i].bytes();
  }
  // For each first input, the longest window from it that fits (two at
  // least); the longest of those, then the one with the least data.
  MergeRequest best{0, 2};
  for (std::size_t begin = 0; begin + 2 <= inputs.size(); ++begin) {
    std::size_t end = begin + 2;
    std::uint64_t bytes = blocks[begin] + blocks[begin + 1];
    while (end < inputs.size() && bytes + blocks[end] <= budget) bytes += blocks[end++];
    const std::size_t length = end - begin, best_length = best.end - best.begin;
    if (length > best_length ||
        (length == best_length && data[end] - data[begin] < data[best.end] - data[best.begin])) {
      best = MergeRequest{begin, end};
    }
  }
  return best;
}

int merge_inline_tail(ShardContext& context, ShardState& state, std::uint64_t now_ms) {
  int merges = 0;
  while (inline_bytes(state) < context.inline_drain_bytes()) {
    // Above the compactor's merge in flight, if any (ShardContext::begin_merge).
    const std::size_t first = context.first_above_merge(state).value_or(0);
    const std::optional<MergeRequest> request = next_merge(state, context.spine_rules(), first);
    if (!request) break;
    // Copies: apply_compaction finds them in the state it changes.
    const std::vector<HollowBatch> inputs(
        state.batches.begin() + static_cast<std::ptrdiff_t>(request->begin),
        state.batches.begin() + static_cast<std::ptrdiff_t>(request->end));
    std::uint64_t payload = 0;
    for (const HollowBatch& batch : inputs) payload += batch.payload_bytes();
    if (!all_inline(inputs) || total_bytes(inputs) > context.inline_merge_max_bytes() ||
        payload > kInlineTailMergePayloadBytes) {
      break;
    }
    const auto [desc, advance_to] = merge_shape(state, inputs);
    // Named after no writer of the shard's: the part is never in the blob
    // store, and its key only has to be unique.
    RunWriter out(context, "m", desc, {}, InlineOutput::kOnly);
    // TooLarge (the merged part did not fit inline) or a corrupt inline
    // part: the compactor's merge meets the case and says so.
    if (!merge_into(context, merge_runs(inputs), advance_to, out, "an inline merge")) break;
    const HollowBatch output{desc, PartList(out.written()), true};
    auto applied = apply_compaction(state, "", inputs, output, now_ms);
    if (!applied || *applied != CompactionOutcome::kApplied) break;
    ++merges;
  }
  return merges;
}

namespace {

Result<CompactionReport> compact(ShardContext& context, bool tail,
                                 const std::function<bool()>& stop, PassCommits commits) {
  CompactionReport report;
  TM_ASSIGN(StatePtr state, context.machine->fetch());
  const std::optional<std::size_t> first = first_batch(context, *state, tail);
  if (!first || !next_merge(*state, context.spine_rules(), *first)) return report;
  PassWriter writer(context, commits);  // registers when a merge may write to blob
  for (int i = 0; i < kMaxMergesPerPass && !(stop && stop()); ++i) {
    TM_ASSIGN(bool merged,
              merge_once(context, writer, i + 1 == kMaxMergesPerPass, tail, report, stop));
    if (!merged) break;
  }
  return report;
}

}  // namespace

Result<CompactionReport> compact_shard(ShardContext& context, const std::function<bool()>& stop,
                                       PassCommits commits) {
  return compact(context, /*tail=*/false, stop, commits);
}

Result<CompactionReport> compact_shard_tail(ShardContext& context,
                                            const std::function<bool()>& stop,
                                            PassCommits commits) {
  return compact(context, /*tail=*/true, stop, commits);
}

ShardContext::ShardContext() = default;
ShardContext::~ShardContext() {
  closing->store(true);
  compactor.reset();
}

Result<StatePtr> ShardContext::fetch_for_read() {
  return with_retries(
      options.read_retry, [&] { return machine->fetch(); }, stop_reads());
}

std::optional<std::size_t> ShardContext::first_above_merge(const ShardState& state) const {
  std::lock_guard lock(merging_mu_);
  if (!merging_through_) return std::nullopt;
  return first_batch_from(state, *merging_through_);
}

std::function<bool()> ShardContext::stop_reads() const {
  return [flag = closing] { return flag->load(); };
}

void ShardContext::request_compaction(const ShardState& state) {
  if (!compactor || !next_merge(state, spine_rules())) return;
  const std::optional<std::size_t> first = first_above_merge(state);
  const bool tail_due = first && next_merge(state, spine_rules(), *first);
  DeferCompactionRequests* scope = DeferCompactionRequests::current();
  if (scope && scope->defer(this, tail_due)) return;
  compactor->request(tail_due);
}

namespace {
thread_local DeferCompactionRequests* innermost_deferral = nullptr;
}  // namespace

DeferCompactionRequests::DeferCompactionRequests() : outer_(innermost_deferral) {
  innermost_deferral = this;
}

DeferCompactionRequests::~DeferCompactionRequests() {
  innermost_deferral = outer_;
  if (pending_) pending_->compactor->request(pending_tail_);
}

DeferCompactionRequests* DeferCompactionRequests::current() {
  return innermost_deferral;
}

bool DeferCompactionRequests::defer(ShardContext* context, bool tail_due) {
  if (pending_ && pending_ != context) return false;
  pending_ = context;
  pending_tail_ = pending_tail_ || tail_due;
  return true;
}

struct BackgroundCompactor::Shared {
  ShardContext* context;  // valid until `stopping` (the destructor waits for a pass)
  std::mutex mu;
  std::condition_variable idle;
  bool requested = false;           // GUARDED_BY(mu)
  bool queued = false;              // GUARDED_BY(mu): a pass is queued or running
  bool running = false;             // GUARDED_BY(mu)
  bool tail_queued = false;         // GUARDED_BY(mu): a tail pass is queued or running
  bool tail_running = false;        // GUARDED_BY(mu)
  bool stopping = false;            // GUARDED_BY(mu)
  std::uint64_t last_gc_ms = 0;     // GUARDED_BY(mu)
  std::optional<Error> last_error;  // GUARDED_BY(mu)

  // Queues a pass. REQUIRES: mu held, !queued.
  static void queue_locked(const std::shared_ptr<Shared>& shared) {
    shared->queued = true;
    Status submitted = WorkPool::compaction().submit([shared] { pass(shared); });
    if (!submitted) {
      // No thread to be had: compaction waits for the next request (the
      // next append asks again), and says why meanwhile.
      shared->queued = false;
      shared->last_error = submitted.error();
    }
  }

  // True once the compactor is stopping: what a pass checks between (and
  // within) its merges.
  static std::function<bool()> stopping_check(const std::shared_ptr<Shared>& shared) {
    return [raw = shared.get()] {
      std::lock_guard stop_lock(raw->mu);
      return raw->stopping;
    };
  }

  // Queues a tail pass. REQUIRES: mu held, !tail_queued.
  static void queue_tail_locked(const std::shared_ptr<Shared>& shared) {
    shared->tail_queued = true;
    if (!WorkPool::compaction().submit([shared] { tail_pass(shared); })) {
      shared->tail_queued = false;  // the main pass gets to the tail later
    }
  }

  // Merges above the main pass's merge in flight while it runs
  // (compact_shard_tail); no garbage collection, no pass queued after it.
  static void tail_pass(const std::shared_ptr<Shared>& shared) {
    std::unique_lock lock(shared->mu);
    if (shared->stopping) {
      shared->tail_queued = false;
      return;
    }
    shared->tail_running = true;
    lock.unlock();
    auto compacted =
        compact_shard_tail(*shared->context, stopping_check(shared), PassCommits::kRideAppends);
    lock.lock();
    if (!compacted) shared->last_error = compacted.error();
    shared->tail_running = false;
    shared->tail_queued = false;
    shared->idle.notify_all();
  }

  static void pass(const std::shared_ptr<Shared>& shared) {
    std::unique_lock lock(shared->mu);
    if (shared->stopping) {
      shared->queued = false;
      return;
    }
    shared->requested = false;
    shared->running = true;
    lock.unlock();
    const std::function<bool()> stop = stopping_check(shared);
    ShardContext& context = *shared->context;
    auto compacted = compact_shard(context, stop, PassCommits::kRideAppends);
    std::optional<Error> error;
    if (!compacted) error = compacted.error();
    const std::uint64_t now = wall_clock_millis();
    bool collect = false;
    {
      std::lock_guard gc_lock(shared->mu);
      if (compacted && compacted->merges > 0 && now >= shared->last_gc_ms + 1000) {
        shared->last_gc_ms = now;
        collect = true;
      }
    }
    if (collect) {
      auto collected = collect_garbage(context, stop);
      if (!collected) error = collected.error();
    }
    lock.lock();
    if (error) shared->last_error = std::move(error);
    shared->running = false;
    shared->queued = false;
    // A request during the pass (or a pass cut at kMaxMergesPerPass with
    // more to do, which the next append asks for) queues the next one,
    // behind the other shards' passes.
    if (shared->requested && !shared->stopping) queue_locked(shared);
    shared->idle.notify_all();
  }
};

BackgroundCompactor::BackgroundCompactor(ShardContext* context)
    : shared_(std::make_shared<Shared>()) {
  shared_->context = context;
}

BackgroundCompactor::~BackgroundCompactor() {
  std::unique_lock lock(shared_->mu);
  shared_->stopping = true;
  shared_->idle.wait(lock, [&] { return !shared_->running && !shared_->tail_running; });
}

void BackgroundCompactor::request(bool tail_due) {
  std::lock_guard lock(shared_->mu);
  if (shared_->stopping) return;
  shared_->requested = true;
  if (!shared_->queued) {
    Shared::queue_locked(shared_);
  } else if (tail_due && shared_->running && !shared_->tail_queued) {
    Shared::queue_tail_locked(shared_);
  }
}

std::optional<Error> BackgroundCompactor::last_error() {
  std::lock_guard lock(shared_->mu);
  return shared_->last_error;
}

}  // namespace tidemark
