#include "location/posix_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "util/try.h"

namespace tidemark {

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileDescriptor::~FileDescriptor() {
  close();
}

int FileDescriptor::close() {
  if (fd_ < 0) return 0;
  // Linux releases the descriptor even when close() fails, so retrying
  // after EINTR could close a descriptor another thread just opened.
  int result = ::close(std::exchange(fd_, -1));
  return result == 0 ? 0 : errno;
}

std::string errno_message(std::string_view operation, std::string_view path, int error_number) {
  std::string out(operation);
  out += ' ';
  out += path;
  out += ": ";
  // std::error_code's message is thread-safe, unlike std::strerror.
  out += std::error_code(error_number, std::generic_category()).message();
  return out;
}

Status write_all(int fd, const std::string& path, std::string_view bytes, std::uint64_t* written) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return determinate(errno_message("write", path, errno));
    }
    if (n == 0) return determinate("write " + path + ": no progress");
    bytes.remove_prefix(static_cast<std::size_t>(n));
    if (written) *written += static_cast<std::uint64_t>(n);
  }
  return {};
}

Status sync_directory(const std::string& directory, ErrorKind on_failure) {
  FileDescriptor fd(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return make_error(on_failure, errno_message("open directory", directory, errno));
  if (::fsync(fd.get()) != 0) {
    return make_error(on_failure, errno_message("fsync directory", directory, errno));
  }
  return {};
}

namespace {

// The directory holding `path`'s last component ("/" for "/x", "." for "x").
std::string parent_directory(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// mkdir that treats an existing directory as success. Returns whether this
// call created it.
Result<bool> make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return true;
  int error_number = errno;
  if (error_number == ENOTDIR) {
    // An ancestor is a file: the caller asked for a path that cannot exist.
    return invalid_usage(errno_message("create directory", path, error_number));
  }
  if (error_number != EEXIST)
    return determinate(errno_message("create directory", path, error_number));
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return determinate(errno_message("stat", path, errno));
  if (!S_ISDIR(info.st_mode)) {
    return invalid_usage("create directory " + path + ": exists and is not a directory");
  }
  return false;
}

}  // namespace

Status make_durable_directory(const std::string& path) {
  TM_TRY(make_directory(path));
  return sync_directory(parent_directory(path), ErrorKind::kDeterminate);
}

Status create_directories(const std::string& path) {
  // Walks the components top-down so each parent exists before its child.
  std::size_t start = 0;
  while (start < path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string current = path.substr(0, end);
    start = end + 1;
    if (current.empty() || current.ends_with('/')) continue;  // leading '/' or "//"
    TM_ASSIGN(bool created, make_directory(current));
    if (created) TM_TRY(sync_directory(parent_directory(current), ErrorKind::kDeterminate));
  }
  return {};
}

}  // namespace tidemark
