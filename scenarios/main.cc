// tidemark-scenarios: the bounded-memory scenarios (scenarios/README.md).
//
//   tidemark-scenarios [--short] [--search [--step MIB]] [--cap MIB] [--seed N]
//                      [--random-config] [--watchdog] [--keep] [--dir DIR] [--list]
//                      [--json FILE [--commit TEXT]] [NAME...]
//
// --json FILE writes every run's result, peak RSS, cap and time, with the
// command, the commit (--commit, which scenarios/run passes) and the date
// (scenarios/report.h), after each run.
//
// Exit status: 0 when every scenario run passed, 1 when one failed, 2 on
// usage errors.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "scenarios/http.h"
#include "scenarios/report.h"
#include "scenarios/scenario.h"
#include "util/process_identity.h"

namespace tidemark::scenarios {

namespace fs = std::filesystem;

Run::Run(std::string name, fs::path dir, std::uint64_t seed, MemoryCap& cap,
         CappedServer::Options server_options)
    : name_(std::move(name)),
      dir_(std::move(dir)),
      seed_(seed),
      cap_bytes_(cap.bytes()),
      rng_(seed),
      epoch_(server_options.epoch),
      server_(std::move(server_options), cap) {}

double Run::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
}

void Run::fail(const std::string& what) {
  std::lock_guard lock(mutex_);
  failures_.push_back(what);
  std::fprintf(stderr, "[%7.1fs %s] FAILED CHECK: %s\n", elapsed(), name_.c_str(), what.c_str());
}

void Run::note(const std::string& what) {
  std::lock_guard lock(mutex_);
  notes_.push_back(what);
}

void Run::log(const std::string& what) const {
  std::fprintf(stderr, "[%7.1fs %s] %s\n", elapsed(), name_.c_str(), what.c_str());
}

bool Run::start() {
  if (server_.start()) {
    log("server serving on port " + std::to_string(server_.port()));
    return true;
  }
  fail("start the server: " + server_.error());
  return false;
}

void Run::log_pool_peaks() {
  const Reply reply = http(server_.port(), "GET", "/metrics");
  std::string peaks;
  for (std::size_t at = reply.body.find("tidemark_pool_peak_bytes{pool=\"");
       at != std::string::npos; at = reply.body.find("tidemark_pool_peak_bytes{pool=\"", at + 1)) {
    const auto name = at + 31;
    const auto quote = reply.body.find('"', name);
    const auto value = reply.body.find(' ', quote);
    peaks += " " + reply.body.substr(name, quote - name) + " " +
             format_mib(std::stoull(reply.body.substr(value + 1)));
  }
  if (!peaks.empty())
    log("pool peaks:" + peaks + ", RSS peak so far " + format_mib(server_.peak_bytes()));
}

bool Run::kill_and_restart() {
  log_pool_peaks();
  server_.kill();
  return start();
}

