// Shard::listen: updates after a ListenStart in time order, with progress.
//
// The listener walks the shard's batches in order. For each batch it emits
// the updates in the part of the batch it has not emitted yet (its window),
// in (time, key, value) order, consolidated: a window of one time streams
// straight from the merge (already sorted by key and value); a wider one
// is read once through the merge into a TimeSorter (time_sorter.h), an
// external sort: runs of at most listen_buffer_bytes, spilled to scratch
// files in ClientOptions::scratch_directory when the window does not fit
// one run, then merged at most 64 at a time. So a batch of any size costs
// O(n log n) time and bounded memory: the merge's blocks, plus the
// sorter's listen_buffer_bytes and at most 65 x 64 KiB of merge buffers
// (time_sorter.h gives the bound), charged to the listen's ReadMemory.
// A wider window whose read or sort fails has emitted nothing, and the
// next poll reads it again from its start; a failure while its updates go
// out (reading a scratch file back) is returned by every later poll, so a
// stream never skips.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "shard/change_watch.h"
#include "shard/context.h"
#include "shard/merge.h"
#include "shard/read_internal.h"
#include "shard/state.h"
#include "shard/time_sorter.h"
#include "tidemark/read.h"
#include "util/try.h"

namespace tidemark {
namespace {

class ShardListener final : public Listener {
 public:
  ShardListener(std::shared_ptr<ShardContext> context, ListenStart start, std::optional<Time> until,
                ReaderPins::Pin pin, std::unique_ptr<ReadHandle> owner, ReadMemory memory,
                std::unique_ptr<ListenShare> share)
      : context_(std::move(context)),
        memory_(std::move(memory)),
        start_(start),
        until_(until),
        reported_(start.claimed()),
        pending_progress_(start.claimed()),
        pin_(std::move(pin)),
        owner_(std::move(owner)),
        share_(std::move(share)) {
    if (start_.lower().is_closed() || (until_ && !(reported_ < Frontier::at(*until_)))) {
      done_ = true;
    }
  }

  ~ShardListener() override {
    if (watch_id_) context_->changes->unsubscribe(*watch_id_);
    merge_.reset();
    sorted_.reset();
    windows_.clear();
    pin_ = ReaderPins::Pin();
    owner_.reset();
    share_.reset();  // the last share drops the shared reader
  }

  Result<std::optional<ListenEvent>> next() override {
    // One result, returned as it is: poll() makes each event in place.
    Result<std::optional<ListenEvent>> event = poll();
    while (event && !*event && !done_) {
      if (!watch_id_) {
        std::this_thread::sleep_for(context_->options.listen_poll_interval);
      } else {
        std::unique_lock lock(wakes_->mu);
        wakes_->cv.wait_until(lock, next_look_, [&] { return wakes_->changed; });
      }
      event = poll();
    }
    return event;
  }

  bool done() const override { return done_; }

  bool set_wake(std::function<void()> wake) override {
    std::lock_guard lock(wakes_->mu);
    wakes_->caller = std::move(wake);
    return watch_id_.has_value();
  }

  // Subscribes to the shard's changes (before the first read, so none is
  // missed). Without a watch it polls every listen_poll_interval.
  [[nodiscard]] Status watch() {
    if (!context_->changes) return {};
    TM_ASSIGN(ChangeWatch::Id id, context_->changes->subscribe(
                                      context_->machine->key(),
                                      [wakes = wakes_] {
                                        std::function<void()> caller;
                                        {
                                          std::lock_guard lock(wakes->mu);
                                          wakes->changed = true;
                                          caller = wakes->caller;
                                        }
                                        wakes->cv.notify_all();
                                        if (caller) caller();
                                      },
                                      /*fast=*/true));
    watch_id_ = id;
    return {};
  }

