// Event lines on stderr: what a server did (requests answered, sinks
// started and failed), one line each, for operators and log collectors:
//
//   2026-12-05T05:20:00.123Z info request 127.0.0.1:40312 GET /v1/shards 200 0.4ms
//
// The level is process-wide (`serve --log-level`): error, warn, info (the
// default) or debug; a line is written when its level is at or below it.
// Each line is one write(2) of at most kMaxLineBytes, so lines from many
// threads never interleave and a huge request target cannot make a huge
// line. Nothing is buffered: a line is out before the call returns.
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace tidemark {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

inline constexpr std::size_t kMaxLogLineBytes = 4096;

void set_log_level(LogLevel level);
LogLevel log_level();
inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= static_cast<int>(log_level());
}
// "error", "warn", "info", "debug"; nullopt for anything else.
std::optional<LogLevel> parse_log_level(std::string_view text);
std::string_view log_level_name(LogLevel level);

// Writes "<UTC time with ms> <level> <text>\n" if `level` is enabled;
// text past kMaxLogLineBytes is cut, ending in "...".
void log_line(LogLevel level, std::string_view text);

}  // namespace tidemark
