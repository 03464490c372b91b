#include "sink/file_destination.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "location/posix_io.h"
#include "sink/committed_name.h"
#include "util/ids.h"
#include "util/process_identity.h"
#include "util/try.h"

namespace tidemark {
namespace {

// Adds "file destination: " to a helper's error, keeping its kind.
std::unexpected<Error> in_destination(Error error) {
  error.message = "file destination: " + error.message;
  return std::unexpected(std::move(error));
}

}  // namespace

struct FileDestination::State {
  // The file being written: a temporary in the directory, its descriptor,
  // and what commit() must check.
  struct OpenFile {
    FileDescriptor file;
    std::string temporary_path;
    Time lower = 0;
    std::optional<Time> max_time;  // the largest time written, if any
    std::uint64_t flushed_bytes = 0;
  };

  State(std::string directory, Envelope envelope, SinkFormat format)
      : directory(std::move(directory)),
        encoder(envelope, format),
        extension(extension_of(format)) {}

  // OK while this destination still owns the directory.
  Status check_ownership() {
    if (claim) return claim->check();
    if (!lock->still_at_path()) {
      return determinate("file destination: " + lock->path() +
                         " was deleted or replaced: another sink may hold the directory now");
    }
    return {};
  }

  // Writes out the buffer. REQUIRES: open_file.
  Status flush() {
    TM_TRY(write_all(open_file->file.get(), open_file->temporary_path, buffer,
                     &open_file->flushed_bytes));
    buffer.clear();
    // A single message larger than the buffer grew it: give that back.
    if (buffer.capacity() > 2 * kWriteBufferBytes) std::string().swap(buffer);
    return {};
  }

  // Drops the open file: closes and deletes the temporary. Best effort: the
  // temporary is never read as output, and open() deletes leftovers.
  void abandon() {
    if (!open_file) return;
    open_file->file.close();
    ::unlink(open_file->temporary_path.c_str());
    open_file.reset();
    buffer.clear();
  }

  // Abandons the open file and returns `error`, so that a failed write
  // leaves nothing half-written behind.
  std::unexpected<Error> fail(std::unexpected<Error> error) {
    abandon();
    abandoned_after_error = true;
    return error;
  }

