// ReadHandle: a reader's lease, since hold and seqno hold
// (include/tidemark/read.h, src/shard/pins.h).
#include <map>
#include <mutex>
#include <vector>

#include "shard/context.h"
#include "shard/pins.h"
#include "shard/read_internal.h"
#include "shard/state.h"
#include "shard/transitions.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "util/clock.h"
#include "util/ids.h"
#include "util/periodic.h"
#include "util/try.h"

namespace tidemark {

struct ReadHandle::Impl {
  std::shared_ptr<ShardContext> context;
  std::string id;
  bool critical = false;
  std::chrono::milliseconds lease{0};
  std::shared_ptr<ReaderPins> pins;  // leased readers only
  // Heartbeats: the shard's shared one when this reader has its default
  // lease, else a task of its own.
  std::shared_ptr<ReaderHeartbeats> group;
  PeriodicTask heartbeats;

  void stop_heartbeats();

  std::uint64_t expiry() const {
    return wall_clock_millis() + static_cast<std::uint64_t>(lease.count());
  }

  Result<StatePtr> apply(const std::function<Status(ShardState&, std::uint64_t now)>& change) {
    return context->machine->apply([&](ShardState& state) -> Result<TransitionResult> {
      TM_TRY(change(state, wall_clock_millis()));
      return TransitionResult::kWrite;
    });
  }

  void record_hold(const StatePtr& state) {
    auto it = state->readers.find(id);
    if (pins && it != state->readers.end()) pins->set_recorded(it->second.seqno);
  }

  Status reregister() {
    auto lock = pins->lock_for_heartbeat();
    TM_ASSIGN(StatePtr state, apply([&](ShardState& s, std::uint64_t now) -> Status {
                register_reader(s, id, false, expiry(), now, context->options.owner);
                return {};
              }));
    record_hold(state);
    return {};
  }

  Status heartbeat() {
    if (critical) return {};
    auto lock = pins->lock_for_heartbeat();
    const std::optional<SeqNo> pinned = pins->least_pinned();
    TM_ASSIGN(StatePtr state, apply([&](ShardState& s, std::uint64_t now) {
                return heartbeat_reader(s, id, expiry(), now, pinned);
              }));
    record_hold(state);
    return {};
  }
};

// One heartbeat for many readers: every leased reader of a shard opened in
// this process with the default lease (Shard::snapshot and Shard::listen
// among them) is heartbeaten by one transition every lease / 3, so 10,000
// idle listens cost one consensus write per interval, not 10,000. A reader
// with another lease beats on its own.
class ReaderHeartbeats : public std::enable_shared_from_this<ReaderHeartbeats> {
 public:
  explicit ReaderHeartbeats(std::chrono::milliseconds lease) : lease_(lease) {}
  ~ReaderHeartbeats() { task_.stop(); }

  std::chrono::milliseconds lease() const { return lease_; }

  [[nodiscard]] Status join(ReadHandle::Impl* reader) {
    std::lock_guard lock(mu_);
    if (!started_) {
      std::weak_ptr<ReaderHeartbeats> weak = weak_from_this();
      TM_TRY(task_.start(std::max(lease_ / 3, std::chrono::milliseconds(1)), [weak] {
        auto self = weak.lock();
        return self && self->beat();
      }));
      started_ = true;
    }
    members_.emplace(reader->id, reader);
    return {};
  }
  // Once it returns, no beat uses `reader`.
  void leave(ReadHandle::Impl* reader) {
    std::lock_guard lock(mu_);
    members_.erase(reader->id);
  }

 private:
  // Extends every member's lease and records its hold in one transition
  // (with the members' heartbeat locks held, as one reader's beat holds
  // its own); a member that expired meanwhile registers again.
  bool beat() {
    std::lock_guard lock(mu_);
    if (members_.empty()) return true;
    std::vector<std::unique_lock<std::mutex>> held;
    std::vector<ReaderBeat> beats;
    held.reserve(members_.size());
    beats.reserve(members_.size());
    for (const auto& [id, reader] : members_) {
      held.push_back(reader->pins->lock_for_heartbeat());
      beats.push_back(ReaderBeat{reader->id, reader->expiry(), reader->pins->least_pinned()});
    }
    std::vector<std::string> expired;
    const auto& context = members_.begin()->second->context;
    auto state = context->machine->apply([&](ShardState& s) -> Result<TransitionResult> {
      expired.clear();
      heartbeat_readers(s, beats, wall_clock_millis(), &expired);
      return TransitionResult::kWrite;
    });
    if (!state) return true;  // the next beat tries again, as a reader's own would
    for (const auto& [id, reader] : members_) reader->record_hold(*state);
    held.clear();
    // Expired (this process was paused or cut off past the lease): hold
    // again from the shard's since now (see open_read_handle).
    for (const std::string& id : expired) {
      if (auto it = members_.find(id); it != members_.end()) (void)it->second->reregister();
    }
    return true;
  }

