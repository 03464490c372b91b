#include "location/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "util/try.h"

namespace tidemark {
namespace {

// The holder's line, or "" while it has written none: a holder writes its
// whole line with one pwrite, then cuts what an older, longer line left.
std::string read_holder_line(int fd) {
  std::string text(4096, '\0');
  const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  if (n <= 0) return "";
  text.resize(static_cast<std::size_t>(n));
  const auto newline = text.find('\n');
  if (newline == std::string::npos) return "";
  text.resize(newline);
  return text;
}

}  // namespace

Result<FileLock> FileLock::acquire(const std::string& path, std::string_view holder) {
  FileDescriptor file(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!file.valid()) return determinate(errno_message("open lock file", path, errno));
  if (::flock(file.get(), LOCK_EX | LOCK_NB) != 0) {
    const int error_number = errno;
    if (error_number != EWOULDBLOCK) {
      return determinate(errno_message("lock", path, error_number));
    }
    // The holder may have locked the file and not yet written its line.
    std::string line;
    for (int attempt = 0; attempt < 20 && line.empty(); ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      line = read_holder_line(file.get());
    }
    return make_error(ErrorKind::kHeld,
                      line.empty() ? "a process that has not said who it is yet" : line);
  }
  FileLock lock(path, std::move(file));
  TM_TRY(lock.describe(holder));
  return lock;
}

Status FileLock::describe(std::string_view holder) {
  if (holder.find('\n') != std::string_view::npos) {
    return invalid_usage("a lock holder's description is one line");
  }
  const std::string line = std::string(holder) + "\n";
  const ssize_t n = ::pwrite(file_.get(), line.data(), line.size(), 0);
  if (n != static_cast<ssize_t>(line.size())) {
    return determinate(errno_message("write lock file", path_, n < 0 ? errno : EIO));
  }
  if (::ftruncate(file_.get(), static_cast<off_t>(line.size())) != 0) {
    return determinate(errno_message("truncate lock file", path_, errno));
  }
  return {};
}

bool FileLock::still_at_path() const {
  struct stat held {};
  struct stat named {};
  if (::fstat(file_.get(), &held) != 0 || ::stat(path_.c_str(), &named) != 0) return false;
  return held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

}  // namespace tidemark
