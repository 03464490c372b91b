#include <xxhash.h>

#include <thread>

#include "sink/diff_pairs.h"
#include "tidemark/read.h"
#include "tidemark/sink.h"
#include "util/try.h"

namespace tidemark {
namespace {

// A snapshot at as_of as an update source: every row at time as_of.
class SnapshotSource final : public UpdateSource {
 public:
  explicit SnapshotSource(SnapshotCursor cursor) : cursor_(std::move(cursor)) {}
  Result<std::optional<UpdateView>> next() override {
    TM_ASSIGN(auto row, cursor_.next());
    if (!row) return std::optional<UpdateView>{};
    return std::optional<UpdateView>{UpdateView{row->key, row->value, cursor_.as_of(), row->diff}};
  }

 private:
  SnapshotCursor cursor_;
};

// The updates of a listen that ends at `until`, without its progress events:
// time-major, and within a time sorted by (key, value).
class ListenSource final : public UpdateSource {
 public:
  explicit ListenSource(std::unique_ptr<Listener> listener) : listener_(std::move(listener)) {}
  Result<std::optional<UpdateView>> next() override {
    for (;;) {
      TM_ASSIGN(auto event, listener_->next());
      if (!event) return std::optional<UpdateView>{};
      if (event->kind == ListenEvent::Kind::kUpdate) {
        return std::optional<UpdateView>{
            UpdateView{event->key, event->value, event->time, event->diff}};
      }
    }
  }

 private:
  std::unique_ptr<Listener> listener_;
};

Status emit_all(DiffPairWalker& walker, SinkDestination& destination, SinkProgress& progress,
                const SinkOptions& options) {
  for (;;) {
    TM_ASSIGN(auto pair, walker.next());
    if (!pair) return {};
    TM_TRY(destination.write(*pair));
    if (++progress.pairs % SinkOptions::kTickPairs == 0 && options.on_tick) {
      options.on_tick(progress);
    }
  }
}

bool stopped(const SinkOptions& options) {
  return options.stop && options.stop();
}

// The shard's upper, retrying failures that may pass.
Result<Frontier> upper_of(Shard& shard, const SinkOptions& options) {
  return with_retries(
      options.retry, [&] { return shard.upper(); }, options.stop);
}

// How often a long wait asks options.stop (without options.sleep).
constexpr std::chrono::milliseconds kStopCheck{50};

void sleep_for(const SinkOptions& options, std::chrono::milliseconds duration) {
  if (options.sleep) {
    options.sleep(duration);  // returns early once the sink is stopped
    return;
  }
  const auto until = std::chrono::steady_clock::now() + duration;
  for (auto now = std::chrono::steady_clock::now(); now < until && !stopped(options);
       now = std::chrono::steady_clock::now()) {
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(until - now, kStopCheck));
  }
}

using Next = std::optional<std::chrono::milliseconds>;
constexpr std::chrono::milliseconds kAtOnce{0};

}  // namespace

std::uint64_t snapshot_pair_check(std::string_view key, std::uint64_t key_pairs) {
  return XXH3_64bits_withSeed(key.data(), key.size(), key_pairs);
}

// The snapshot being written: its walk, and how far it has got (the pairs
// committed and those in the open part).
struct SinkRun::Snapshot {
  Time as_of = 0;
  DiffPairWalker walker;
  SnapshotPosition position;
  std::uint64_t part_pairs = 0;  // pairs in the open part
};

SinkRun::SinkRun(Shard& shard, SinkDestination& destination, SinkOptions options,
                 std::unique_ptr<ReadHandle> reader)
    : shard_(shard),
      destination_(destination),
      options_(std::move(options)),
      reader_(std::move(reader)),
      snapshot_done_(destination.progress().has_value()),
      committed_at_(std::chrono::steady_clock::now()),
      wait_(options_.poll_interval) {
  progress_.frontier = destination.progress().value_or(Frontier::at(0));
  written_ = progress_.frontier;
}

SinkRun::~SinkRun() = default;

Result<std::unique_ptr<SinkRun>> SinkRun::open(Shard& shard, SinkDestination& destination,
                                               SinkOptions options) {
  if (options.sink_name.empty()) return invalid_usage("a sink needs a name");
  TM_ASSIGN(auto reader, shard.open_critical_reader("sink-" + options.sink_name));
  return std::unique_ptr<SinkRun>(
      new SinkRun(shard, destination, std::move(options), std::move(reader)));
}

std::optional<std::chrono::steady_clock::time_point> SinkRun::idle_since() const {
  if (!snapshot_done_ || interval_open_) return std::nullopt;
  return committed_at_;
}

// After each commit.
void SinkRun::report() {
  committed_at_ = std::chrono::steady_clock::now();
  progress_.primary_key_violations = destination_.primary_key_violations();
  if (options_.on_progress) options_.on_progress(progress_);
}

