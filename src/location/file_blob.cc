#include "location/file_blob.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "location/posix_io.h"
#include "tidemark/blob_key.h"
#include "util/ids.h"
#include "util/try.h"

namespace tidemark {

namespace {

// The part of `key` before its last '/', or "" for a key at the root.
std::string_view directory_of(std::string_view key) {
  auto slash = key.find_last_of('/');
  return slash == std::string_view::npos ? std::string_view() : key.substr(0, slash);
}

// An object opened for reading. Objects are replaced by rename, never
// rewritten in place, so the descriptor's size stays right while it is open.
struct OpenObject {
  FileDescriptor file;
  std::uint64_t size = 0;
};

// nullopt when there is no object at `path`: nothing there, a missing
// directory on the way, or a directory (which holds other keys).
Result<std::optional<OpenObject>> open_object(const std::string& path) {
  FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!file.valid()) {
    int error_number = errno;
    if (error_number == ENOENT || error_number == ENOTDIR) return std::nullopt;
    return determinate(errno_message("open", path, error_number));
  }
  struct stat info {};
  if (::fstat(file.get(), &info) != 0) return determinate(errno_message("fstat", path, errno));
  if (!S_ISREG(info.st_mode)) return std::nullopt;
  return OpenObject{std::move(file), static_cast<std::uint64_t>(info.st_size)};
}

// Up to `length` bytes from `offset`; shorter only if the file ends first.
Result<std::string> read_at(const OpenObject& object, const std::string& path, std::uint64_t offset,
                            std::uint64_t length) {
  std::string bytes(length, '\0');
  std::uint64_t done = 0;
  while (done < length) {
    ssize_t n = ::pread(object.file.get(), bytes.data() + done, length - done,
                        static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return determinate(errno_message("read", path, errno));
    }
    if (n == 0) break;
    done += static_cast<std::uint64_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

std::unexpected<Error> key_conflict(std::string_view key, std::string_view detail) {
  return invalid_usage("file blob: key \"" + std::string(key) +
                       "\" conflicts with an existing key (a key cannot also be a directory of " +
                       "other keys): " + std::string(detail));
}

}  // namespace

Result<std::unique_ptr<FileBlob>> FileBlob::open(std::string root_directory) {
  if (root_directory.empty()) return invalid_usage("file blob: empty root directory");
  std::error_code error;
  std::filesystem::path absolute = std::filesystem::absolute(root_directory, error);
  if (error) {
    return determinate("file blob: resolve " + root_directory + ": " + error.message());
  }
  std::string root = absolute.lexically_normal().string();
  while (root.size() > 1 && root.ends_with('/')) root.pop_back();
  auto created = create_directories(root);
  if (!created) {
    Error failure = created.error();
    failure.message = "file blob: " + failure.message;
    return std::unexpected(std::move(failure));
  }
  return std::make_unique<FileBlob>(PrivateTag{}, std::move(root));
}

FileBlob::FileBlob(PrivateTag, std::string root_directory) : root_(std::move(root_directory)) {}

std::string FileBlob::path_of(std::string_view key) const {
  std::string path = root_;
  if (!path.ends_with('/')) path += '/';
  path += key;
  return path;
}

std::string FileBlob::directory_path_of(std::string_view key) const {
  std::string_view directory = directory_of(key);
  return directory.empty() ? root_ : path_of(directory);
}

Status FileBlob::prepare_directories(std::string_view key) {
  std::string_view directory = directory_of(key);
  if (directory.empty()) return {};
  {
    std::lock_guard lock(mutex_);
    if (durable_directories_.contains(directory)) return {};
  }
  // Top-down, so each directory's parent exists and is durable first.
  std::size_t end = 0;
  while (end != std::string_view::npos) {
    end = directory.find('/', end + 1);
    std::string_view relative = directory.substr(0, end);
    {
      std::lock_guard lock(mutex_);
      if (durable_directories_.contains(relative)) continue;
    }
    auto made = make_durable_directory(path_of(relative));
    if (!made) {
      if (made.error().is(ErrorKind::kInvalidUsage)) return key_conflict(key, made.error().message);
      return std::unexpected(made.error());
    }
    std::lock_guard lock(mutex_);
    durable_directories_.emplace(relative);
  }
  return {};
}

Result<std::string> FileBlob::write_temporary(const std::string& directory,
                                              std::string_view bytes) {
  // The writer's pid in the name lets list() tell a crash leftover from a
  // write in flight.
  std::string path = directory + "/" + std::string(kBlobTemporaryPrefix) +
                     std::to_string(::getpid()) + "-" + random_id();
  FileDescriptor file(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!file.valid()) return determinate(errno_message("create", path, errno));
  // The target is untouched until the rename, so every failure here is
  // Determinate once the temporary is gone.
  auto written = [&]() -> Status {
    TM_TRY(write_all(file.get(), path, bytes));
    if (::fdatasync(file.get()) != 0) return determinate(errno_message("fdatasync", path, errno));
    if (int error_number = file.close(); error_number != 0) {
      return determinate(errno_message("close", path, error_number));
    }
    return {};
  }();
  if (!written) {
    file.close();
    ::unlink(path.c_str());
    return std::unexpected(written.error());
  }
  return path;
}

namespace {

// How old a temporary must be before list() may take it for a crash
// leftover, even when its writer's pid is gone (a guard against pids from
// another pid namespace sharing the directory).
constexpr std::int64_t kAbandonedTemporarySeconds = 60;

}  // namespace

void FileBlob::remove_if_abandoned(int directory_fd, std::string_view name) {
  // ".tmp-<pid>-<random>"; older names without a pid are left alone.
  std::string_view rest = name.substr(kBlobTemporaryPrefix.size());
  std::size_t dash = rest.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash > 10) return;
  long long pid = 0;
  for (char c : rest.substr(0, dash)) {
    if (c < '0' || c > '9') return;
    pid = pid * 10 + (c - '0');
  }
  if (pid <= 0 || pid > INT32_MAX) return;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return;  // alive, or unknown
  const std::string file(name);
  struct stat info {};
  if (::fstatat(directory_fd, file.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (::time(nullptr) - info.st_mtime < kAbandonedTemporarySeconds) return;
  ::unlinkat(directory_fd, file.c_str(), 0);  // best effort
}

Result<std::optional<std::string>> FileBlob::get(std::string_view key) {
  TM_TRY(validate_blob_key(key));
  std::string path = path_of(key);
  TM_ASSIGN(std::optional<OpenObject> object, open_object(path));
  if (!object) return std::nullopt;
  TM_ASSIGN(std::string bytes, read_at(*object, path, 0, object->size));
  return bytes;
}

Result<std::string> FileBlob::get_range(std::string_view key, std::uint64_t offset,
                                        std::uint64_t length) {
  TM_TRY(validate_blob_key(key));
  std::string path = path_of(key);
  TM_ASSIGN(std::optional<OpenObject> object, open_object(path));
  if (!object) return make_error(ErrorKind::kNotFound, "file blob: no object " + path);
  if (offset >= object->size) return std::string();
  // min() before adding: offset + length may overflow.
  return read_at(*object, path, offset, std::min(length, object->size - offset));
}

Status FileBlob::set(std::string_view key, std::string_view bytes) {
  TM_TRY(validate_blob_key(key));
  TM_TRY(prepare_directories(key));
  std::string target = path_of(key);
  std::string directory = directory_path_of(key);

  auto temporary = write_temporary(directory, bytes);
  if (!temporary) {
    // The directory may have been removed behind our back since we cached
    // it as durable: forget the cache and recreate it once.
    struct stat info {};
    if (::stat(directory.c_str(), &info) != 0 && errno == ENOENT) {
      {
        std::lock_guard lock(mutex_);
        durable_directories_.clear();
      }
      TM_TRY(prepare_directories(key));
      temporary = write_temporary(directory, bytes);
    }
    if (!temporary) return std::unexpected(temporary.error());
  }

  if (::rename(temporary->c_str(), target.c_str()) != 0) {
    int error_number = errno;
    ::unlink(temporary->c_str());
    if (error_number == EISDIR) {
      return key_conflict(key, errno_message("rename over", target, error_number));
    }
    return indeterminate(errno_message("rename " + *temporary + " to", target, error_number));
  }
  return sync_directory(directory, ErrorKind::kIndeterminate);
}

Status FileBlob::remove(std::string_view key) {
  return remove_many({std::string(key)});
}

Status FileBlob::remove_many(const std::vector<std::string>& keys) {
  std::set<std::string> directories;
  for (const std::string& key : keys) {
    TM_TRY(validate_blob_key(key));
    std::string target = path_of(key);
    if (::unlink(target.c_str()) != 0) {
      int error_number = errno;
      // A missing path or a directory means there is no object: success.
      if (error_number == ENOTDIR) continue;
      if (error_number != ENOENT && error_number != EISDIR) {
        return determinate(errno_message("unlink", target, error_number));
      }
      // Still sync below: a concurrent remove of the same key may have
      // unlinked it without syncing yet, and we promise durability.
    }
    directories.insert(directory_path_of(key));
  }
  for (const std::string& directory : directories) {
    auto synced = sync_directory(directory, ErrorKind::kIndeterminate);
    if (!synced) {
      struct stat info {};
      if (::stat(directory.c_str(), &info) != 0 && errno == ENOENT) continue;  // nothing to sync
      return synced;
    }
  }
  return {};
}

Status FileBlob::list(std::string_view prefix,
                      const std::function<void(std::string_view key, std::uint64_t size)>& visit) {
  TM_TRY(validate_blob_prefix(prefix));
  // Start at the deepest directory the prefix names completely; below it,
  // descend only into directories whose keys can still match the prefix.
  auto slash = prefix.find_last_of('/');
  std::string start =
      slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash + 1));
  std::vector<std::string> pending{start};  // key prefixes of directories, each "" or ending in '/'
  while (!pending.empty()) {
    std::string base = std::move(pending.back());
    pending.pop_back();
    std::string directory_path = base.empty() ? root_ : path_of(base);
    std::unique_ptr<DIR, int (*)(DIR*)> directory(::opendir(directory_path.c_str()), &::closedir);
    if (!directory) {
      int error_number = errno;
      // Gone, or never there (removed concurrently, or no key has the prefix).
      if (error_number == ENOENT || error_number == ENOTDIR) continue;
      return determinate(errno_message("open directory", directory_path, error_number));
    }
    while (true) {
      errno = 0;
      const dirent* entry = ::readdir(directory.get());
      if (entry == nullptr) {
        if (errno != 0) return determinate(errno_message("read directory", directory_path, errno));
        break;
      }
      std::string_view name = entry->d_name;
      if (name.starts_with(kBlobTemporaryPrefix)) {
        remove_if_abandoned(::dirfd(directory.get()), name);
        continue;
      }
      // Skips ".", ".." and anything else that is not a key component
      // (files placed by hand), so list reports only keys.
      if (!validate_blob_key(name)) continue;
      std::string key = base + std::string(name);
      struct stat info {};
      if (::fstatat(::dirfd(directory.get()), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed since readdir
        return determinate(errno_message("stat", path_of(key), errno));
      }
      if (S_ISDIR(info.st_mode)) {
        std::string child = key + "/";
        if (child.starts_with(prefix) || prefix.starts_with(child)) {
          pending.push_back(std::move(child));
        }
      } else if (S_ISREG(info.st_mode) && key.starts_with(prefix)) {
        visit(key, static_cast<std::uint64_t>(info.st_size));
      }
    }
  }
  return {};
}

}  // namespace tidemark
