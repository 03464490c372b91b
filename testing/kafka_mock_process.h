// KafkaMockProcess: runs tidemark-kafka-mock (tools/kafka_mock.cc) as a
// child process for tests and benchmarks, and knows its bootstrap address.
// The destructor kills it (SIGKILL) and reaps it.
//
// Header-only: the tests and the benchmark (in the tidemark binary) both
// start the broker this way.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "testing/child_process.h"
#include "tidemark/error.h"

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
    std::vector<std::string> all{binary};
    all.insert(all.end(), args.begin(), args.end());
    int out = -1;
    const pid_t pid = testing::spawn_child(std::move(all), testing::ChildOutput::piped(&out));
    if (pid == -1) return determinate("kafka mock: cannot start " + binary);
    auto process = std::unique_ptr<KafkaMockProcess>(new KafkaMockProcess(pid));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::string line;
    char c;
    while (std::chrono::steady_clock::now() < deadline) {
      ssize_t n = ::read(out, &c, 1);
      if (n <= 0) break;
      if (c == '\n') {
        ::close(out);
        process->brokers_ = line;
        return process;
      }
      line.push_back(c);
    }
    ::close(out);
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