// The wait before the next poll while nothing is pending: with an interval
// to commit by `deadline`, every poll_interval (and never past it); with
// nothing open, doubling up to idle_poll_interval, so idle sinks cost
// little (each poll reads the shard's state).
std::chrono::milliseconds SinkRun::backoff(
    std::optional<std::chrono::steady_clock::time_point> deadline) {
  if (deadline) {
    wait_ = options_.poll_interval;
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now());
    return std::clamp(left, kAtOnce, options_.poll_interval);
  }
  const auto now = wait_;
  wait_ = std::min(wait_ * 2, std::max(options_.poll_interval, options_.idle_poll_interval));
  return now;
}

Result<Next> SinkRun::step() {
  return snapshot_done_ ? follow_step() : snapshot_step();
}

// Opens the snapshot at as_of; when resuming, skips the pairs that the
// destination's committed parts hold. The skip reads them again (time in
// what is committed) but keeps nothing of them: the pairs are counted, and
// the last one skipped must be the position's (its key, and key_pairs as
// its index in its key plus one), or the snapshot at as_of is not the one
// the parts were cut from.
Status SinkRun::open_snapshot(Time as_of) {
  const std::optional<SnapshotPosition> resumed = destination_.snapshot_position();
  TM_ASSIGN(DiffPairWalker walker,
            DiffPairWalker::open([&]() -> Result<std::unique_ptr<UpdateSource>> {
              TM_ASSIGN(SnapshotCursor cursor, shard_.snapshot(as_of, options_.read_memory));
              return std::make_unique<SnapshotSource>(std::move(cursor));
            }));
  auto snapshot = std::make_unique<Snapshot>(Snapshot{as_of, std::move(walker), {}, 0});
  snapshot->position.as_of = as_of;
  if (resumed) {
    auto mismatch = [&](const std::string& what) {
      const std::string last =
          resumed->check ? "the last one's check " + std::to_string(*resumed->check)
                         : "the last the " + std::to_string(resumed->key_pairs) + "th of its key";
      return corruption("sink " + options_.sink_name + ": the snapshot at " +
                        std::to_string(as_of) + " " + what + " than its committed parts (" +
                        std::to_string(resumed->pairs) + " pairs, " + last + ")");
    };
    snapshot->position = *resumed;
    for (std::uint64_t skipped = 0; skipped < resumed->pairs; ++skipped) {
      TM_ASSIGN(auto pair, snapshot->walker.next());
      if (!pair) return mismatch("has fewer pairs");
      if (skipped + 1 != resumed->pairs) continue;
      const bool same =
          resumed->check
              ? snapshot_pair_check(pair->key, pair->index_in_group + 1) == *resumed->check
              : pair->key == resumed->key && pair->index_in_group + 1 == resumed->key_pairs;
      if (!same) return mismatch("has other pairs");
      // A destination that kept only the check gets the key back here: the
      // next part may go on inside this key.
      snapshot->position.key.assign(pair->key);
      snapshot->position.key_pairs = pair->index_in_group + 1;
      snapshot->position.check.reset();
    }
  }
  snapshot_ = std::move(snapshot);
  return {};
}

Status SinkRun::commit_snapshot_part() {
  TM_TRY(destination_.commit_snapshot_part(snapshot_->position));
  interval_open_ = false;
  ++progress_.commits;
  report();
  return {};
}

// The snapshot: at as_of, committed as [0, as_of + 1); into a destination
// that commits it in parts, one bounded part per step.
Result<Next> SinkRun::snapshot_step() {
  if (!snapshot_) {
    // A snapshot in progress is resumed at its as_of: the sink's hold has
    // not moved since it began, so it is still readable.
    const std::optional<SnapshotPosition> resumed = destination_.snapshot_position();
    Time as_of = resumed ? resumed->as_of : options_.as_of.value_or(0);
    TM_ASSIGN(Frontier upper, upper_of(shard_, options_));
    if (!upper.is_past(as_of)) {
      if (upper.is_closed()) return Next{};
      return Next{backoff(std::nullopt)};
    }
    if (!resumed && !options_.as_of && !upper.is_closed()) as_of = upper.time() - 1;
    TM_TRY(open_snapshot(as_of));
    progress_.target = Frontier::at(as_of + 1);
    progress_.snapshot = true;
  }
  Snapshot& snapshot = *snapshot_;
  if (!interval_open_) {
    TM_TRY(destination_.begin(Frontier::at(0)));
    interval_open_ = true;
    opened_at_ = std::chrono::steady_clock::now();
    snapshot.part_pairs = 0;
  }
  const bool in_parts = destination_.commits_snapshot_in_parts();
  for (;;) {
    TM_ASSIGN(auto pair, snapshot.walker.next());
    if (!pair) break;
    TM_TRY(destination_.write(*pair));
    SnapshotPosition& position = snapshot.position;
    if (pair->index_in_group == 0) {  // the first pair of a key
      position.key.assign(pair->key);
      position.key_pairs = 0;
    }
    ++position.key_pairs;
    ++position.pairs;
    ++snapshot.part_pairs;
    if (++progress_.pairs % SinkOptions::kTickPairs == 0 && options_.on_tick) {
      options_.on_tick(progress_);
    }
    if (in_parts &&
        (destination_.open_bytes() >= options_.snapshot_part_bytes ||
         std::chrono::steady_clock::now() - opened_at_ >= options_.snapshot_part_interval)) {
      TM_TRY(commit_snapshot_part());
      return Next{kAtOnce};
    }
  }
  const Time as_of = snapshot.as_of;
  TM_TRY(destination_.commit(Frontier::at(as_of + 1)));
  interval_open_ = false;
  snapshot_.reset();
  ++progress_.commits;
  progress_.frontier = Frontier::at(as_of + 1);
  progress_.snapshot = false;
  written_ = progress_.frontier;
  snapshot_done_ = true;
  wait_ = options_.poll_interval;
  // Only now may the since pass as_of: a snapshot in progress is read
  // again at as_of by a restarted sink.
  TM_TRY(with_retries(
      options_.retry, [&] { return reader_->downgrade_since(Frontier::at(as_of)); },
      options_.stop));
  report();
  return Next{kAtOnce};
}