  const std::chrono::milliseconds lease_;
  std::mutex mu_;                                                  // held across a beat
  std::map<std::string, ReadHandle::Impl*, std::less<>> members_;  // GUARDED_BY(mu_)
  bool started_ = false;                                           // GUARDED_BY(mu_)
  PeriodicTask task_;
};

std::shared_ptr<ReaderHeartbeats> make_reader_heartbeats(std::chrono::milliseconds lease) {
  return std::make_shared<ReaderHeartbeats>(lease);
}

void ReadHandle::Impl::stop_heartbeats() {
  heartbeats.stop();
  if (group) {
    group->leave(this);
    group.reset();
  }
}

ReadHandle::ReadHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ReadHandle::~ReadHandle() {
  impl_->stop_heartbeats();
  if (!impl_->critical) {
    // Best effort: a hold that cannot be dropped now expires with its lease.
    (void)impl_->apply([&](ShardState& state, std::uint64_t now) -> Status {
      remove_reader(state, impl_->id, now);
      return {};
    });
  }
}

const std::string& ReadHandle::id() const {
  return impl_->id;
}
bool ReadHandle::critical() const {
  return impl_->critical;
}

Result<Frontier> ReadHandle::since() {
  TM_ASSIGN(StatePtr state, impl_->context->machine->fetch());
  auto it = state->readers.find(impl_->id);
  if (it == state->readers.end()) {
    return make_error(ErrorKind::kNotFound, "reader " + impl_->id + " has expired");
  }
  return it->second.since;
}

Status ReadHandle::downgrade_since(Frontier since) {
  TM_TRY(impl_->apply([&](ShardState& state, std::uint64_t now) {
    return downgrade_reader_since(state, impl_->id, since, now);
  }));
  return {};
}

Status ReadHandle::heartbeat() {
  return impl_->heartbeat();
}

Status ReadHandle::expire() {
  impl_->stop_heartbeats();
  TM_TRY(impl_->apply([&](ShardState& state, std::uint64_t now) -> Status {
    remove_reader(state, impl_->id, now);
    return {};
  }));
  return {};
}

Result<SnapshotCursor> ReadHandle::snapshot(Time as_of, const ReadMemory& memory) {
  if (impl_->critical) return Shard(impl_->context).snapshot(as_of, memory);
  return open_snapshot(impl_->context, as_of, impl_->pins->pin(), nullptr, memory);
}

Result<std::unique_ptr<Listener>> ReadHandle::listen(ListenStart start, std::optional<Time> until,
                                                     const ReadMemory& memory) {
  if (impl_->critical) return Shard(impl_->context).listen(start, until, memory);
  return open_listener(impl_->context, start, until, impl_->pins->pin(), nullptr, memory);
}

Result<std::unique_ptr<Listener>> ReadHandle::listen(Time from, std::optional<Time> until,
                                                     const ReadMemory& memory) {
  return listen(ListenStart::after(from), until, memory);
}

Result<SnapshotListen> ReadHandle::listen_snapshot(std::optional<Time> as_of,
                                                   std::optional<Time> until,
                                                   const ReadMemory& memory) {
  if (impl_->critical) return Shard(impl_->context).listen_snapshot(as_of, until, memory);
  return open_snapshot_listen(impl_->context, as_of, until, *impl_->pins, nullptr, memory);
}

Result<SnapshotListen> ReadHandle::listen_snapshot_owned(std::optional<Time> as_of,
                                                         std::optional<Time> until,
                                                         std::unique_ptr<ReadHandle> self,
                                                         const ReadMemory& memory) {
  ReaderPins& pins = *impl_->pins;
  return open_snapshot_listen(impl_->context, as_of, until, pins, std::move(self), memory);
}

Result<SnapshotCursor> ReadHandle::snapshot_owned(Time as_of, std::unique_ptr<ReadHandle> self,
                                                  const ReadMemory& memory) {
  ReaderPins::Pin pin = impl_->pins->pin();
  return open_snapshot(impl_->context, as_of, std::move(pin), std::move(self), memory);
}

Result<std::unique_ptr<Listener>> ReadHandle::listen_owned(ListenStart start,
                                                           std::optional<Time> until,
                                                           std::unique_ptr<ReadHandle> self,
                                                           const ReadMemory& memory) {
  ReaderPins::Pin pin = impl_->pins->pin();
  return open_listener(impl_->context, start, until, std::move(pin), std::move(self), memory);
}

namespace {

// open_read_handle, with what a listen's reader needs besides: its pins
// and the since it registered at (out).
Result<std::unique_ptr<ReadHandle>> open_handle(const std::shared_ptr<ShardContext>& context,
                                                std::string id, bool critical,
                                                const ReaderOptions& options,
                                                std::shared_ptr<ReaderPins>* pins_out = nullptr,
                                                Frontier* since_out = nullptr) {
  if (!critical && options.lease.count() <= 0)
    return invalid_usage("a reader lease must be positive");
  auto impl = std::make_unique<ReadHandle::Impl>();
  impl->context = context;
  impl->id = std::move(id);
  impl->critical = critical;
  impl->lease = options.lease;
  ReadHandle::Impl* raw = impl.get();
  // Registering is idempotent (a reader of this id is found again), so a
  // failure that may pass is retried like any read.
  TM_ASSIGN(StatePtr state,
            with_retries(
                context->options.read_retry,
                [&] {
                  return raw->apply([&](ShardState& s, std::uint64_t now) -> Status {
                    register_reader(s, raw->id, raw->critical, raw->expiry(), now,
                                    raw->context->options.owner);
                    return {};
                  });
                },
                context->stop_reads()));
  if (critical) return std::make_unique<ReadHandle>(std::move(impl));
  raw->pins = std::make_shared<ReaderPins>(state->readers.at(raw->id).seqno);
  if (pins_out) *pins_out = raw->pins;
  if (since_out) *since_out = state->readers.at(raw->id).since;
  // The handle first: if its heartbeat cannot start, dropping it removes the
  // reader it registered.
  auto handle = std::make_unique<ReadHandle>(std::move(impl));
  if (options.heartbeat && context->reader_heartbeats &&
      context->reader_heartbeats->lease() == raw->lease) {
    TM_TRY(context->reader_heartbeats->join(raw));
    raw->group = context->reader_heartbeats;
  } else if (options.heartbeat) {
    TM_TRY(raw->heartbeats.start(std::max(raw->lease / 3, std::chrono::milliseconds(1)), [raw] {
      auto beat = raw->heartbeat();
      // Expired (this process was paused or cut off past the lease): hold
      // again from the shard's since now. Cursors opened before may find
      // parts garbage collection deleted meanwhile (a "not found" naming
      // the part); reads from now on are protected again.
      if (!beat && beat.error().is(ErrorKind::kNotFound)) (void)raw->reregister();
      return true;
    }));
  }
  return handle;
}

}  // namespace

Result<std::unique_ptr<ReadHandle>> open_read_handle(const std::shared_ptr<ShardContext>& context,
                                                     std::string id, bool critical,
                                                     const ReaderOptions& options) {
  return open_handle(context, std::move(id), critical, options);
}

// One leased reader for every Shard::listen of a shard in this process.
//
// A listen's reader used to be its own: registered at the shard's since
// when the listen opened (a consensus write), heartbeaten, removed when
// it ended (another write), and an entry in the state's readers all the
// while, which every commit and heartbeat writes. 10,000 idle listens were
// 10,000 entries. Now they are one: the first listen registers the shared
// reader, the others join it with no consensus write, and the last one to
// end drops it. The hold is the same as each listen's own would have
// been: the shard's since when the reader registered, which is the since
// every later listen finds while the reader holds it (the since never
// passes a hold). So, as before, a listen never moves the since, and
// listens that keep overlapping hold it where the first one found it.
//
// A listen whose start is already below the shared hold (it would be
// refused by its since check anyway, unless the state it saw was stale)
// gets a reader of its own, as before.
//
// Locks: mu_ is never held across a consensus write or a heartbeat's
// locks (a group beat takes those and nothing of this class).
// Memory: a count and the shared reader.
class ListenReaders : public std::enable_shared_from_this<ListenReaders> {
 public:
  class Share final : public ListenShare {
   public:
    Share(std::shared_ptr<ListenReaders> owner, std::shared_ptr<ReaderPins> pins)
        : owner_(std::move(owner)), pins_(std::move(pins)) {}
    ~Share() override { owner_->leave(); }

