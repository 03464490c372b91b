// Listens with a snapshot (read.h, SnapshotListen): a snapshot, then the changes after it, as one
// Listener.
//
// Both halves are opened at once under the same reader's pins, so the
// since cannot pass as_of between them: the snapshot reads every time
// <= as_of consolidated, the listener every time > as_of. Between the two
// the stream reports progress as_of + 1 itself ("the snapshot is
// complete"); the listener's own progress events that are not past it are
// dropped, so a consumer never sees a progress value twice.
//
// Memory: the snapshot's blocks and then the listener's, each drawing
// from `memory` as a snapshot and a listen do; the listener reads nothing
// until the snapshot is done.
#include <limits>

#include "shard/read_internal.h"
#include "shard/state.h"
#include "util/ndjson_rows.h"
#include "util/try.h"

namespace tidemark {
namespace {

class SnapshotThenChanges final : public Listener {
 public:
  SnapshotThenChanges(std::optional<SnapshotCursor> snapshot, Time as_of,
                      std::unique_ptr<Listener> changes, std::unique_ptr<ReadHandle> owner)
      : owner_(std::move(owner)),
        snapshot_(std::move(snapshot)),
        as_of_(as_of),
        changes_(std::move(changes)) {}

  ~SnapshotThenChanges() override {
    // The reads go before the reader whose pins they hold.
    snapshot_.reset();
    changes_.reset();
    owner_.reset();
  }

  Result<std::optional<ListenEvent>> next() override { return step(/*wait=*/true); }
  Result<std::optional<ListenEvent>> poll() override { return step(/*wait=*/false); }

  bool done() const override { return !snapshot_ && !progress_due_ && changes_->done(); }

  bool set_wake(std::function<void()> wake) override {
    // While the snapshot streams every poll has a row ready; after it, the
    // listener's wakes are the stream's.
    return changes_->set_wake(std::move(wake));
  }

 private:
  Result<std::optional<ListenEvent>> step(bool wait) {
    if (snapshot_) {
      TM_ASSIGN(auto row, snapshot_->next());
      if (row) {
        ListenEvent event;
        event.kind = ListenEvent::Kind::kUpdate;
        event.key = row->key;
        event.value = row->value;
        event.time = as_of_;
        event.diff = row->diff;
        return std::optional<ListenEvent>(event);
      }
      snapshot_.reset();  // its blocks go back to the pool now
      progress_due_ = true;
    }
    if (progress_due_) {
      progress_due_ = false;
      reported_ = as_of_ == std::numeric_limits<Time>::max() ? Frontier::closed()
                                                             : Frontier::at(as_of_ + 1);
      ListenEvent event;
      event.kind = ListenEvent::Kind::kProgress;
      event.progress = reported_;
      return std::optional<ListenEvent>(event);
    }
    for (;;) {
      TM_ASSIGN(auto event, wait ? changes_->next() : changes_->poll());
      if (!event) return event;
      // The snapshot already reported this far.
      if (event->kind == ListenEvent::Kind::kProgress && !(reported_ < event->progress)) continue;
      if (event->kind == ListenEvent::Kind::kProgress) reported_ = event->progress;
      return event;
    }
  }

  // Destroyed last (see the destructor).
  std::unique_ptr<ReadHandle> owner_;
  std::optional<SnapshotCursor> snapshot_;  // until its last row
  const Time as_of_;
  std::unique_ptr<Listener> changes_;
  bool progress_due_ = false;  // as_of + 1, once the snapshot is done
  Frontier reported_ = Frontier::at(0);
};

}  // namespace

Result<SnapshotListen> open_snapshot_listen(const std::shared_ptr<ShardContext>& context,
                                            std::optional<Time> as_of, std::optional<Time> until,
                                            ReaderPins& pins, std::unique_ptr<ReadHandle> owner,
                                            const ReadMemory& memory) {
  if (!as_of) {
    // The latest complete time; none yet means an empty snapshot and every
    // change from time 0 on.
    TM_ASSIGN(StatePtr state, context->fetch_for_read());
    as_of = latest_complete_time(state->upper);
  }
  if (as_of && until && *until <= *as_of) {
    return make_error(ErrorKind::kInvalidUsage, "until " + std::to_string(*until) +
                                                    " must be after the snapshot's as_of " +
                                                    std::to_string(*as_of));
  }
  std::optional<SnapshotCursor> snapshot;
  if (as_of) {
    TM_ASSIGN(SnapshotCursor cursor, open_snapshot(context, *as_of, pins.pin(), nullptr, memory));
    snapshot.emplace(std::move(cursor));
  }
  const ListenStart start =
      as_of ? ListenStart::after(*as_of) : ListenStart::at_progress(Frontier::at(0));
  TM_ASSIGN(auto changes, open_listener(context, start, until, pins.pin(), nullptr, memory));
  SnapshotListen out;
  out.as_of = as_of;
  out.listener = std::make_unique<SnapshotThenChanges>(std::move(snapshot), as_of.value_or(0),
                                                       std::move(changes), std::move(owner));
  return out;
}

}  // namespace tidemark
