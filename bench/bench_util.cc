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

Result<std::string> run_bench_child(std::string_view mode, const std::vector<std::string>& args) {
  int out[2];
  if (pipe(out) != 0) return determinate("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string mode_arg(mode);
  std::vector<std::string> words = {self, "bench", mode_arg};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  pid_t pid;
  int spawned = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv.data(), environ);
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
