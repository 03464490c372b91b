// FileDestination: a sink's output as rolling files in one directory
// (`file:///dir`).
//
// Each file holds the pairs of the times in [lower, upper) and is named
// `<lower>-<upper>.<json|csv>` (both 20-digit zero-padded decimals, so
// names sort by time). It is written under a temporary name starting with
// "." (never read as output), fsynced, renamed to its final name and the
// directory fsynced: a committed file is never visible half-written. The
// committed files are the sink's progress: the largest committed upper is
// the frontier fully emitted, and a restarted sink resumes there. A
// snapshot is written in parts, each a file named with its position
// (commit_snapshot_part; committed_name.h), so a restarted sink goes on
// after the last part instead of writing the snapshot again.
//
// Memory: one write buffer, written out whenever it reaches
// kWriteBufferBytes (so it holds at most that plus one message); a file of
// any size streams through it.
//
// The directory belongs to one sink at a time: open() takes an exclusive
// flock on `<dir>/.tidemark-sink.lock` (kLockFileName; location/file_lock.h)
// before anything else, or is given a DestinationClaim that holds it
// (sink_claim.h), and only then deletes every ".*.tmp" in it: a directory
// another process writes is refused (Held, naming the holder from the lock
// file) with its temporaries untouched. The kernel releases the lock when
// the holder dies, so a restart after a crash takes the directory at once.
// commit() checks the claim (or that the lock file is still the one
// locked) right before its rename. Committed files of either format
// (`.json`, `.csv`) are the directory's progress: a sink whose format was
// changed goes on where the other format stopped. Files that are not
// `<20 digits>-<20 digits>.<json|csv>` (unrelated names, other dot-files,
// the lock file) are ignored. A pair at
// time 2^64-1 can never be committed: no finite upper is above it.
//
// Errors: usage errors (a broken REQUIRES) are InvalidUsage and change
// nothing. File-system errors are Determinate with the errno text and the
// path, except commit()'s rename and the directory sync after it, which are
// Indeterminate. Any file-system error while a file is open abandons it
// (the temporary is deleted); write() and commit() then fail until the next
// begin().
//
// Thread-safety: one sink uses a destination from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "location/file_lock.h"
#include "sink/destination.h"
#include "sink/destination_claim.h"
#include "sink/envelope.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"

namespace tidemark {

class FileDestination final : public SinkDestination {
 public:
  static constexpr std::size_t kWriteBufferBytes = 64 << 10;
  static constexpr std::size_t kLineSlackBytes = 64 << 10;
  // Never a committed name nor a temporary: starts with '.', not ".tmp".
  static constexpr std::string_view kLockFileName = ".tidemark-sink.lock";

  // `directory` made absolute and lexically normal, without a trailing '/':
  // the form locks and claims name it by. InvalidUsage when empty.
  [[nodiscard]] static Result<std::string> normalize_directory(std::string_view directory);

  // Creates the directory (normalised) if needed and locks it for
  // `holder` (one line naming the sink and its runner, which a refused
  // opener reports). Held: "file destination DIR is written by <holder>".
  [[nodiscard]] static Result<FileLock> lock_directory(const std::string& directory,
                                                       std::string_view holder);

  // Creates the directory if needed, locks it (or checks that `claim`
  // covers it: InvalidUsage otherwise), then deletes temporaries a crashed
  // sink left (".*.tmp" files) and reads the progress from the committed
  // names. Held when another process holds the directory (nothing deleted).
  // A committed-looking name that does not parse, or committed ranges that
  // overlap, is a Corruption error naming the file.
  [[nodiscard]] static Result<std::unique_ptr<FileDestination>> open(
      std::string directory, Envelope envelope, SinkFormat format,
      std::shared_ptr<DestinationClaim> claim = nullptr);
  ~FileDestination() override;  // an open file not committed is deleted

  // The largest committed upper: everything before it is in committed
  // files. nullopt when nothing is committed yet.
  std::optional<Frontier> progress() const override { return progress_; }

  // Starts a file for times from `lower` on: creates its temporary and, for
  // csv, buffers the header row. REQUIRES: no file open; lower is not closed;
  // lower >= progress() (when set).
  [[nodiscard]] Status begin(Frontier lower) override;
  // Appends the message of one pair. REQUIRES: a file open; the pair's time
  // >= its lower.
  [[nodiscard]] Status write(const DiffPair& pair) override;
  // Bytes written to the open file so far (for rolling).
  std::uint64_t open_bytes() const override;
  // Makes the open file [lower, upper) durable and visible; progress()
  // becomes upper. Held or Determinate, with nothing visible, when the
  // claim (or the lock) no longer holds. REQUIRES: a file open; upper > every time written;
  // upper > lower; upper is not closed (a name needs a finite bound: a
  // runner whose shard closed commits at the last finite frontier). An
  // Indeterminate error means the file may be visible: progress() is upper
  // if the rename happened (only the directory sync failed), unchanged
  // otherwise.
  [[nodiscard]] Status commit(Frontier upper) override;

  std::uint64_t primary_key_violations() const override;

  // A snapshot in parts: each part is a file of its own
  // (committed_name.h's snapshot_part_name), made durable and visible as
  // commit() makes a file; the snapshot's last part is commit(as_of + 1)'s
  // file, and only that one moves progress().
  bool commits_snapshot_in_parts() const override { return true; }
  // From the parts' names (open() reads them), with `check` and no key.
  std::optional<SnapshotPosition> snapshot_position() const override { return snapshot_position_; }
  // Commits the open file as the snapshot part ending at `position`.
  // Errors as for commit(). REQUIRES: progress() is nullopt; the open file
  // began at 0 and holds only pairs at position.as_of; the position follows
  // the last part's (same as_of, more pairs).
  [[nodiscard]] Status commit_snapshot_part(const SnapshotPosition& position) override;

 private:
  struct State;
  explicit FileDestination(std::unique_ptr<State> state);
  Status publish(const std::string& name);
  Status sync_published();
  std::unique_ptr<State> state_;
  std::optional<Frontier> progress_;
  std::optional<SnapshotPosition> snapshot_position_;
};

}  // namespace tidemark
