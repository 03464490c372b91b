// FileLock: an exclusive advisory lock (flock) on one file, with a line in
// the file that names its holder.
//
// The kernel holds the lock for the open file description: until the
// FileLock goes, or the process dies in any way (SIGKILL included), so a
// crashed holder never blocks the next one. The lock is taken without
// waiting. Another open of the same file, in this process or any other,
// conflicts; so does a path that reaches the file through a symlink. The
// descriptor is close-on-exec: children never inherit the lock.
//
// The file is never deleted (a new file under the same name would be a
// second lock), and only the holder writes it: its first line describes the
// holder, for the error another process reports when it finds the lock
// taken. On NFS, flock is a POSIX lock on the server (Linux >= 2.6.12), so
// the lock holds across machines there too.
//
// Thread-safety: a FileLock is owned by one thread at a time; the
// functions are safe from any thread. Memory: one descriptor and a path.
#pragma once

#include <string>
#include <string_view>

#include "location/posix_io.h"
#include "tidemark/error.h"

namespace tidemark {

class FileLock {
 public:
  FileLock(FileLock&&) noexcept = default;
  FileLock& operator=(FileLock&&) noexcept = default;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() = default;  // closing the descriptor releases the lock

  // Opens (creating) `path` and locks it, then writes `holder` as its line.
  // Held: another open file holds it; the message is the line the holder
  // wrote (or says that it has written none yet). Determinate for a
  // file-system error, naming the path. REQUIRES: `holder` has no newline.
  [[nodiscard]] static Result<FileLock> acquire(const std::string& path, std::string_view holder);

  // Replaces the holder's line (say, once a server knows its port).
  [[nodiscard]] Status describe(std::string_view holder);

  // True while `path` still names the locked file: false once someone
  // deleted or replaced it, when a new opener could lock a new file.
  bool still_at_path() const;

  const std::string& path() const { return path_; }

 private:
  FileLock(std::string path, FileDescriptor file)
      : path_(std::move(path)), file_(std::move(file)) {}

  std::string path_;
  FileDescriptor file_;
};

}  // namespace tidemark
