// ReadHandle: a reader's lease and since hold (include/tidemark/read.h).
#include <condition_variable>
#include <mutex>
#include <thread>

#include "shard/context.h"
#include "shard/state.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "util/clock.h"
#include "util/ids.h"

namespace tidemark {

struct ReadHandle::Impl {
  std::shared_ptr<ShardContext> context;
  std::shared_ptr<Shard> shard;
  std::string id;
  bool critical = false;
  std::chrono::milliseconds lease{0};

  std::mutex mu;
  std::condition_variable stop_cv;
  bool stopping = false;  // GUARDED_BY(mu)
  std::thread heartbeats;

  std::uint64_t expiry() const {
    return wall_clock_millis() + static_cast<std::uint64_t>(lease.count());
  }

  Status apply(const std::function<Status(ShardState&, std::uint64_t now)>& change) {
    TM_TRY(context->machine->apply([&](ShardState& state) -> Result<TransitionResult> {
      TM_TRY(change(state, wall_clock_millis()));
      return TransitionResult::kWrite;
    }));
    return {};
  }

  void run_heartbeats() {
    std::unique_lock lock(mu);
    for (;;) {
      if (stop_cv.wait_for(lock, lease / 3, [&] { return stopping; })) return;
      lock.unlock();
      auto beat = apply([&](ShardState& state, std::uint64_t now) {
        return heartbeat_reader(state, id, expiry(), now);
      });
      lock.lock();
      if (!beat && beat.error().is(ErrorKind::kNotFound)) return;  // expired: nothing to keep
    }
  }

  void stop_heartbeats() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    stop_cv.notify_all();
    if (heartbeats.joinable()) heartbeats.join();
  }
};

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
  return impl_->apply([&](ShardState& state, std::uint64_t now) {
    return downgrade_reader_since(state, impl_->id, since, now);
  });
}

Status ReadHandle::heartbeat() {
  if (impl_->critical) return {};
  return impl_->apply([&](ShardState& state, std::uint64_t now) {
    return heartbeat_reader(state, impl_->id, impl_->expiry(), now);
  });
}

Status ReadHandle::expire() {
  impl_->stop_heartbeats();
  return impl_->apply([&](ShardState& state, std::uint64_t now) -> Status {
    remove_reader(state, impl_->id, now);
    return {};
  });
}

Result<SnapshotCursor> ReadHandle::snapshot(Time as_of) {
  return impl_->shard->snapshot(as_of);
}

Result<std::unique_ptr<Listener>> ReadHandle::listen(Time from, std::optional<Time> until) {
  return impl_->shard->listen(from, until);
}

namespace {

Result<std::unique_ptr<ReadHandle>> open_handle(const std::shared_ptr<ShardContext>& context,
                                                std::shared_ptr<Shard> shard, std::string id,
                                                bool critical, const ReaderOptions& options) {
  if (!critical && options.lease.count() <= 0)
    return invalid_usage("a reader lease must be positive");
  auto impl = std::make_unique<ReadHandle::Impl>();
  impl->context = context;
  impl->shard = std::move(shard);
  impl->id = std::move(id);
  impl->critical = critical;
  impl->lease = options.lease;
  ReadHandle::Impl* raw = impl.get();
  TM_TRY(raw->apply([&](ShardState& state, std::uint64_t now) -> Status {
    register_reader(state, raw->id, raw->critical, raw->expiry(), now);
    return {};
  }));
  if (!critical && options.heartbeat)
    raw->heartbeats = std::thread([raw] { raw->run_heartbeats(); });
  return std::make_unique<ReadHandle>(std::move(impl));
}

}  // namespace

Result<std::unique_ptr<ReadHandle>> Shard::open_reader(const ReaderOptions& options) {
  // The handle keeps a Shard of its own for snapshots and listens.
  auto shard = std::make_shared<Shard>(context_);
  return open_handle(context_, std::move(shard), "r-" + random_id(), false, options);
}

Result<std::unique_ptr<ReadHandle>> Shard::open_critical_reader(std::string_view reader_id) {
  if (reader_id.empty() || reader_id.size() > 256) {
    return invalid_usage("a critical reader id must be 1 to 256 bytes");
  }
  auto shard = std::make_shared<Shard>(context_);
  return open_handle(context_, std::move(shard), "c-" + std::string(reader_id), true,
                     ReaderOptions{});
}

}  // namespace tidemark
