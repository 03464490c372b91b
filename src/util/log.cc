#include "util/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace tidemark {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

}  // namespace

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel log_level() {
  return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed));
}

std::optional<LogLevel> parse_log_level(std::string_view text) {
  if (text == "error") return LogLevel::kError;
  if (text == "warn") return LogLevel::kWarn;
  if (text == "info") return LogLevel::kInfo;
  if (text == "debug") return LogLevel::kDebug;
  return std::nullopt;
}

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

void log_line(LogLevel level, std::string_view text) {
  if (!log_enabled(level)) return;
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch());
  const std::time_t seconds = static_cast<std::time_t>(ms.count() / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[40];
  const std::size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
  std::string line(stamp, n);
  char millis[8];
  std::snprintf(millis, sizeof millis, ".%03dZ ", static_cast<int>(ms.count() % 1000));
  line += millis;
  line += log_level_name(level);
  line += ' ';
  const std::size_t room = kMaxLogLineBytes - line.size() - 1;
  if (text.size() > room) {
    line.append(text.substr(0, room - 3));
    line += "...";
  } else {
    line.append(text);
  }
  line += '\n';
  // One write: lines from several threads never interleave.
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t wrote = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return;  // nowhere to log: nothing to do about it
    done += static_cast<std::size_t>(wrote);
  }
}

}  // namespace tidemark