namespace {

struct Settings {
  std::uint64_t seed = 0;
  bool random_config = false;
  bool watchdog = false;
  bool keep = false;
  fs::path dir;
};

std::string mechanism(const MemoryCap& cap) {
  switch (cap.kind()) {
    case MemoryCap::Kind::kCgroupV2:
      return "cgroup v2";
    case MemoryCap::Kind::kCgroupV1:
      return "cgroup v1";
    case MemoryCap::Kind::kWatchdog:
      break;
  }
  return "watchdog";
}

RunReport run_one(const Scenario& scenario, std::uint64_t cap, const Settings& settings) {
  const std::string tag = scenario.name + "-" + std::to_string(cap >> 20) + "mib";
  const fs::path dir = settings.dir / tag;
  std::error_code error;
  fs::remove_all(dir, error);
  fs::create_directories(dir / "data", error);
  auto memory_cap = MemoryCap::create(
      cap, "tidemark-scenario-" + std::to_string(::getpid()) + "-" + tag, settings.watchdog);
  CappedServer::Options options;
  options.binary = TIDEMARK_BINARY;
  options.data_dir = dir / "data";
  options.serve_args = scenario.serve_args(cap);
  options.epoch = std::chrono::steady_clock::now();
  if (settings.random_config) {
    options.extra_env["TIDEMARK_RANDOM_CONFIG"] = std::to_string(settings.seed);
  }
  std::string flags;
  for (const auto& a : options.serve_args) flags += " " + a;
  std::fprintf(stderr, "== %s: cap %s (%s), serve%s\n", scenario.name.c_str(),
               format_mib(cap).c_str(), memory_cap->describe().c_str(), flags.c_str());

  RunReport verdict;
  verdict.scenario = scenario.name;
  verdict.cap_bytes = cap;
  verdict.cap_mechanism = mechanism(*memory_cap);
  {
    Run run(scenario.name, dir, settings.seed, *memory_cap, options);
    scenario.body(run);
    if (run.server().running()) run.log_pool_peaks();
    run.server().stop();
    verdict.seconds = run.elapsed();
    verdict.peak_bytes = run.server().peak_bytes();
    if (auto exit = run.server().unexpected_exit(); !exit.empty()) {
      run.fail("the server died: " + exit);
    }
    if (verdict.peak_bytes > cap) {
      run.fail("peak RSS " + format_mib(verdict.peak_bytes) + " over the cap " + format_mib(cap));
    }
    verdict.passed = !run.failed();
    verdict.server_starts = run.server().incarnations();
    verdict.cap_hits = memory_cap->cap_hits();
    verdict.notes = run.notes();
    verdict.failures = run.failures();
    std::printf("%s %-15s peak RSS %10s  cap %s  %6.1f s  %d server starts, cap hit %llu times\n",
                verdict.passed ? "PASS" : "FAIL", scenario.name.c_str(),
                format_mib(verdict.peak_bytes).c_str(), format_mib(cap).c_str(), verdict.seconds,
                run.server().incarnations(),
                static_cast<unsigned long long>(memory_cap->cap_hits()));
    for (const auto& n : run.notes()) std::printf("     %s\n", n.c_str());
    for (const auto& f : run.failures()) std::printf("     FAILED: %s\n", f.c_str());
    if (!verdict.passed) {
      std::printf("     server log (last 4000 bytes):\n%s\n", run.server().log_tail().c_str());
    }
    std::fflush(stdout);
  }
  if (verdict.passed && !settings.keep) fs::remove_all(dir, error);
  return verdict;
}

int usage(const char* message) {
  std::fprintf(stderr,
               "tidemark-scenarios: %s\nusage: scenarios/run [--short] [--search [--step MIB]] "
               "[--cap MIB] [--seed N] [--random-config] [--watchdog] [--keep] [--dir DIR] "
               "[--list] [--json FILE [--commit TEXT]] [NAME...]\n",
               message);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  settings.seed = std::random_device{}();
  bool only_short = false, search = false, list = false;
  std::uint64_t step = 8 * kMiB;
  std::optional<std::uint64_t> cap_override;
  std::vector<std::string> names;
  std::optional<fs::path> json_file;
  Report report;
  // The command that repeats this run (less --commit, which says what ran).
  report.command = "scenarios/run";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--commit") == 0) {
      ++i;
    } else {
      report.command += std::string(" ") + argv[i];
    }
  }
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  report.date = format_utc(static_cast<std::uint64_t>(now.count()));
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    try {
      if (arg == "--short") {
        only_short = true;
      } else if (arg == "--search") {
        search = true;
      } else if (arg == "--list") {
        list = true;
      } else if (arg == "--random-config") {
        settings.random_config = true;
      } else if (arg == "--watchdog") {
        settings.watchdog = true;
      } else if (arg == "--keep") {
        settings.keep = true;
      } else if (arg == "--step" || arg == "--cap" || arg == "--seed" || arg == "--dir" ||
                 arg == "--json" || arg == "--commit") {
        auto v = value();
        if (!v) return usage((arg + " needs a value").c_str());
        if (arg == "--json") json_file = *v;
        if (arg == "--commit") report.commit = *v;
        if (arg == "--step") step = std::stoull(*v) * kMiB;
        if (arg == "--cap") cap_override = std::stoull(*v) * kMiB;
        if (arg == "--seed") settings.seed = std::stoull(*v);
        if (arg == "--dir") settings.dir = *v;
      } else if (arg.starts_with("--")) {
        return usage(("unknown flag " + arg).c_str());
      } else {
        names.push_back(arg);
      }
    } catch (const std::exception&) {
      return usage(("bad value for " + arg).c_str());
    }
  }
  std::vector<const Scenario*> chosen;
  for (const auto& s : all_scenarios()) {
    if (list)
      std::printf("%-15s cap %s%s  %s\n", s.name.c_str(), format_mib(s.cap).c_str(),
                  s.short_run ? ", short" : "", s.summary.c_str());
    const bool named =
        names.empty() || std::find(names.begin(), names.end(), s.name) != names.end();
    if (named && (!only_short || s.short_run)) {
      chosen.push_back(&s);
      report.scenarios.push_back(s.name);
    } else {
      report.not_run.push_back(s.name);
    }
  }
  if (list) return 0;
  for (const auto& n : names) {
    const bool known = std::any_of(all_scenarios().begin(), all_scenarios().end(),
                                   [&](const Scenario& s) { return s.name == n; });
    if (!known) return usage(("no scenario named " + n + " (see --list)").c_str());
  }
  if (step == 0) return usage("--step must be at least 1 MiB");
  if (settings.dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    settings.dir =
        fs::path(tmp ? tmp : "/tmp") / ("tidemark-scenarios-" + std::to_string(::getpid()));
  }
  std::string again;
  for (const auto* s : chosen) again += " " + s->name;
  std::fprintf(stderr, "scenarios: seed %llu; reproduce with: scenarios/run --seed %llu%s%s\n",
               static_cast<unsigned long long>(settings.seed),
               static_cast<unsigned long long>(settings.seed),
               settings.random_config ? " --random-config" : "", again.c_str());

  report.seed = settings.seed;
  report.random_config = settings.random_config;
  report.search = search;
  // Written once before the first run, so a file that cannot be written
  // fails at once, not after the scenarios.
  if (std::string error; json_file && !write_json_report(*json_file, report, &error)) {
    std::fprintf(stderr, "tidemark-scenarios: %s\n", error.c_str());
    return 2;
  }
  bool all_passed = true;
  auto record = [&](RunReport run) {
    report.runs.push_back(std::move(run));
    std::string error;
    if (json_file && !write_json_report(*json_file, report, &error)) {
      std::fprintf(stderr, "tidemark-scenarios: %s\n", error.c_str());
      all_passed = false;
    }
    return report.runs.back();
  };
  std::vector<std::string> table;
  for (const auto* scenario : chosen) {
    const std::uint64_t start_cap = cap_override.value_or(scenario->cap);
    if (!search) {
      all_passed &= record(run_one(*scenario, start_cap, settings)).passed;
      continue;
    }
    // Lower the cap step by step until the scenario fails.
    std::optional<std::uint64_t> smallest;
    std::uint64_t peak_there = 0, failed_at = 0;
    for (std::uint64_t cap = start_cap; cap >= step; cap -= step) {
      const RunReport v = record(run_one(*scenario, cap, settings));
      if (!v.passed) {
        failed_at = cap;
        break;
      }
      smallest = cap;
      peak_there = v.peak_bytes;
    }
    char row[256];
    if (smallest) {
      std::snprintf(row, sizeof row, "| %s | %s | %s | %s |", scenario->name.c_str(),
                    format_mib(*smallest).c_str(), format_mib(peak_there).c_str(),
                    failed_at ? format_mib(failed_at).c_str() : "-");
    } else {
      all_passed = false;
      std::snprintf(row, sizeof row, "| %s | fails at its own cap %s | | |", scenario->name.c_str(),
                    format_mib(start_cap).c_str());
    }
    table.push_back(row);
  }
  if (search) {
    std::printf(
        "\n| scenario | smallest passing cap | peak RSS there | first failing cap |\n"
        "|---|---|---|---|\n");
    for (const auto& row : table) std::printf("%s\n", row.c_str());
  }
  // The run's directory goes too once nothing failed in it (a failed
  // scenario's directory stays, and so, then, does this one).
  std::error_code error;
  if (!settings.keep) fs::remove(settings.dir, error);  // only when empty
  return all_passed ? 0 : 1;
}

}  // namespace tidemark::scenarios

int main(int argc, char** argv) {
  return tidemark::scenarios::main(argc, argv);
}
