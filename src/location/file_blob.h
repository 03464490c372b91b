// FileBlob: a Blob stored as one file per key under a root directory; the
// embedded default (`file:///abs/dir`).
//
// Key "shard/orders/part/abc" is the file <root>/shard/orders/part/abc.
// Keys follow blob_key.h, so no key escapes the root. Because keys are
// paths, a key cannot also be a directory of other keys ("a" and "a/b");
// setting the second is InvalidUsage.
//
// Invariants:
//   - set is atomic: the bytes go to <dir>/.tmp-<pid>-<random id>, which is
//     fsynced and then renamed over the target, so a reader (in any process)
//     sees the old file or the new one, never a mix;
//   - set and remove are durable when they return: the containing directory
//     is fsynced after the rename or unlink, and every directory set creates
//     has its parent fsynced before the object is written into it;
//   - ".tmp-" files (in flight, or left by a crash) are never listed or
//     read as objects; neither is any file whose name is not a valid key.
//     list() deletes the crash leftovers it passes: temporaries whose
//     writer's pid no longer exists and that are over a minute old.
//   - directories are never removed, so they stay valid for concurrent sets.
//
// Errors: a failure before the rename (nothing visible changed) is
// Determinate; a failed rename or a failed fsync of the directory after it
// is Indeterminate. Messages name the path and the errno text.
//
// Thread-safety: safe for concurrent use from many threads, and from several
// processes sharing the root (every step is a single atomic file-system
// operation on a uniquely named temporary or on the target).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "tidemark/location.h"

namespace tidemark {

class FileBlob : public Blob {
 public:
  // Opens the blob rooted at `root_directory`, creating it and any missing
  // ancestors durably. A relative path is taken relative to the current
  // directory at open time.
  [[nodiscard]] static Result<std::unique_ptr<FileBlob>> open(std::string root_directory);

  [[nodiscard]] Result<std::optional<std::string>> get(std::string_view key) override;
  [[nodiscard]] Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                              std::uint64_t length) override;
  [[nodiscard]] Status set(std::string_view key, std::string_view bytes) override;
  [[nodiscard]] Status remove(std::string_view key) override;
  // Unlinks every key, then syncs each directory once.
  [[nodiscard]] Status remove_many(const std::vector<std::string>& keys) override;
  [[nodiscard]] Status list(
      std::string_view prefix,
      const std::function<void(std::string_view key, std::uint64_t size)>& visit) override;

  const std::string& root_directory() const { return root_; }

 private:
  // Lets open() use std::make_unique while keeping construction private.
  struct PrivateTag {};

 public:
  FileBlob(PrivateTag, std::string root_directory);

 private:
  // <root>/<key>, and the directory holding it (the root for "a").
  std::string path_of(std::string_view key) const;
  std::string directory_path_of(std::string_view key) const;

  // Creates the directories of `key` below the root (its path without the
  // last component) and makes each one's entry durable.
  [[nodiscard]] Status prepare_directories(std::string_view key);

  // Deletes the temporary `name` in the directory if its writer is dead
  // (see the invariants above).
  static void remove_if_abandoned(int directory_fd, std::string_view name);
  // Writes `bytes` to a fresh temporary in `directory`; returns its path.
  [[nodiscard]] Result<std::string> write_temporary(const std::string& directory,
                                                    std::string_view bytes);

  const std::string root_;  // absolute, no trailing '/'

  std::mutex mutex_;
  // Directories below the root (relative, no trailing '/') whose entries
  // this instance has made durable, so later sets skip the mkdir + fsync.
  // Safe to cache because FileBlob never removes directories.
  std::set<std::string, std::less<>> durable_directories_;  // guarded by mutex_
};

}  // namespace tidemark
