// The read path: snapshots and listens.
//
// SnapshotCursor streams the consolidated contents of a shard at as_of,
// sorted by (key, value), with times advanced to as_of. It is a k-way merge
// over the parts, each read one block at a time: memory is
// O(open parts x block size), never O(data).
//
// Listener streams the updates with times > from in time order, and a
// progress event each time the upper advances; it waits for new appends.
//
// Thread-safety: a cursor or listener is used from one thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "tidemark/error.h"
#include "tidemark/frontier.h"

namespace tidemark {

struct SnapshotRow {
  std::string_view key;
  std::string_view value;
  Diff diff = 0;
};

class SnapshotCursor {
 public:
  struct Impl;
  explicit SnapshotCursor(std::unique_ptr<Impl> impl);
  SnapshotCursor(SnapshotCursor&&) noexcept;
  SnapshotCursor& operator=(SnapshotCursor&&) noexcept;
  ~SnapshotCursor();

  Time as_of() const;
  // The next row, or nullopt at the end. The row's views stay valid until
  // the next call.
  [[nodiscard]] Result<std::optional<SnapshotRow>> next();

 private:
  std::unique_ptr<Impl> impl_;
};

struct ListenEvent {
  enum class Kind : std::uint8_t { kUpdate, kProgress };
  Kind kind = Kind::kUpdate;
  std::string_view key;
  std::string_view value;
  Time time = 0;
  Diff diff = 0;
  Frontier progress;  // for kProgress: every update at a time < progress has been emitted
};

class Listener {
 public:
  virtual ~Listener() = default;
  // The next event, waiting for new appends when there is none yet.
  // nullopt once `until` is reached. Views stay valid until the next call.
  [[nodiscard]] virtual Result<std::optional<ListenEvent>> next() = 0;
  // The next event if one is available without waiting longer than the
  // poll interval; nullopt inside the Result means "nothing yet".
  [[nodiscard]] virtual Result<std::optional<ListenEvent>> poll() = 0;
  virtual bool done() const = 0;
};

}  // namespace tidemark
