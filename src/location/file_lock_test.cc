#include "location/file_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "testing/scratch_directory.h"

namespace tidemark {
namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(FileLockTest, ASecondOpenerIsRefusedNamingTheHolder) {
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/lock";
  auto first = FileLock::acquire(path, "the first holder");
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(first_line(path), "the first holder");
  // Another open file description conflicts, in this process too.
  auto second = FileLock::acquire(path, "the second");
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().kind, ErrorKind::kHeld);
  EXPECT_EQ(second.error().message, "the first holder");
  EXPECT_EQ(first_line(path), "the first holder") << "a refused opener wrote the file";

  ASSERT_TRUE(first->describe("the first holder, now listening"));
  ASSERT_TRUE(first->describe("shorter"));
  EXPECT_EQ(first_line(path), "shorter");
  EXPECT_EQ(FileLock::acquire(path, "x").error().message, "shorter");

  // Through a symlink to the directory: the same file, the same lock.
  std::filesystem::create_directory_symlink(scratch.path(), scratch.path() + "/alias");
  EXPECT_EQ(FileLock::acquire(scratch.path() + "/alias/lock", "x").error().kind, ErrorKind::kHeld);
}

TEST(FileLockTest, ReleasedWhenDestroyed) {
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/lock";
  {
    auto first = FileLock::acquire(path, "one");
    ASSERT_TRUE(first);
  }
  auto second = FileLock::acquire(path, "two");
  ASSERT_TRUE(second) << second.error().message;
  EXPECT_EQ(first_line(path), "two");
}

TEST(FileLockTest, AKilledHoldersLockIsFreeAtOnce) {
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/lock";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // only async-signal-safe calls after fork
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    const char line[] = "the child\n";
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0 || ::write(fd, line, sizeof(line) - 1) < 0) _exit(1);
    (void)::write(ready[1], "x", 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  auto refused = FileLock::acquire(path, "the parent");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().message, "the child");
  ::kill(child, SIGKILL);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  auto taken = FileLock::acquire(path, "the parent");
  ASSERT_TRUE(taken) << taken.error().message;
}

TEST(FileLockTest, KnowsWhenItsFileIsReplaced) {
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/lock";
  auto lock = FileLock::acquire(path, "one");
  ASSERT_TRUE(lock);
  EXPECT_TRUE(lock->still_at_path());
  std::filesystem::remove(path);
  EXPECT_FALSE(lock->still_at_path());
  auto other = FileLock::acquire(path, "two");  // a new file: a second lock
  ASSERT_TRUE(other);
  EXPECT_FALSE(lock->still_at_path());
  EXPECT_TRUE(other->still_at_path());
}

TEST(FileLockTest, AMissingDirectoryIsDeterminate) {
  auto lock = FileLock::acquire("/nonexistent-tidemark-dir/lock", "x");
  ASSERT_FALSE(lock);
  EXPECT_EQ(lock.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(lock.error().message.find("/nonexistent-tidemark-dir/lock"), std::string::npos);
}

}  // namespace
}  // namespace tidemark