    ReaderPins::Pin pin() { return pins_->pin(); }

   private:
    std::shared_ptr<ListenReaders> owner_;
    std::shared_ptr<ReaderPins> pins_;
  };

  // A share for a listen whose since must stay at or below `need`;
  // nullptr when the shared reader's hold is above it.
  Result<std::unique_ptr<Share>> join(const std::shared_ptr<ShardContext>& context, Time need) {
    {
      std::lock_guard lock(mu_);
      if (reader_) return join_locked(need);
    }
    // None yet: register one (a consensus write) without holding mu_.
    std::shared_ptr<ReaderPins> pins;
    Frontier since;
    TM_ASSIGN(auto fresh,
              open_handle(context, "r-" + random_id(), false,
                          ReaderOptions{context->options.reader_lease, true}, &pins, &since));
    std::unique_ptr<Share> share;
    std::unique_ptr<ReadHandle> unused;
    {
      std::lock_guard lock(mu_);
      if (!reader_) {  // else another listen registered one meanwhile: use it
        reader_ = std::move(fresh);
        pins_ = std::move(pins);
        hold_ = since;
      }
      share = join_locked(need);
      if (members_ == 0) {  // the since was already past `need`: nobody to hold for
        unused = std::move(reader_);
        pins_.reset();
      }
    }
    // Readers not kept go outside mu_ (their removal is a consensus write).
    fresh.reset();
    unused.reset();
    return share;
  }

