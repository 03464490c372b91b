// The bounded-memory scenarios' harness: a `tidemark serve` process under a
// hard memory cap, killed with SIGKILL and restarted on the same data
// directory, its memory sampled the whole time.
//
// The cap, in order of preference:
//   - a memory cgroup v2 (memory.max, swap off) made under the cgroup v2
//     mount when its memory controller is enabled for children and
//     writable;
//   - a memory cgroup v1 (memory.limit_in_bytes, and memsw when the kernel
//     accounts swap) under /sys/fs/cgroup/memory;
//   - otherwise a watchdog: a thread reading the server's VmRSS every
//     10 ms that SIGKILLs it once over the cap, as the kernel would.
// The server joins its cgroup between fork and exec, so every byte it ever
// maps is charged. A cgroup also charges the page cache of the files the
// server writes; the kernel reclaims that before it kills, so only memory
// the server cannot give back makes it fail.
//
// The figure: the server's peak resident set (VmHWM), the largest over its
// incarnations, read every 10 ms and just before each kill. An exit the
// harness did not cause (the kernel's OOM kill, the watchdog, a crash) fails
// the scenario.
//
// Memory of the harness itself: O(samples) for the RSS series (one per
// 10 ms sampled, 16 bytes each); the scenarios bound the rest.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tidemark::scenarios {

class MemoryCap {
 public:
  enum class Kind { kCgroupV2, kCgroupV1, kWatchdog };

  // Makes a cgroup named `name` capped at `bytes`, or falls back to the
  // watchdog (see above). `force_watchdog` skips the cgroups.
  static std::unique_ptr<MemoryCap> create(std::uint64_t bytes, const std::string& name,
                                           bool force_watchdog);
  ~MemoryCap();  // removes the cgroup (its processes must be gone)

  Kind kind() const { return kind_; }
  std::uint64_t bytes() const { return bytes_; }
  std::string describe() const;  // "cgroup v1 /sys/fs/cgroup/memory/x" or "watchdog"
  // The file a child writes its pid into to join; empty for the watchdog.
  const std::string& procs_file() const { return procs_file_; }
  // How often the kernel refused a charge at the cap (failcnt / events
  // max); 0 for the watchdog.
  std::uint64_t cap_hits() const;
  // OOM kills the kernel made in this cgroup; 0 where it does not say.
  std::uint64_t oom_kills() const;

 private:
  MemoryCap(Kind kind, std::uint64_t bytes, std::string directory);
  Kind kind_;
  std::uint64_t bytes_;
  std::string directory_;
  std::string procs_file_;
};

struct RssSample {
  double seconds;  // since the scenario started
  std::uint64_t rss_bytes;
};

// One `tidemark serve` on one data directory, started and killed again and
// again. Not thread-safe except port(), running() and the figures.
class CappedServer {
 public:
  struct Options {
    std::string binary;  // the tidemark executable
    std::filesystem::path data_dir;
    std::vector<std::string> serve_args;           // after "serve --listen 127.0.0.1:0"
    std::map<std::string, std::string> extra_env;  // e.g. TIDEMARK_RANDOM_CONFIG
    std::chrono::steady_clock::time_point epoch;   // the scenario's start
  };

  CappedServer(Options options, MemoryCap& cap);
  ~CappedServer();  // kills a running server

  // Starts an incarnation and waits (up to 60 s) for it to serve; false
  // with the reason in `error()` otherwise.
  bool start();
  // SIGKILL, waited for.
  void kill();
  // SIGTERM (graceful), waited for up to 60 s, then SIGKILL.
  void stop();

  // The flags of the next start.
  void set_serve_args(std::vector<std::string> args) { options_.serve_args = std::move(args); }
  std::uint16_t port() const { return port_.load(); }
  bool running() const;
  int incarnations() const { return incarnation_; }
  // The largest VmHWM seen over every incarnation.
  std::uint64_t peak_bytes() const { return peak_.load(); }
  // Why an incarnation ended without the harness asking ("" if none did).
  std::string unexpected_exit() const;
  std::string error() const { return error_; }
  std::vector<RssSample> samples() const;
  // The server's stderr, every incarnation (for failure reports).
  std::string log_tail(std::size_t bytes = 4000) const;

 private:
  void end(int signal);  // signal, then SIGKILL after 60 s; waited for
  void sample_loop(pid_t pid);
  void reap(pid_t pid, int status);

  Options options_;
  MemoryCap& cap_;
  std::atomic<std::uint16_t> port_{0};
  std::atomic<std::uint64_t> peak_{0};
  int incarnation_ = 0;
  std::string error_;

  mutable std::mutex mutex_;
  std::condition_variable exited_cv_;
  pid_t pid_ = -1;
  bool exited_ = true;
  bool expected_exit_ = false;
  std::string unexpected_;
  std::vector<RssSample> samples_;
  std::thread sampler_;
};

// /proc/<pid>/status fields in bytes (VmRSS, VmHWM); 0 when unreadable.
std::uint64_t proc_status_bytes(pid_t pid, const char* field);

std::string format_mib(std::uint64_t bytes);

}  // namespace tidemark::scenarios
