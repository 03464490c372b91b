// A bounded-memory scenario: the worst case it pushes through a capped
// `tidemark serve`, with a SIGKILL and a restart in the middle, and the
// checks that every acknowledged update survived (scenarios/README.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "scenarios/harness.h"

namespace tidemark::scenarios {

inline constexpr std::uint64_t kMiB = 1ull << 20;

// One scenario's run: its directory, its server, its verdict.
class Run {
 public:
  Run(std::string name, std::filesystem::path dir, std::uint64_t seed, MemoryCap& cap,
      CappedServer::Options server_options);

  const std::string& name() const { return name_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path data_dir() const { return dir_ / "data"; }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t cap() const { return cap_bytes_; }
  std::mt19937_64& rng() { return rng_; }
  CappedServer& server() { return server_; }
  std::uint16_t port() const { return server_.port(); }
  double elapsed() const;

  // A failed check: the scenario fails with `what` (and goes on checking).
  void fail(const std::string& what);
  bool check(bool ok, const std::string& what) {
    if (!ok) fail(what);
    return ok;
  }
  // A figure or fact worth printing with the result.
  void note(const std::string& what);
  bool failed() const {
    std::lock_guard lock(mutex_);
    return !failures_.empty();
  }
  const std::vector<std::string>& failures() const { return failures_; }
  const std::vector<std::string>& notes() const { return notes_; }
  // Prints a progress line (stderr) prefixed with the time and scenario.
  void log(const std::string& what) const;

  // Starts the server (a failure to start fails the run).
  bool start();
  // Logs the server's pool peaks (GET /metrics) and its RSS peak so far.
  void log_pool_peaks();
  // SIGKILL, then start again on the same data directory.
  bool kill_and_restart();

 private:
  std::string name_;
  std::filesystem::path dir_;
  std::uint64_t seed_;
  std::uint64_t cap_bytes_;
  std::mt19937_64 rng_;
  std::chrono::steady_clock::time_point epoch_;
  CappedServer server_;
  mutable std::mutex mutex_;
  std::vector<std::string> failures_;
  std::vector<std::string> notes_;
};

struct Scenario {
  std::string name;
  std::string summary;
  std::uint64_t cap;  // the hard memory cap of its definition
  bool short_run;     // CI runs it (ctest label "scenarios")
  // The server's flags under a given cap (search mode lowers the cap).
  std::function<std::vector<std::string>(std::uint64_t cap)> serve_args;
  std::function<void(Run&)> body;
};

const std::vector<Scenario>& all_scenarios();

}  // namespace tidemark::scenarios
