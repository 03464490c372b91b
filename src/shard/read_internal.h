// The read path's internals shared by Shard, ReadHandle, snapshot and
// listen: both kinds of read run under a leased reader's pin (pins.h), and
// may own the reader they run under (Shard::snapshot and Shard::listen open
// one for their duration).
#pragma once

#include <memory>
#include <optional>

#include "shard/context.h"
#include "shard/pins.h"
#include "tidemark/read.h"

namespace tidemark {

[[nodiscard]] Result<SnapshotCursor> open_snapshot(const std::shared_ptr<ShardContext>& context,
                                                   Time as_of, ReaderPins::Pin pin,
                                                   std::unique_ptr<ReadHandle> owner,
                                                   const ReadMemory& memory);

// An owner's since hold stays where it was registered: a transient read
// never moves the shard's since for others.
[[nodiscard]] Result<std::unique_ptr<Listener>> open_listener(
    const std::shared_ptr<ShardContext>& context, ListenStart start, std::optional<Time> until,
    ReaderPins::Pin pin, std::unique_ptr<ReadHandle> owner, const ReadMemory& memory);

}  // namespace tidemark