  const std::string directory;
  // What makes the directory this destination's: a claim, or its own lock.
  std::shared_ptr<DestinationClaim> claim;
  std::optional<FileLock> lock;
  MessageEncoder encoder;
  const std::string_view extension;
  std::optional<OpenFile> open_file;
  // Lines not yet written to the open file. Flushed once it reaches
  // kWriteBufferBytes.
  std::string buffer;
  // Set when an error abandoned the open file, for a clearer message if the
  // caller keeps writing; cleared by begin().
  bool abandoned_after_error = false;
};

Result<std::string> FileDestination::normalize_directory(std::string_view directory) {
  if (directory.empty()) return invalid_usage("file destination: empty directory");
  std::error_code error;
  std::filesystem::path absolute = std::filesystem::absolute(directory, error);
  if (error) {
    return determinate("file destination: resolve " + std::string(directory) + ": " +
                       error.message());
  }
  std::string root = absolute.lexically_normal().string();
  while (root.size() > 1 && root.ends_with('/')) root.pop_back();
  return root;
}

Result<FileLock> FileDestination::lock_directory(const std::string& directory,
                                                 std::string_view holder) {
  TM_ASSIGN(const std::string root, normalize_directory(directory));
  if (auto created = create_directories(root); !created) return in_destination(created.error());
  auto lock = FileLock::acquire(root + "/" + std::string(kLockFileName), holder);
  if (!lock && lock.error().is(ErrorKind::kHeld)) {
    return make_error(ErrorKind::kHeld,
                      "file destination " + root + " is written by " + lock.error().message);
  }
  if (!lock) return in_destination(lock.error());
  return std::move(*lock);
}

Result<std::unique_ptr<FileDestination>> FileDestination::open(
    std::string directory, Envelope envelope, SinkFormat format,
    std::shared_ptr<DestinationClaim> claim) {
  TM_ASSIGN(const std::string root, normalize_directory(directory));
  if (auto created = create_directories(root); !created) return in_destination(created.error());

  auto state = std::make_unique<State>(root, envelope, format);
  // The directory must be ours before anything in it is deleted.
  if (claim) {
    if (claim->destination() != file_destination_identity(root)) {
      return invalid_usage("file destination " + root + ": the claim given covers " +
                           claim->destination());
    }
    state->claim = std::move(claim);
  } else {
    TM_ASSIGN(state->lock,
              lock_directory(root, "a file destination of " + describe(this_process())));
  }
  ListedOutputs outputs;
  bool removed_temporaries = false;
  {
    std::unique_ptr<DIR, int (*)(DIR*)> listing(::opendir(root.c_str()), &::closedir);
    if (!listing)
      return determinate(errno_message("file destination: open directory", root, errno));
    while (true) {
      errno = 0;
      const dirent* entry = ::readdir(listing.get());
      if (entry == nullptr) {
        if (errno != 0) {
          return determinate(errno_message("file destination: read directory", root, errno));
        }
        break;
      }
      std::string_view name = entry->d_name;
      if (is_temporary_name(name)) {
        // The directory is this sink's (claimed or locked above), so no
        // other writer can be using it: a crashed run's leftover.
        if (::unlinkat(::dirfd(listing.get()), entry->d_name, 0) != 0 && errno != ENOENT) {
          return determinate(errno_message("file destination: delete leftover temporary",
                                           root + "/" + std::string(name), errno));
        }
        removed_temporaries = true;
        continue;
      }
      if (auto added = outputs.add(root, name); !added) return in_destination(added.error());
    }
  }
  if (removed_temporaries) {
    // Not needed for correctness (a temporary that comes back after a crash
    // is deleted again), but it keeps the directory's state settled.
    if (auto synced = sync_directory(root, ErrorKind::kDeterminate); !synced) {
      return in_destination(synced.error());
    }
  }

  auto progress = committed_progress(root, outputs.committed);
  if (!progress) return in_destination(progress.error());
  auto position = snapshot_in_progress(root, outputs.parts, *progress);
  if (!position) return in_destination(position.error());

  auto destination = std::unique_ptr<FileDestination>(new FileDestination(std::move(state)));
  destination->progress_ = *progress;
  destination->snapshot_position_ = std::move(*position);
  return destination;
}

FileDestination::FileDestination(std::unique_ptr<State> state) : state_(std::move(state)) {}

FileDestination::~FileDestination() {
  state_->abandon();
}

Status FileDestination::begin(Frontier lower) {
  State& state = *state_;
  if (state.open_file) {
    return invalid_usage("file destination: begin at " + lower.to_string() +
                         " while the file from " + std::to_string(state.open_file->lower) +
                         " is open");
  }
  if (lower.is_closed()) return invalid_usage("file destination: begin at a closed lower");
  if (progress_ && lower < *progress_) {
    return invalid_usage("file destination: begin at " + lower.to_string() +
                         " is below the progress " + progress_->to_string() +
                         " (already committed)");
  }
  state.abandoned_after_error = false;
  std::string path = state.directory + "/." + bound_text(lower.time()) + "-" + random_id() +
                     std::string(kTemporarySuffix);
  FileDescriptor file(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!file.valid()) return determinate(errno_message("file destination: create", path, errno));
  state.open_file.emplace(
      State::OpenFile{std::move(file), std::move(path), lower.time(), std::nullopt, 0});
  // Room for the lines that take the buffer past kWriteBufferBytes, so a
  // usual line never regrows it (only one over kLineSlackBytes does).
  state.buffer.reserve(kWriteBufferBytes + kLineSlackBytes);
  state.buffer.assign(state.encoder.file_header());
  return {};
}

Status FileDestination::write(const DiffPair& pair) {
  State& state = *state_;
  if (!state.open_file) {
    return invalid_usage(state.abandoned_after_error
                             ? "file destination: write after an error abandoned the open file; "
                               "begin a new one"
                             : "file destination: write with no open file (call begin first)");
  }
  State::OpenFile& file = *state.open_file;
  if (pair.time < file.lower) {
    return invalid_usage("file destination: write at time " + std::to_string(pair.time) +
                         " below the open file's lower " + std::to_string(file.lower));
  }
  state.encoder.append_file_line(pair, &state.buffer);
  file.max_time = std::max(file.max_time.value_or(pair.time), pair.time);
  if (state.buffer.size() >= kWriteBufferBytes) {
    if (auto flushed = state.flush(); !flushed) return state.fail(std::unexpected(flushed.error()));
  }
  return {};
}

std::uint64_t FileDestination::open_bytes() const {
  if (!state_->open_file) return 0;
  return state_->open_file->flushed_bytes + state_->buffer.size();
}

Status FileDestination::commit(Frontier upper) {
  State& state = *state_;
  if (!state.open_file) {
    return invalid_usage(state.abandoned_after_error
                             ? "file destination: commit after an error abandoned the open file; "
                               "begin a new one"
                             : "file destination: commit with no open file (call begin first)");
  }
  State::OpenFile& file = *state.open_file;
  if (upper.is_closed()) {
    return invalid_usage(
        "file destination: commit at a closed upper (a file name needs a finite upper: commit at "
        "the last finite frontier)");
  }
  if (upper.time() <= file.lower) {
    return invalid_usage("file destination: commit at " + upper.to_string() +
                         " is not above the open file's lower " + std::to_string(file.lower));
  }
  if (file.max_time && upper.time() <= *file.max_time) {
    return invalid_usage("file destination: commit at " + upper.to_string() +
                         " is not above the time written " + std::to_string(*file.max_time));
  }

  TM_TRY(publish(committed_name(file.lower, upper.time(), state.extension)));
  progress_ = upper;
  snapshot_position_.reset();
  return sync_published();
}

Status FileDestination::commit_snapshot_part(const SnapshotPosition& position) {
  State& state = *state_;
  if (!state.open_file) {
    return invalid_usage("file destination: commit_snapshot_part with no open file");
  }
  const State::OpenFile& file = *state.open_file;
  TM_ASSIGN(const std::string name,
            next_snapshot_part_name("file destination", file.lower, file.max_time, progress_,
                                    snapshot_position_, position, state.extension));
  TM_TRY(publish(name));
  snapshot_position_ = position;
  return sync_published();
}

// Makes the open file durable and renames it to `name`; sync_published()
// then syncs the directory. The caller records what the name stands for
// in between: after the rename it is visible, whatever the sync does.
Status FileDestination::publish(const std::string& name) {
  State& state = *state_;
  State::OpenFile& file = *state.open_file;
  // Until the rename nothing is visible: every failure here is Determinate.
  if (auto flushed = state.flush(); !flushed) return state.fail(std::unexpected(flushed.error()));
  if (::fdatasync(file.file.get()) != 0) {
    return state.fail(
        determinate(errno_message("file destination: fdatasync", file.temporary_path, errno)));
  }
  if (int error_number = file.file.close(); error_number != 0) {
    return state.fail(
        determinate(errno_message("file destination: close", file.temporary_path, error_number)));
  }
  // The directory must still be ours when a committed name appears.
  if (auto owned = state.check_ownership(); !owned) {
    return state.fail(std::unexpected(owned.error()));
  }
  const std::string target = state.directory + "/" + name;
  if (::rename(file.temporary_path.c_str(), target.c_str()) != 0) {
    int error_number = errno;
    return state.fail(indeterminate(errno_message(
        "file destination: rename " + file.temporary_path + " to", target, error_number)));
  }
  // The file is visible under its final name now: it counts as committed
  // even if the directory sync fails (a restarted sink would see it too,
  // unless a crash loses the entry, in which case it resumes earlier).
  state.open_file.reset();
  state.buffer.clear();
  return {};
}

Status FileDestination::sync_published() {
  if (auto synced = sync_directory(state_->directory, ErrorKind::kIndeterminate); !synced) {
    return in_destination(synced.error());
  }
  return {};
}

std::uint64_t FileDestination::primary_key_violations() const {
  return state_->encoder.primary_key_violations();
}

}  // namespace tidemark
