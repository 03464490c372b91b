#include "sink/runner.h"

#include <thread>

#include "sink/diff_pairs.h"
#include "tidemark/read.h"

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

enum class Wait : std::uint8_t { kReady, kStopped, kDeadline };

// How often a long wait asks options.stop.
constexpr std::chrono::milliseconds kStopCheck{50};

// Waits until the shard's upper passes `time`: kStopped if the sink is
// stopped or the shard closed first, kDeadline at `deadline` (if set).
Result<Wait> wait_for_upper_past(
    Shard& shard, Time time, const SinkOptions& options,
    std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt) {
  // With an interval to commit by `deadline`, every poll_interval; with
  // nothing pending, the wait doubles up to idle_poll_interval, so idle
  // sinks cost little (each poll reads the shard's state).
  auto wait = options.poll_interval;
  const auto longest = deadline ? options.poll_interval
                                : std::max(options.poll_interval, options.idle_poll_interval);
  for (;;) {
    TM_ASSIGN(Frontier upper, upper_of(shard, options));
    if (upper.is_past(time)) return Wait::kReady;
    if (upper.is_closed() || stopped(options)) return Wait::kStopped;
    if (deadline && std::chrono::steady_clock::now() >= *deadline) return Wait::kDeadline;
    if (options.sleep) {
      options.sleep(wait);  // returns early once the sink is stopped
    } else {
      const auto until = std::chrono::steady_clock::now() + wait;
      for (auto now = std::chrono::steady_clock::now(); now < until;
           now = std::chrono::steady_clock::now()) {
        if (stopped(options)) return Wait::kStopped;
        std::this_thread::sleep_for(
            std::min<std::chrono::steady_clock::duration>(until - now, kStopCheck));
      }
    }
    wait = std::min(wait * 2, longest);
  }
}

}  // namespace

Result<SinkProgress> run_sink(Shard& shard, SinkDestination& destination,
                              const SinkOptions& options) {
  if (options.sink_name.empty()) return invalid_usage("a sink needs a name");
  TM_ASSIGN(auto reader, shard.open_critical_reader("sink-" + options.sink_name));
  SinkProgress progress;
  progress.frontier = destination.progress().value_or(Frontier::at(0));
  auto report = [&] {
    progress.primary_key_violations = destination.primary_key_violations();
    if (options.on_progress) options.on_progress(progress);
  };
  auto done = [&] { return options.until && !(progress.frontier < Frontier::at(*options.until)); };

  if (!destination.progress()) {
    // The snapshot, once: at as_of, committed as [0, as_of + 1).
    Time as_of = options.as_of.value_or(0);
    TM_ASSIGN(Wait ready, wait_for_upper_past(shard, as_of, options));
    if (ready != Wait::kReady) return progress;
    if (!options.as_of) {
      TM_ASSIGN(Frontier upper, upper_of(shard, options));
      if (!upper.is_closed()) as_of = upper.time() - 1;
    }
    TM_ASSIGN(DiffPairWalker walker,
              DiffPairWalker::open([&]() -> Result<std::unique_ptr<UpdateSource>> {
                TM_ASSIGN(SnapshotCursor cursor, shard.snapshot(as_of));
                return std::make_unique<SnapshotSource>(std::move(cursor));
              }));
    progress.target = Frontier::at(as_of + 1);
    progress.snapshot = true;
    TM_TRY(destination.begin(Frontier::at(0)));
    TM_TRY(emit_all(walker, destination, progress, options));
    TM_TRY(destination.commit(Frontier::at(as_of + 1)));
    ++progress.commits;
    progress.frontier = Frontier::at(as_of + 1);
    progress.snapshot = false;
    TM_TRY(with_retries(
        options.retry, [&] { return reader->downgrade_since(Frontier::at(as_of)); }, options.stop));
    report();
  }

  // Then the changes, one interval [frontier, upper) at a time, committed
  // by size or age.
  bool interval_open = false;
  auto opened_at = std::chrono::steady_clock::now();
  Frontier written = progress.frontier;  // pairs below it are in the open interval
  auto commit = [&]() -> Status {
    TM_TRY(destination.commit(written));
    interval_open = false;
    ++progress.commits;
    progress.frontier = written;
    TM_TRY(with_retries(
        options.retry, [&] { return reader->downgrade_since(Frontier::at(written.time() - 1)); },
        options.stop));
    report();
    return {};
  };
  while (!done() && !stopped(options)) {
    const Time from = written.time();
    // An open interval is committed once it is commit_interval old, even
    // if the shard's upper does not move again.
    std::optional<std::chrono::steady_clock::time_point> commit_by;
    if (interval_open) commit_by = opened_at + options.commit_interval;
    TM_ASSIGN(Wait ready, wait_for_upper_past(shard, from, options, commit_by));
    if (ready == Wait::kStopped) break;
    if (ready == Wait::kDeadline) {
      TM_TRY(commit());
      continue;
    }
    TM_ASSIGN(Frontier upper, upper_of(shard, options));
    Time target = upper.is_closed() ? UINT64_MAX : upper.time();
    if (options.until) target = std::min(target, *options.until);
    if (target <= from) break;
    // listen(from - 1, target): the updates at times in [from, target).
    if (from == 0) return invalid_usage("a sink cannot follow from time 0 without a snapshot");
    TM_ASSIGN(DiffPairWalker walker,
              DiffPairWalker::open([&]() -> Result<std::unique_ptr<UpdateSource>> {
                TM_ASSIGN(auto listener, shard.listen(from - 1, target));
                return std::make_unique<ListenSource>(std::move(listener));
              }));
    if (!interval_open) {
      TM_TRY(destination.begin(written));
      interval_open = true;
      opened_at = std::chrono::steady_clock::now();
    }
    progress.target = Frontier::at(target);
    TM_TRY(emit_all(walker, destination, progress, options));
    written = Frontier::at(target);
    const bool big = destination.open_bytes() >= options.roll_bytes;
    const bool old = std::chrono::steady_clock::now() - opened_at >= options.commit_interval;
    if (big || old || (options.until && target >= *options.until)) TM_TRY(commit());
  }
  if (interval_open && progress.frontier < written) TM_TRY(commit());
  return progress;
}

}  // namespace tidemark
