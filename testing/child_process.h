// Child processes for tests and benchmark harnesses, started with
// posix_spawn: stdin from /dev/null, stdout into a file or a pipe the
// caller reads, stderr into a file or the caller's own. One place for the
// spawning the server, the Kafka mock cluster and the fault proxy helpers
// share. Header-only.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace tidemark::testing {

// How a spawned process is grouped. kOwn: a process group of its own, for
// a process the test stops (SIGSTOP). Left in the test's group, a stopped
// server makes that group's orphaning fatal: when the shell that started the
// test exits (a job started with `&` from a script), the kernel sends the
// whole group, the test included, SIGHUP. The price: a Ctrl-C of the test
// does not reach it; the test stops it itself.
enum class ProcessGroup { kTest, kOwn };

// Where a child's stdout and stderr go. stdout: the file `out`, or a pipe
// when `stdout_pipe` is set (its read end is stored there, close-on-exec;
// the caller closes it). stderr: the file `err`, or the caller's stderr.
struct ChildOutput {
  std::filesystem::path out = "/dev/null";
  int* stdout_pipe = nullptr;
  std::optional<std::filesystem::path> err;

  // stdout into a pipe whose read end goes to `*read_end`; stderr the
  // caller's.
  static ChildOutput piped(int* read_end) {
    ChildOutput output;
    output.stdout_pipe = read_end;
    return output;
  }
};

// Starts the program `all[0]` (a path) with arguments `all[1..]`; -1 when
// it could not start (or the pipe could not be made).
inline pid_t spawn_child(std::vector<std::string> all, const ChildOutput& output,
                         ProcessGroup group = ProcessGroup::kTest) {
  int pipe_ends[2] = {-1, -1};
  if (output.stdout_pipe != nullptr && ::pipe2(pipe_ends, O_CLOEXEC) != 0) return -1;
  std::vector<char*> argv;
  for (auto& word : all) argv.push_back(word.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (output.stdout_pipe != nullptr) {
    posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], 1);
  } else {
    posix_spawn_file_actions_addopen(&actions, 1, output.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
  }
  if (output.err) {
    posix_spawn_file_actions_addopen(&actions, 2, output.err->c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
  }
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (group == ProcessGroup::kOwn) {
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
  }
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, &attributes, argv.data(), environ) != 0) pid = -1;
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (output.stdout_pipe != nullptr) {
    ::close(pipe_ends[1]);
    if (pid == -1) {
      ::close(pipe_ends[0]);
    } else {
      *output.stdout_pipe = pipe_ends[0];
    }
  }
  return pid;
}

}  // namespace tidemark::testing
