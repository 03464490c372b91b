// NDJSON rows: the lines every read writes, the same from the command line
// and from the server, so the two never disagree on a row or on which
// time a snapshot reads.
//
//   snapshot row:  {"key":K,"value":V,"diff":D}
//   listen row:    {"key":K,"value":V,"time":T,"diff":D}
//   progress:      {"progress":P}   (P a time, or null once the shard is closed)
//
// K and V are JSON text as stored (an update's key and value are JSON
// already); each function appends one line, its "\n" included.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "tidemark/frontier.h"
#include "tidemark/update.h"

namespace tidemark {

// Where the key and value of a row just appended start in `out`.
struct RowOffsets {
  std::size_t key_at = 0;
  std::size_t value_at = 0;
};

RowOffsets append_snapshot_row(std::string* out, std::string_view key, std::string_view value,
                               Diff diff);
void append_listen_row(std::string* out, std::string_view key, std::string_view value, Time time,
                       Diff diff);
void append_progress_row(std::string* out, const Frontier& progress);

// The time a snapshot that names none reads: the latest complete time,
// just below the upper; every time (the largest) once the upper is closed;
// nullopt while no time is complete (an upper of 0).
std::optional<Time> latest_complete_time(const Frontier& upper);

}  // namespace tidemark
