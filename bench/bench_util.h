// What the benches share: timing, CPU time and peak RSS, percentiles, the
// scratch directory and the embedded location in it, and child processes.
//
// Benchmarks that measure a cold start or a process's own memory run part
// of their work in a child: this same binary as `tidemark bench <mode>
// <dir>`, which prints its figures on stdout. A spawned child must read its
// peak RSS itself (VmHWM): ru_maxrss of a child also counts the parent's
// RSS, which exec carries over.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tidemark/error.h"

namespace tidemark::cli {

using BenchClock = std::chrono::steady_clock;

inline double seconds_since(BenchClock::time_point start) {
  return std::chrono::duration<double>(BenchClock::now() - start).count();
}

// User + system CPU seconds of this process so far.
double cpu_seconds();

// This process image's own peak RSS in KiB (VmHWM; 0 if unreadable).
unsigned long long peak_rss_kib();

// The value at fraction p (0..1) of the sorted values; 0 when empty.
template <typename T>
double percentile(std::vector<T> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  std::size_t index = static_cast<std::size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return static_cast<double>(values[std::min(index, values.size() - 1)]);
}

// A bench's scratch directory: a fresh directory that mkdtemp makes,
// named tidemark-bench-<mode>-XXXXXX. A bench writes only inside it and
// deletes only it, never anything else, so --dir may name any directory.
// Without --dir it is made in the system's temporary directory and removed
// with everything in it on destruction; with --dir DIR it is made in DIR
// (created if missing) and kept, so its data can be profiled, and create()
// prints its path on stderr.
class BenchDirectory {
 public:
  [[nodiscard]] static Result<BenchDirectory> create(std::string_view mode,
                                                     const std::optional<std::string>& dir);

  BenchDirectory(BenchDirectory&& other) noexcept
      : path_(std::move(other.path_)), keep_(other.keep_) {
    other.path_.clear();
  }
  BenchDirectory& operator=(BenchDirectory&&) = delete;
  BenchDirectory(const BenchDirectory&) = delete;
  BenchDirectory& operator=(const BenchDirectory&) = delete;
  ~BenchDirectory();

  // Absolute.
  const std::filesystem::path& path() const { return path_; }

 private:
  BenchDirectory(std::filesystem::path path, bool keep) : path_(std::move(path)), keep_(keep) {}

  std::filesystem::path path_;  // empty once moved from
  bool keep_;
};

// The embedded default under `dir`: file://DIR/blob and sqlite://DIR/consensus.db.
std::string blob_url(const std::filesystem::path& dir);
std::string consensus_url(const std::filesystem::path& dir);

// Where a bench's shards live: the embedded default in its scratch
// directory, or the URLs given with the global `--blob URL --consensus URL`
// (or TIDEMARK_BLOB / TIDEMARK_CONSENSUS; both or neither), e.g. S3 +
// PostgreSQL. Against shared URLs every run names its
// shards `<name>-<pid>-<ms>`, so runs never meet (nor clean up: the
// shards stay where they were written).
struct BenchPlace {
  std::string blob;
  std::string consensus;
  std::string suffix;  // "" on the embedded default

  bool remote() const { return !suffix.empty(); }
  std::string shard(std::string_view name) const { return std::string(name) + suffix; }
  // "file + SQLite" or the two URLs, for the report.
  std::string describe() const;
};

// From `--blob` / `--consensus` (InvalidUsage if only one is given), else
// the embedded default under `dir`.
[[nodiscard]] Result<BenchPlace> bench_place(const std::optional<std::string>& blob,
                                             const std::optional<std::string>& consensus,
                                             const std::filesystem::path& dir);

// A child `tidemark bench MODE ARGS...` of this binary, started: its pid,
// the read end of a pipe from its standard output, and with `with_stdin`
// the write end of a pipe to its standard input (else -1). The caller
// closes both and waits for the pid.
struct BenchChild {
  pid_t pid = -1;
  int stdout_fd = -1;
  int stdin_fd = -1;
};
[[nodiscard]] Result<BenchChild> spawn_bench_child(std::string_view mode,
                                                   const std::vector<std::string>& args,
                                                   bool with_stdin = false);

// Runs `tidemark bench MODE ARGS...` and returns its standard output; an
// error if it could not start or did not exit with status 0.
[[nodiscard]] Result<std::string> run_bench_child(std::string_view mode,
                                                  const std::vector<std::string>& args);
inline Result<std::string> run_bench_child(std::string_view mode,
                                           const std::filesystem::path& dir) {
  return run_bench_child(mode, std::vector<std::string>{dir.string()});
}

}  // namespace tidemark::cli
