#include "util/ids.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tidemark {
namespace {

bool is_id(const std::string& id) {
  if (id.size() != 32) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Many more ids than one buffer holds, on several threads at once: every
// one well formed and none repeated.
TEST(RandomIdTest, IdsAreHexAndDistinctAcrossThreadsAndBuffers) {
  constexpr int kThreads = 4;
  constexpr int kEach = 20 * static_cast<int>(kIdBufferBytes / 16);
  std::mutex mu;
  std::set<std::string> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<std::string> mine;
      for (int i = 0; i < kEach; ++i) mine.push_back(random_id());
      std::lock_guard lock(mu);
      seen.insert(mine.begin(), mine.end());
      for (const std::string& id : mine) EXPECT_TRUE(is_id(id)) << id;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kThreads * kEach));
}

// A forked child must not hand out the ids its parent's buffer still
// holds: the parent draws one id (so its buffer is full of unused ones),
// forks, and both draw the next ids; they must all differ.
TEST(RandomIdTest, AForkedChildDrawsFreshIds) {
  (void)random_id();
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::string ids;
    for (int i = 0; i < 4; ++i) ids += random_id();
    const bool ok =
        ::write(pipe_fds[1], ids.data(), ids.size()) == static_cast<ssize_t>(ids.size());
    ::_exit(ok ? 0 : 1);
  }
  ::close(pipe_fds[1]);
  std::set<std::string> parent;
  for (int i = 0; i < 4; ++i) parent.insert(random_id());
  char buffer[4 * 32];
  std::size_t got = 0;
  while (got < sizeof buffer) {
    const ssize_t n = ::read(pipe_fds[0], buffer + got, sizeof buffer - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(got, sizeof buffer);
  for (int i = 0; i < 4; ++i) {
    const std::string id(buffer + 32 * i, 32);
    EXPECT_TRUE(is_id(id)) << id;
    EXPECT_FALSE(parent.contains(id)) << "the child repeated the parent's id " << id;
  }
}

}  // namespace
}  // namespace tidemark
