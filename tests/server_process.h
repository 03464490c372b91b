// Real `tidemark` processes for the integration tests: a server started with
// posix_spawn and found by the port it prints, and a command run to its end
// with its output captured. Header-only; tests only.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/child_process.h"

namespace tidemark::testing {

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Starts the program `all[0]` with arguments `all[1..]` (stdin /dev/null,
// stdout to `out` or /dev/null, stderr to `err`); -1 when it could not
// start.
inline pid_t spawn_process(std::vector<std::string> all, const std::filesystem::path& err,
                           const std::filesystem::path& out = "/dev/null",
                           ProcessGroup group = ProcessGroup::kTest) {
  return spawn_child(std::move(all), ChildOutput{out, nullptr, err}, group);
}

// TIDEMARK_BINARY with `words`, as spawn_process.
inline pid_t spawn_tidemark(const std::vector<std::string>& words, const std::filesystem::path& err,
                            const std::filesystem::path& out = "/dev/null",
                            ProcessGroup group = ProcessGroup::kTest) {
  std::vector<std::string> all = {TIDEMARK_BINARY};
  all.insert(all.end(), words.begin(), words.end());
  return spawn_process(std::move(all), err, out, group);
}

// Stops a spawned process (SIGTERM) and reaps it when the scope ends.
struct StopOnExit {
  pid_t pid = -1;
  ~StopOnExit() {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
  }
};

struct ServerProcess {
  pid_t pid = -1;
  std::uint16_t port = 0;  // 0: it did not start serving within 5 s
};

// `tidemark LOCATION_WORDS... serve --listen 127.0.0.1:0`, waiting for the
// "serving on" line on stderr (written to `err`) to learn its port.
inline ServerProcess start_server(const std::vector<std::string>& location_words,
                                  const std::filesystem::path& err,
                                  const std::vector<std::string>& serve_flags = {},
                                  ProcessGroup group = ProcessGroup::kTest) {
  std::vector<std::string> words = location_words;
  words.insert(words.end(), {"serve", "--listen", "127.0.0.1:0"});
  words.insert(words.end(), serve_flags.begin(), serve_flags.end());
  ServerProcess server;
  server.pid = spawn_tidemark(words, err, "/dev/null", group);
  for (int i = 0; i < 200 && server.pid > 0; ++i) {
    const std::string text = slurp(err);
    const auto at = text.find("serving on http://127.0.0.1:");
    if (at != std::string::npos) {
      server.port = static_cast<std::uint16_t>(std::stoul(text.substr(at + 28)));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return server;
}

// Runs `tidemark words...` to its end: its exit status (-1 if it did not
// exit normally) and stdout.
struct CommandOutcome {
  int status = -1;
  std::string out;
  std::string err;
};

inline CommandOutcome run_tidemark(const std::vector<std::string>& words,
                                   const std::filesystem::path& scratch, const std::string& tag) {
  const auto out = scratch / (tag + ".out"), err = scratch / (tag + ".err");
  CommandOutcome outcome;
  pid_t pid = spawn_tidemark(words, err, out);
  if (pid <= 0) return outcome;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  outcome.out = slurp(out);
  outcome.err = slurp(err);
  return outcome;
}

}  // namespace tidemark::testing
