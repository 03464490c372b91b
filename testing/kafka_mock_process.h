// KafkaMockProcess: runs tidemark-kafka-mock (tools/kafka_mock.cc) as a
// child process for tests and benchmarks, and knows its bootstrap address.
// The destructor kills it (SIGKILL) and reaps it.
//
// Header-only: the tests and the benchmark (in the tidemark binary) both
// start the broker this way.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tidemark/error.h"

extern char** environ;

namespace tidemark {

// librdkafka starts its threads with C11 thrd_create, which GCC 12's
// ThreadSanitizer runtime does not intercept: the first allocation on such
// a thread crashes the runtime. Tests that run a Kafka client skip under
// TSan with this reason, and ctest leaves them out of the TSan run (label
// "kafka", TIDEMARK_KAFKA_TESTS in CMakeLists.txt); they run in the plain
// and ASan builds.
inline constexpr const char* kKafkaUnderTsan =
    "librdkafka's threads (C11 thrd_create) crash GCC 12's TSan runtime";

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderTsan = true;
#else
inline constexpr bool kUnderTsan = false;
#endif

class KafkaMockProcess {
 public:
  // Starts `binary` with `args` and waits (up to 10 s) for its address line.
  static Result<std::unique_ptr<KafkaMockProcess>> start(const std::string& binary,
                                                         const std::vector<std::string>& args) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return determinate("kafka mock: pipe failed");
    std::vector<std::string> storage{binary};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid = -1;
    const int spawned = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    if (spawned != 0) {
      ::close(out[0]);
      return determinate("kafka mock: cannot start " + binary);
    }
    auto process = std::unique_ptr<KafkaMockProcess>(new KafkaMockProcess(pid));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::string line;
    char c;
    while (std::chrono::steady_clock::now() < deadline) {
      ssize_t n = ::read(out[0], &c, 1);
      if (n <= 0) break;
      if (c == '\n') {
        ::close(out[0]);
        process->brokers_ = line;
        return process;
      }
      line.push_back(c);
    }
    ::close(out[0]);
    return determinate("kafka mock: " + binary + " printed no address");
  }

  ~KafkaMockProcess() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }

  const std::string& brokers() const { return brokers_; }
  pid_t pid() const { return pid_; }

 private:
  explicit KafkaMockProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  std::string brokers_;
};

}  // namespace tidemark
