// PosixIo: the few POSIX file-system helpers the file and sqlite backends
// share: an owning file descriptor, errno messages, durable directory
// creation and directory fsync.
//
// Durability model: a new directory entry (a file renamed into place, a
// directory just created) survives a crash only once the directory holding
// it has been fsynced. Helpers here that create entries sync the parent.
//
// Thread-safety: the free functions are safe to call from any thread.
// A FileDescriptor is owned by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "tidemark/error.h"

namespace tidemark {

// Owns an open file descriptor and closes it on destruction. Move-only.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor();

  bool valid() const { return fd_ >= 0; }
  int get() const { return fd_; }

  // Closes now and reports the result: close() can be the first place a
  // deferred write error shows up. The descriptor is invalid afterwards.
  // Returns the errno of a failed close, or 0.
  int close();

 private:
  int fd_ = -1;
};

// "<operation> <path>: <strerror(error_number)>", for error messages.
std::string errno_message(std::string_view operation, std::string_view path, int error_number);

// Makes the entries of `directory` durable. A failure is reported with
// `on_failure` as its kind, because only the caller knows whether anything
// it did before is already visible.
Status sync_directory(const std::string& directory, ErrorKind on_failure);

// Writes all of `bytes` to `fd` (retrying short writes and EINTR); adds
// what it wrote to *written when given, also on failure. An error is
// Determinate and names `path`.
[[nodiscard]] Status write_all(int fd, const std::string& path, std::string_view bytes,
                               std::uint64_t* written = nullptr);

// Creates directory `path` if it is missing (its parent must exist) and
// fsyncs the parent, so the entry is durable even when someone else created
// it and has not synced it yet. Failures are Determinate, except `path`
// existing as a non-directory, which is InvalidUsage.
Status make_durable_directory(const std::string& path);

// Creates `path` and any missing ancestors (like `mkdir -p`), fsyncing the
// parent of each directory it creates so the new entries are durable.
// Failures are Determinate, except a path component that exists and is not
// a directory, which is InvalidUsage.
Status create_directories(const std::string& path);

}  // namespace tidemark
