// The JSON report of a scenarios run (`tidemark-scenarios --json FILE`):
// what ran (command, commit, date, seed), which scenarios it covers and
// which it left out, and per scenario run its result, peak RSS, cap and
// time. scripts/plots.py charts it (docs/data/scenario-caps.json).
//
// Plain values, no threads; the file is rewritten whole after each run, so
// a run stopped half-way still leaves the runs that finished.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tidemark::scenarios {

// One scenario at one cap.
struct RunReport {
  std::string scenario;
  bool passed = false;
  std::uint64_t peak_bytes = 0;  // the server's VmHWM, largest of its incarnations
  std::uint64_t cap_bytes = 0;
  double seconds = 0;
  int server_starts = 0;
  std::uint64_t cap_hits = 0;  // charges the kernel refused at the cap
  std::string cap_mechanism;   // "cgroup v1", "cgroup v2" or "watchdog"
  std::vector<std::string> notes;
  std::vector<std::string> failures;
};

struct Report {
  std::string command;  // a command that repeats the run
  std::string commit;   // "" when unknown (--commit not given)
  std::string date;     // UTC, when the run started
  std::uint64_t seed = 0;
  bool random_config = false;
  bool search = false;
  std::vector<std::string> scenarios;  // chosen, in run order
  std::vector<std::string> not_run;    // every other scenario
  std::vector<RunReport> runs;
};

// Writes `report` to `file` as JSON; on failure returns false with the
// reason in *error.
[[nodiscard]] bool write_json_report(const std::filesystem::path& file, const Report& report,
                                     std::string* error);

}  // namespace tidemark::scenarios
