// Crash test: a child process appends to a shard in a loop on the embedded
// default (file blob + SQLite) and is killed with SIGKILL at random moments,
// many times. After each kill a fresh process-level client checks that
// every append the child acknowledged is present, and that every append
// that is visible at all is visible whole (nothing half-visible).
//
// The child is this same binary run with `--child DIR`; it prints
// "ack T" after the append at time T returned success.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/write.h"

extern char** environ;

namespace tidemark {
namespace {

std::string g_self;

// Appends at time t: a big multi-part batch every fifth time, else a small one.
int records_at(Time t) {
  return t % 5 == 4 ? 3000 : 20;
}

ClientOptions crash_options() {
  ClientOptions options;
  options.part_target_bytes = 16 << 10;  // big batches span many parts
  return options;
}

std::shared_ptr<Client> open_dir(const std::string& dir) {
  auto client =
      Client::open("file://" + dir + "/blob", "sqlite://" + dir + "/consensus.db", crash_options());
  if (!client) {
    std::fprintf(stderr, "open: %s\n", client.error().to_string().c_str());
    std::exit(2);
  }
  return *client;
}

int child_main(const std::string& dir) {
  auto shard = open_dir(dir)->open_shard("crash");
  if (!shard) return 2;
  auto writer = (*shard)->open_writer();
  if (!writer) return 2;
  for (;;) {
    Time t = (*writer)->upper().time();
    BatchBuilder builder = (*writer)->builder(Frontier::at(t));
    for (int j = 0; j < records_at(t); ++j) {
      if (!builder.add("t" + std::to_string(t) + "-" + std::to_string(j), std::to_string(t), t,
                       1)) {
        return 2;
      }
    }
    auto batch = builder.finish(Frontier::at(t + 1));
    if (!batch) return 2;
    std::vector<Batch> batches;
    batches.push_back(std::move(*batch));
    auto appended = (*writer)->compare_and_append(batches, Frontier::at(t), Frontier::at(t + 1));
    if (!appended) {
      std::fprintf(stderr, "append: %s\n", appended.error().to_string().c_str());
      return 2;
    }
    std::printf("ack %llu\n", static_cast<unsigned long long>(t));
    std::fflush(stdout);
  }
}

TEST(CrashTest, AcknowledgedAppendsSurviveSigkill) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tidemark-crash-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(open_dir(dir.string())->create_shard("crash"));

  std::mt19937_64 rng(std::random_device{}());
  std::set<Time> acked;
  const int rounds = 25;
  for (int round = 0; round < rounds; ++round) {
    int out[2];
    ASSERT_EQ(pipe(out), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::string dir_arg = dir.string();
    char* argv[] = {g_self.data(), const_cast<char*>("--child"), dir_arg.data(), nullptr};
    pid_t pid;
    ASSERT_EQ(posix_spawn(&pid, g_self.c_str(), &actions, nullptr, argv, environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);

    // Let it run a random while, then kill it mid-whatever.
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(std::uniform_int_distribution<int>(5, 250)(rng));
    std::string output;
    char buffer[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out[0], POLLIN, 0};
      if (poll(&p, 1, 5) > 0) {
        ssize_t n = read(out[0], buffer, sizeof buffer);
        if (n > 0) output.append(buffer, n);
      }
    }
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited on its own (status " << status << ")";
    for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) output.append(buffer, n);
    close(out[0]);
    for (std::size_t pos = 0; (pos = output.find("ack ", pos)) != std::string::npos; pos += 4) {
      acked.insert(std::stoull(output.substr(pos + 4)));
    }

    // A fresh client (as after a restart) sees every acknowledged append
    // whole, and every visible append whole.
    auto shard = *open_dir(dir.string())->open_shard("crash");
    Frontier upper = *shard->upper();
    ASSERT_FALSE(upper.is_closed());
    if (!acked.empty()) {
      ASSERT_GT(upper.time(), *acked.rbegin()) << "an acknowledged append is lost";
    }
    if (upper.time() == 0) continue;
    auto cursor = shard->snapshot(upper.time() - 1);
    ASSERT_TRUE(cursor) << cursor.error().to_string();
    std::map<Time, int> per_time;
    for (;;) {
      auto row = cursor->next();
      ASSERT_TRUE(row) << row.error().to_string();
      if (!*row) break;
      ASSERT_EQ((*row)->diff, 1) << "an update counted twice: " << (*row)->key;
      per_time[std::stoull(std::string((*row)->value))]++;
    }
    for (Time t = 0; t < upper.time(); ++t) {
      ASSERT_EQ(per_time[t], records_at(t)) << "append at time " << t << " is not whole";
    }
    ASSERT_EQ(per_time.size(), upper.time());
  }
  std::printf("%d kills, %zu acknowledged appends verified\n", rounds, acked.size());
  EXPECT_GT(acked.size(), 10u) << "the child made too little progress to test anything";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tidemark

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--child") == 0) return tidemark::child_main(argv[2]);
  tidemark::g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
