#include "bench_child.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace tidemark::cli {

Result<std::string> run_bench_child(std::string_view mode, const std::filesystem::path& dir) {
  int out[2];
  if (pipe(out) != 0) return determinate("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string mode_arg(mode);
  std::string dir_arg = dir.string();
  char* argv[] = {self.data(), const_cast<char*>("bench"), mode_arg.data(), dir_arg.data(),
                  nullptr};
  pid_t pid;
  int spawned = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (spawned != 0) {
    close(out[0]);
    return determinate("cannot start `tidemark bench " + mode_arg + "`");
  }
  std::string text;
  char buffer[256];
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) {
    text.append(buffer, static_cast<std::size_t>(n));
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return determinate("`tidemark bench " + mode_arg + "` failed");
  }
  return text;
}

}  // namespace tidemark::cli
