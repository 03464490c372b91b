// The read path's internals shared by Shard, ReadHandle, snapshot and
// listen: opening a reader's handle, and the two kinds of read. Both run
// under a leased reader's pin (pins.h), and may own the reader they run
// under (Shard::snapshot and Shard::listen open one for their duration).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "shard/context.h"
#include "shard/pins.h"
#include "tidemark/read.h"

namespace tidemark {

// The heartbeat the leased readers of one shard with `lease` share
// (ShardContext::reader_heartbeats; read_handle.cc).
std::shared_ptr<ReaderHeartbeats> make_reader_heartbeats(std::chrono::milliseconds lease);

// Registers reader `id` (leased, or critical when `critical`) and returns
// its handle, heartbeating every lease / 3 when options.heartbeat (with
// the shard's other readers of the same lease, in one transition).
// Registering is idempotent: a reader of this id is found again (a critical
// reader keeps its hold). Shard::open_reader and open_critical_reader.
[[nodiscard]] Result<std::unique_ptr<ReadHandle>> open_read_handle(
    const std::shared_ptr<ShardContext>& context, std::string id, bool critical,
    const ReaderOptions& options);

[[nodiscard]] Result<SnapshotCursor> open_snapshot(const std::shared_ptr<ShardContext>& context,
                                                   Time as_of, ReaderPins::Pin pin,
                                                   std::unique_ptr<ReadHandle> owner,
                                                   const ReadMemory& memory);

// A listener's place under its shard's shared listen reader
// (ListenReaders, read_handle.cc); it leaves when destroyed.
class ListenShare {
 public:
  virtual ~ListenShare() = default;
};

// The shared listen readers of one shard (ShardContext::listen_readers).
std::shared_ptr<ListenReaders> make_listen_readers();

// An owner's since hold stays where it was registered: a transient read
// never moves the shard's since for others; nor does a share's.
[[nodiscard]] Result<std::unique_ptr<Listener>> open_listener(
    const std::shared_ptr<ShardContext>& context, ListenStart start, std::optional<Time> until,
    ReaderPins::Pin pin, std::unique_ptr<ReadHandle> owner, const ReadMemory& memory,
    std::unique_ptr<ListenShare> share = nullptr);

// Shard::listen: a listener under the shard's shared listen reader, or,
// when that reader's hold is already past `start`, under a reader of its
// own (owned by the listener).
[[nodiscard]] Result<std::unique_ptr<Listener>> open_shared_listener(
    const std::shared_ptr<ShardContext>& context, ListenStart start, std::optional<Time> until,
    const ReadMemory& memory);

// A snapshot at `as_of` (default: the latest complete time) and a listener
// after it, both pinned by `pins` (the reader's), as one SnapshotListen that
// owns `owner` (if any) for as long as it runs.
[[nodiscard]] Result<SnapshotListen> open_snapshot_listen(
    const std::shared_ptr<ShardContext>& context, std::optional<Time> as_of,
    std::optional<Time> until, ReaderPins& pins, std::unique_ptr<ReadHandle> owner,
    const ReadMemory& memory);

}  // namespace tidemark
