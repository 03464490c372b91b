// Shard (include/tidemark/client.h): a handle on one shard of a Client.
// What it reads of the state itself (inspect, upper, producers), the
// writers and readers it opens, the reads it runs under a reader of their
// own, and compaction and garbage collection on request.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "shard/change_watch.h"
#include "shard/compactor.h"
#include "shard/context.h"
#include "shard/gc.h"
#include "shard/read_internal.h"
#include "shard/state.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/write.h"
#include "util/clock.h"
#include "util/ids.h"
#include "util/try.h"

namespace tidemark {

Shard::Shard(std::shared_ptr<ShardContext> context) : context_(std::move(context)) {}
Shard::~Shard() = default;

const std::string& Shard::name() const {
  return context_->name;
}

Result<ShardInfo> Shard::inspect() {
  TM_ASSIGN(StatePtr state_ptr, context_->fetch_for_read());
  const ShardState& state = *state_ptr;
  ShardInfo info;
  info.name = state.name;
  info.upper = state.upper;
  info.since = state.since;
  info.seqno = state.seqno;
  info.batches = state.batches.size();
  for (const HollowBatch& batch : state.batches) {
    info.parts += batch.parts.size();
    info.updates += batch.count();
    info.bytes += batch.bytes();
    for (const PartRef& part : batch.parts) info.inline_parts += part.is_inline() ? 1 : 0;
  }
  for (const auto& [id, reader] : state.readers) {
    info.readers.push_back(
        ReaderInfo{id, reader.since, reader.critical(), reader.lease_expires_ms, reader.owner});
  }
  for (const auto& [id, writer] : state.writers) {
    info.writers.push_back(WriterInfo{id, writer.lease_expires_ms, writer.owner});
  }
  return info;
}

Result<Frontier> Shard::upper(bool fresh) {
  TM_ASSIGN(StatePtr state, fresh ? context_->fetch_for_read() : context_->machine->latest_known());
  return state->upper;
}

Result<ProducerLookup> Shard::lookup_producer(std::string_view producer, bool fresh) {
  TM_TRY(validate_producer_id(producer));
  TM_ASSIGN(StatePtr state, fresh ? context_->fetch_for_read() : context_->machine->latest_known());
  ProducerLookup out;
  out.producers = state->producers.size();
  out.max_producers = context_->options.max_producers;
  if (auto it = state->producers.find(producer); it != state->producers.end()) {
    out.producer = ProducerInfo{it->second.sequence, it->second.time, it->second.expires_ms};
  }
  return out;
}

Result<Subscription> Shard::subscribe(std::function<void()> wake) {
  if (!context_->changes) return invalid_usage("this shard has no change watch");
  Subscription out;
  TM_ASSIGN(out.id_, context_->changes->subscribe(context_->machine->key(), std::move(wake)));
  out.watch_ = context_->changes;
  return out;
}

Result<std::unique_ptr<WriteHandle>> Shard::open_writer() {
  std::string writer_id = "w" + random_id();
  const auto lease = static_cast<std::uint64_t>(context_->options.writer_lease.count());
  if (lease == 0) return invalid_usage("a writer lease must be positive");
  // Registering is idempotent (a registered writer's lease is extended).
  TM_TRY(with_retries(context_->options.write_retry, [&] {
    return context_->machine->apply([&](ShardState& state) -> Result<TransitionResult> {
      const std::uint64_t now = wall_clock_millis();
      register_writer(state, writer_id, now + lease, now, context_->options.owner);
      return TransitionResult::kWrite;
    });
  }));
  // Dropped on a failure below: its destructor removes the writer.
  auto handle = std::unique_ptr<WriteHandle>(new WriteHandle(context_, std::move(writer_id)));
  TM_TRY(handle->start_heartbeat());
  TM_TRY(with_retries(context_->options.write_retry, [&] { return handle->fetch_upper(); }));
  return handle;
}

Result<std::unique_ptr<ReadHandle>> Shard::open_reader(const ReaderOptions& options) {
  return open_read_handle(context_, "r-" + random_id(), false, options);
}

Result<std::unique_ptr<ReadHandle>> Shard::open_critical_reader(std::string_view reader_id) {
  if (reader_id.empty() || reader_id.size() > 256) {
    return invalid_usage("a critical reader id must be 1 to 256 bytes");
  }
  return open_read_handle(context_, "c-" + std::string(reader_id), true, ReaderOptions{});
}

Status Shard::release_reader(std::string_view reader_id) {
  bool found = false;
  TM_TRY(context_->machine->apply([&](ShardState& state) -> Result<TransitionResult> {
    found = state.readers.contains(reader_id);
    if (!found) return TransitionResult::kUnchanged;
    remove_reader(state, reader_id, wall_clock_millis());
    return TransitionResult::kWrite;
  }));
  if (!found) {
    return make_error(ErrorKind::kNotFound, "shard " + context_->name + " has no reader " +
                                                std::string(reader_id) +
                                                " (shard inspect lists its readers)");
  }
  return {};
}

bool Shard::deleted() const {
  return context_->machine->refused();
}

Result<SnapshotCursor> Shard::snapshot(Time as_of, const ReadMemory& memory) {
  TM_ASSIGN(auto handle, open_reader(ReaderOptions{context_->options.reader_lease, true}));
  ReadHandle* raw = handle.get();
  return raw->snapshot_owned(as_of, std::move(handle), memory);
}

Result<std::unique_ptr<Listener>> Shard::listen(ListenStart start, std::optional<Time> until,
                                                const ReadMemory& memory) {
  return open_shared_listener(context_, start, until, memory);
}

Result<SnapshotListen> Shard::listen_snapshot(std::optional<Time> as_of, std::optional<Time> until,
                                              const ReadMemory& memory) {
  TM_ASSIGN(auto handle, open_reader(ReaderOptions{context_->options.reader_lease, true}));
  ReadHandle* raw = handle.get();
  return raw->listen_snapshot_owned(as_of, until, std::move(handle), memory);
}

Result<std::unique_ptr<Listener>> Shard::listen(Time from, std::optional<Time> until,
                                                const ReadMemory& memory) {
  return listen(ListenStart::after(from), until, memory);
}

Result<CompactionReport> Shard::compact() {
  return compact_shard(*context_);
}

Result<GcReport> Shard::collect_garbage() {
  return tidemark::collect_garbage(*context_);
}

}  // namespace tidemark
