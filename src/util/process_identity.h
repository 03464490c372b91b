// ProcessIdentity: who a process is, in a form another process can check.
//
// A pid alone names a process only until it exits: the kernel reuses pids.
// (pid, start time in clock ticks since boot) names one process for good
// within one boot, and pids compare only inside one pid namespace of one
// boot, so `machine` is the boot id and the pid namespace together. Two
// identities with the same `machine` can be checked against each other's
// /proc; on different machines (or containers) nothing can be told.
//
// Thread-safety: pure functions of the kernel's state; safe from any thread.
// Memory: a few short strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tidemark {

struct ProcessIdentity {
  std::string host;     // the host name, for people
  std::string machine;  // "<boot id>/<pid namespace>"; "" when unknown
  std::int64_t pid = 0;
  std::uint64_t start_ticks = 0;    // /proc/<pid>/stat's starttime
  std::uint64_t started_at_ms = 0;  // wall clock, ms since the epoch, for people

  bool operator==(const ProcessIdentity&) const = default;
};

// This process.
ProcessIdentity this_process();

// The process `pid` of this machine as it is now; nullopt when there is
// none (or /proc cannot tell).
std::optional<ProcessIdentity> process_identity(std::int64_t pid);

enum class Liveness : std::uint8_t {
  kAlive,    // the same process still runs (stopped or paused counts as running)
  kDead,     // no process with that pid, a zombie, or another process reusing the pid
  kUnknown,  // another machine or pid namespace, or /proc could not tell
};

// Whether the process `identity` names still runs, seen from this process.
Liveness liveness(const ProcessIdentity& identity);

// "2024-05-01T12:00:00Z" (UTC, whole seconds), for messages.
std::string format_utc(std::uint64_t ms_since_epoch);

// "pid P on host H, started T": a process named for people.
std::string describe(const ProcessIdentity& identity);

}  // namespace tidemark