Status SinkRun::commit() {
  TM_TRY(destination_.commit(written_));
  interval_open_ = false;
  ++progress_.commits;
  progress_.frontier = written_;
  TM_TRY(with_retries(
      options_.retry, [&] { return reader_->downgrade_since(Frontier::at(written_.time() - 1)); },
      options_.stop));
  report();
  return {};
}

Status SinkRun::finish() {
  if (snapshot_) {
    // A part of a snapshot, when the destination takes parts.
    if (interval_open_ && snapshot_->part_pairs > 0 && destination_.commits_snapshot_in_parts()) {
      TM_TRY(commit_snapshot_part());
    }
    return {};
  }
  if (interval_open_ && progress_.frontier < written_) TM_TRY(commit());
  return {};
}

// The changes, one interval [frontier, upper) at a time, committed by size
// or age.
Result<Next> SinkRun::follow_step() {
  if (options_.until && !(written_ < Frontier::at(*options_.until))) {
    TM_TRY(finish());
    return Next{};
  }
  const Time from = written_.time();
  TM_ASSIGN(Frontier upper, upper_of(shard_, options_));
  if (!upper.is_past(from)) {
    if (upper.is_closed()) {
      TM_TRY(finish());
      return Next{};
    }
    if (!interval_open_) return Next{backoff(std::nullopt)};
    // An open interval is committed once it is commit_interval old, even
    // if the shard's upper does not move again.
    const auto commit_by = opened_at_ + options_.commit_interval;
    if (std::chrono::steady_clock::now() >= commit_by) {
      TM_TRY(commit());
      return Next{kAtOnce};
    }
    return Next{backoff(commit_by)};
  }
  wait_ = options_.poll_interval;
  Time target = upper.is_closed() ? UINT64_MAX : upper.time();
  if (options_.until) target = std::min(target, *options_.until);
  if (target <= from) {
    TM_TRY(finish());
    return Next{};
  }
  // listen(from - 1, target): the updates at times in [from, target).
  if (from == 0) return invalid_usage("a sink cannot follow from time 0 without a snapshot");
  TM_ASSIGN(DiffPairWalker walker,
            DiffPairWalker::open([&]() -> Result<std::unique_ptr<UpdateSource>> {
              TM_ASSIGN(auto listener, shard_.listen(from - 1, target, options_.read_memory));
              return std::make_unique<ListenSource>(std::move(listener));
            }));
  if (!interval_open_) {
    TM_TRY(destination_.begin(written_));
    interval_open_ = true;
    opened_at_ = std::chrono::steady_clock::now();
  }
  progress_.target = Frontier::at(target);
  TM_TRY(emit_all(walker, destination_, progress_, options_));
  written_ = Frontier::at(target);
  const bool big = destination_.open_bytes() >= options_.roll_bytes;
  const bool old = std::chrono::steady_clock::now() - opened_at_ >= options_.commit_interval;
  if (big || old || (options_.until && target >= *options_.until)) TM_TRY(commit());
  return Next{kAtOnce};
}

Result<SinkProgress> run_sink(Shard& shard, SinkDestination& destination,
                              const SinkOptions& options) {
  TM_ASSIGN(auto run, SinkRun::open(shard, destination, options));
  for (;;) {
    if (stopped(options)) {
      TM_TRY(run->finish());
      break;
    }
    TM_ASSIGN(Next next, run->step());
    if (!next) break;
    if (next->count() > 0) sleep_for(options, *next);
  }
  return run->progress();
}

}  // namespace tidemark