  Result<std::optional<ListenEvent>> poll() override {
    for (;;) {
      if (done_) return std::optional<ListenEvent>{};
      // 1. Stream the window in progress.
      if (streaming_) {
        TM_ASSIGN(auto event, next_streamed());
        if (event) return event;
        continue;
      }
      if (sorted_) {
        TM_ASSIGN(const UpdateView* update, sorted_->next());
        if (update) return update_event(update->key, update->value, update->time, update->diff);
        sorted_.reset();  // its memory and scratch files go now
        continue;
      }
      // 2. Start the next window of the planned batches.
      if (!windows_.empty()) {
        TM_TRY(start_window());
        continue;
      }
      // 3. Every planned window is out: report the progress they reach.
      if (reported_ < pending_progress_) {
        reported_ = pending_progress_;
        if (reported_.is_closed() || (until_ && !(reported_ < Frontier::at(*until_)))) {
          done_ = true;
        }
        ListenEvent event;
        event.kind = ListenEvent::Kind::kProgress;
        event.progress = reported_;
        return std::optional<ListenEvent>{event};
      }
      // 4. Look for a new upper.
      TM_ASSIGN(bool advanced, refresh());
      if (!advanced) return std::optional<ListenEvent>{};
    }
  }

  [[nodiscard]] Status check_since() {
    if (start_.lower().is_closed()) return {};
    TM_ASSIGN(StatePtr state, context_->fetch_for_read());
    // The times from lower on read exactly while the time just before
    // lower is not past the since (compaction moves what is below the
    // since up to it). From 0, nothing may have moved.
    const Time first = start_.lower().time();
    if (state->since.is_past(first == 0 ? 0 : first - 1)) {
      return make_error(ErrorKind::kSinceViolation, "cannot listen to shard " + state->name + " " +
                                                        start_.to_string() + ": below its since " +
                                                        state->since.to_string());
    }
    return {};
  }

 private:
  // Reads the state and plans the windows of the batches between what was
  // reported and the new upper (capped at `until`). False when the upper
  // has not moved.
  Result<bool> refresh() {
    if (watch_id_) {
      // Only when the shard may have changed (or as a fallback).
      const auto now = std::chrono::steady_clock::now();
      std::lock_guard lock(wakes_->mu);
      if (!wakes_->changed && now < next_look_) return false;
      wakes_->changed = false;
      next_look_ = now + kListenFallback;
    }
    // Nothing of an older state is read any more.
    pin_.renew();
    TM_ASSIGN(StatePtr state, context_->fetch_for_read());
    Frontier target = state->upper;
    if (until_ && Frontier::at(*until_) < target) target = Frontier::at(*until_);
    if (!(reported_ < target)) return false;
    // Times already covered: everything below the start's lower, and
    // everything < reported_.
    Time lo =
        std::max(start_.lower().time(), reported_.is_closed() ? UINT64_MAX : reported_.time());
    Time hi = target.is_closed() ? UINT64_MAX : target.time() - 1;  // target > reported_ >= 0
    for (const HollowBatch& batch : state->batches) {
      Time batch_min = batch.desc.lower.time();
      Time batch_max = batch.desc.upper.is_closed() ? UINT64_MAX : batch.desc.upper.time() - 1;
      Time data_min = UINT64_MAX, data_max = 0;
      for (const PartRef& p : batch.parts) {
        data_min = std::min(data_min, p.time_min);
        data_max = std::max(data_max, p.time_max);
      }
      Time min = std::max({lo, batch_min, data_min});
      Time max = std::min({hi, batch_max, data_max});
      if (min <= max) {
        windows_.push_back(
            Window{MergeCursor::PartRun{batch.parts.get(), batch.ordered}, TimeWindow{min, max}});
      }
    }
    pending_progress_ = target;
    return true;
  }