 private:
  // REQUIRES: mu_ held, reader_ set.
  std::unique_ptr<Share> join_locked(Time need) {
    if (Frontier::at(need) < hold_) return nullptr;
    ++members_;
    return std::make_unique<Share>(shared_from_this(), pins_);
  }

  void leave() {
    std::unique_ptr<ReadHandle> last;
    {
      std::lock_guard lock(mu_);
      if (--members_ == 0) {
        last = std::move(reader_);  // its hold goes with it (a consensus write)
        pins_.reset();
      }
    }
  }

  std::mutex mu_;
  std::unique_ptr<ReadHandle> reader_;  // GUARDED_BY(mu_): while members_ > 0
  std::shared_ptr<ReaderPins> pins_;    // GUARDED_BY(mu_): reader_'s
  Frontier hold_;                       // GUARDED_BY(mu_): reader_'s since
  std::size_t members_ = 0;             // GUARDED_BY(mu_)
};

std::shared_ptr<ListenReaders> make_listen_readers() {
  return std::make_shared<ListenReaders>();
}

Result<std::unique_ptr<Listener>> open_shared_listener(const std::shared_ptr<ShardContext>& context,
                                                       ListenStart start, std::optional<Time> until,
                                                       const ReadMemory& memory) {
  if (context->listen_readers && !start.lower().is_closed()) {
    const Time first = start.lower().time();
    TM_ASSIGN(auto share, context->listen_readers->join(context, first == 0 ? 0 : first - 1));
    if (share) {
      ReaderPins::Pin pin = share->pin();
      return open_listener(context, start, until, std::move(pin), nullptr, memory,
                           std::move(share));
    }
  }
  // A reader of its own: the shared one's hold is past this start (or the
  // listen is empty).
  std::shared_ptr<ReaderPins> pins;
  TM_ASSIGN(auto handle, open_handle(context, "r-" + random_id(), false,
                                     ReaderOptions{context->options.reader_lease, true}, &pins));
  ReaderPins::Pin pin = pins->pin();
  return open_listener(context, start, until, std::move(pin), std::move(handle), memory);
}

}  // namespace tidemark
