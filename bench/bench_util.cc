#include "bench_util.h"

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "util/try.h"

extern char** environ;

namespace tidemark::cli {

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

unsigned long long peak_rss_kib() {
  unsigned long long hwm_kib = 0;
  if (FILE* status = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, status)) {
      if (std::sscanf(line, "VmHWM: %llu kB", &hwm_kib) == 1) break;
    }
    std::fclose(status);
  }
  return hwm_kib;
}

Result<BenchDirectory> BenchDirectory::create(std::string_view mode,
                                              const std::optional<std::string>& dir) {
  const bool keep = dir.has_value();
  std::error_code error;
  const std::filesystem::path parent =
      keep ? std::filesystem::absolute(*dir, error) : std::filesystem::temp_directory_path(error);
  if (error) return determinate("bench directory: " + error.message());
  std::filesystem::create_directories(parent, error);
  if (error) return determinate("cannot create " + parent.string() + ": " + error.message());
  std::string path = (parent / ("tidemark-bench-" + std::string(mode) + "-XXXXXX")).string();
  if (::mkdtemp(path.data()) == nullptr) {
    return determinate("cannot create a directory in " + parent.string() + ": " +
                       std::strerror(errno));
  }
  if (keep) std::fprintf(stderr, "bench: this run's data is in %s (kept)\n", path.c_str());
  return BenchDirectory(path, keep);
}

BenchDirectory::~BenchDirectory() {
  if (path_.empty() || keep_) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string blob_url(const std::filesystem::path& dir) {
  return "file://" + (dir / "blob").string();
}

std::string consensus_url(const std::filesystem::path& dir) {
  return "sqlite://" + (dir / "consensus.db").string();
}

std::string BenchPlace::describe() const {
  if (!remote()) return "file + SQLite";
  // The consensus URL may carry a password: show its host part only.
  std::string consensus_shown = consensus;
  if (auto at = consensus_shown.rfind('@'); at != std::string::npos) {
    consensus_shown = consensus_shown.substr(0, consensus_shown.find("://") + 3) + "...@" +
                      consensus_shown.substr(at + 1);
  }
  return blob + " + " + consensus_shown;
}

Result<BenchPlace> bench_place(const std::optional<std::string>& blob,
                               const std::optional<std::string>& consensus,
                               const std::filesystem::path& dir) {
  if (blob.has_value() != consensus.has_value()) {
    return invalid_usage("give both --blob and --consensus, or neither");
  }
  BenchPlace place;
  if (!blob) {
    place.blob = blob_url(dir);
    place.consensus = consensus_url(dir);
    return place;
  }
  place.blob = *blob;
  place.consensus = *consensus;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  place.suffix = "-" + std::to_string(getpid()) + "-" + std::to_string(ms);
  return place;
}

Result<BenchChild> spawn_bench_child(std::string_view mode, const std::vector<std::string>& args,
                                     bool with_stdin) {
  const std::string what = "`tidemark bench " + std::string(mode) + "`";
  int out[2], in[2] = {-1, -1};
  if (pipe(out) != 0) return determinate("cannot start " + what + ": pipe failed");
  if (with_stdin && pipe(in) != 0) {
    close(out[0]);
    close(out[1]);
    return determinate("cannot start " + what + ": pipe failed");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  if (with_stdin) {
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_addclose(&actions, in[1]);
  }
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<std::string> words = {self, "bench", std::string(mode)};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  BenchChild child;
  const int spawned =
      posix_spawn(&child.pid, self.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (with_stdin) close(in[0]);
  if (spawned != 0) {
    close(out[0]);
    if (with_stdin) close(in[1]);
    return determinate("cannot start " + what);
  }
  child.stdout_fd = out[0];
  child.stdin_fd = in[1];
  return child;
}

Result<std::string> run_bench_child(std::string_view mode, const std::vector<std::string>& args) {
  TM_ASSIGN(const BenchChild child, spawn_bench_child(mode, args));
  std::string text;
  char buffer[256];
  for (ssize_t n; (n = read(child.stdout_fd, buffer, sizeof buffer)) > 0;) {
    text.append(buffer, static_cast<std::size_t>(n));
  }
  close(child.stdout_fd);
  int status = 0;
  waitpid(child.pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return determinate("`tidemark bench " + std::string(mode) + "` failed");
  }
  return text;
}

}  // namespace tidemark::cli