  // Opens the next window: a merge to stream (one time), or the whole
  // window read into a sorter. On failure the window stays first in line.
  Status start_window() {
    const Window& next = windows_.front();
    const TimeWindow window = next.window;
    TM_ASSIGN(MergeCursor merge,
              MergeCursor::open(context_->read_blob, std::vector<MergeCursor::PartRun>{next.parts},
                                window, {}, memory_));
    if (window.min == window.max) {
      merge_.emplace(std::move(merge));
      streaming_ = true;
      windows_.pop_front();
      return {};
    }
    auto sorter = std::make_unique<TimeSorter>(context_->options.listen_buffer_bytes,
                                               context_->options.scratch_directory, memory_);
    // The sorter's run grows in the same pool, waiting for room: read-ahead
    // leaves it that room.
    merge.leave_room_for(context_->options.listen_buffer_bytes);
    for (;;) {
      TM_ASSIGN(auto update, merge.next());
      if (!update) break;
      TM_TRY(sorter->add(*update));
    }
    TM_TRY(sorter->finish());
    sorted_ = std::move(sorter);
    windows_.pop_front();
    return {};
  }

  // One window of a single time: equal (key, value) consolidated, streamed.
  Result<std::optional<ListenEvent>> next_streamed() {
    TM_ASSIGN(auto update, merge_->next());
    if (!update) {
      streaming_ = false;
      merge_.reset();
      return std::optional<ListenEvent>{};
    }
    return update_event(update->key, update->value, update->time, update->diff);
  }

  static Result<std::optional<ListenEvent>> update_event(std::string_view key,
                                                         std::string_view value, Time time,
                                                         Diff diff) {
    // Made in place in the result: a listen returns one per update.
    Result<std::optional<ListenEvent>> out(std::in_place, std::in_place);
    ListenEvent& event = **out;
    event.kind = ListenEvent::Kind::kUpdate;
    event.key = key;
    event.value = value;
    event.time = time;
    event.diff = diff;
    return out;
  }

  // A time range of one batch still to emit.
  struct Window {
    MergeCursor::PartRun parts;
    TimeWindow window;
  };

  // What a wake of the change watch leaves for the listener (shared: a
  // wake may be running as the listener goes).
  struct Wakes {
    std::mutex mu;
    std::condition_variable cv;
    bool changed = true;           // GUARDED_BY(mu): the first look reads
    std::function<void()> caller;  // GUARDED_BY(mu): set_wake's
  };

  std::shared_ptr<ShardContext> context_;
  const std::shared_ptr<Wakes> wakes_ = std::make_shared<Wakes>();
  std::optional<ChangeWatch::Id> watch_id_;
  std::chrono::steady_clock::time_point next_look_;  // the fallback's next look
  const ReadMemory memory_;
  const ListenStart start_;  // lower is never closed past the constructor
  const std::optional<Time> until_;
  bool done_ = false;
  // Progress reported so far: every update at a time < reported_ (and at
  // or after the start's lower) has been emitted. Starts at the start's
  // claim: nothing new is claimed yet.
  Frontier reported_;
  Frontier pending_progress_;
  std::deque<Window> windows_;
  bool streaming_ = false;
  std::optional<ConsolidatingCursor> merge_;  // the one-time window streaming
  std::unique_ptr<TimeSorter> sorted_;        // the wider window being emitted
  ReaderPins::Pin pin_;
  std::unique_ptr<ReadHandle> owner_;   // a reader of its own, or
  std::unique_ptr<ListenShare> share_;  // its place under the shard's shared one
};

}  // namespace

Result<std::unique_ptr<Listener>> open_listener(const std::shared_ptr<ShardContext>& context,
                                                ListenStart start, std::optional<Time> until,
                                                ReaderPins::Pin pin,
                                                std::unique_ptr<ReadHandle> owner,
                                                const ReadMemory& memory,
                                                std::unique_ptr<ListenShare> share) {
  auto listener = std::make_unique<ShardListener>(context, start, until, std::move(pin),
                                                  std::move(owner), memory, std::move(share));
  TM_TRY(listener->watch());
  TM_TRY(listener->check_since());
  return std::unique_ptr<Listener>(std::move(listener));
}

}  // namespace tidemark
