#include "util/process_identity.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

namespace tidemark {
namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

struct ProcStat {
  char state = '?';
  std::uint64_t start_ticks = 0;
};

// /proc/<pid>/stat: "pid (comm) state ppid ... starttime ...". comm may hold
// spaces and parentheses, so the fields are counted after the last ')'.
std::optional<ProcStat> read_proc_stat(std::int64_t pid) {
  const std::string text = read_first_line("/proc/" + std::to_string(pid) + "/stat");
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  ProcStat stat;
  std::string field;
  // Field 3 is the state; field 22 the start time.
  for (int number = 3; number <= 22 && fields >> field; ++number) {
    if (number == 3) stat.state = field.empty() ? '?' : field[0];
    if (number == 22) {
      auto [end, error] =
          std::from_chars(field.data(), field.data() + field.size(), stat.start_ticks);
      if (error != std::errc{}) return std::nullopt;
      return stat;
    }
  }
  return std::nullopt;
}

// The boot time in seconds since the epoch ("btime" in /proc/stat), or 0.
std::uint64_t boot_time_seconds() {
  std::ifstream in("/proc/stat");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("btime ")) {
      std::uint64_t seconds = 0;
      std::from_chars(line.data() + 6, line.data() + line.size(), seconds);
      return seconds;
    }
  }
  return 0;
}

std::string machine_id() {
  const std::string boot = read_first_line("/proc/sys/kernel/random/boot_id");
  char target[128];
  const ssize_t n = ::readlink("/proc/self/ns/pid", target, sizeof(target) - 1);
  if (boot.empty() || n <= 0) return "";
  return boot + "/" + std::string(target, static_cast<std::size_t>(n));
}

}  // namespace

std::optional<ProcessIdentity> process_identity(std::int64_t pid) {
  const auto stat = read_proc_stat(pid);
  if (!stat) return std::nullopt;
  ProcessIdentity identity;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) identity.host = host;
  identity.machine = machine_id();
  identity.pid = pid;
  identity.start_ticks = stat->start_ticks;
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  if (const std::uint64_t boot = boot_time_seconds(); boot > 0 && ticks_per_second > 0) {
    identity.started_at_ms =
        boot * 1000 + stat->start_ticks * 1000 / static_cast<std::uint64_t>(ticks_per_second);
  }
  return identity;
}

ProcessIdentity this_process() {
  if (auto identity = process_identity(::getpid())) return *identity;
  // Without /proc a pid cannot be checked: the machine stays unknown.
  ProcessIdentity identity;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) identity.host = host;
  identity.pid = ::getpid();
  return identity;
}

Liveness liveness(const ProcessIdentity& identity) {
  if (identity.machine.empty() || identity.pid <= 0 || identity.machine != machine_id()) {
    return Liveness::kUnknown;
  }
  if (identity.pid == ::getpid()) {
    // Only this process can have this pid here; the start time tells
    // whether it is the one named.
    return read_proc_stat(identity.pid).value_or(ProcStat{}).start_ticks == identity.start_ticks
               ? Liveness::kAlive
               : Liveness::kDead;
  }
  const auto stat = read_proc_stat(identity.pid);
  if (!stat) {
    // No such pid: gone. A pid /proc hides (hidepid) but that exists
    // cannot be checked.
    if (::kill(static_cast<pid_t>(identity.pid), 0) == 0 || errno == EPERM) {
      return Liveness::kUnknown;
    }
    return Liveness::kDead;
  }
  if (stat->start_ticks != identity.start_ticks) return Liveness::kDead;  // the pid was reused
  if (stat->state == 'Z' || stat->state == 'X') return Liveness::kDead;   // exited, not yet reaped
  return Liveness::kAlive;
}

std::string format_utc(std::uint64_t ms_since_epoch) {
  const std::time_t seconds = static_cast<std::time_t>(ms_since_epoch / 1000);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string describe(const ProcessIdentity& identity) {
  std::string out = "pid " + std::to_string(identity.pid) + " on host " +
                    (identity.host.empty() ? std::string("?") : identity.host);
  if (identity.started_at_ms > 0) out += ", started " + format_utc(identity.started_at_ms);
  return out;
}

}  // namespace tidemark
