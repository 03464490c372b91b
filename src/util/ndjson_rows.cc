#include "util/ndjson_rows.h"

#include <limits>

#include "util/json.h"

namespace tidemark {

RowOffsets append_snapshot_row(std::string* out, std::string_view key, std::string_view value,
                               Diff diff) {
  RowOffsets at;
  out->append("{\"key\":");
  at.key_at = out->size();
  out->append(key).append(",\"value\":");
  at.value_at = out->size();
  out->append(value).append(",\"diff\":");
  append_i64(out, diff);
  out->append("}\n");
  return at;
}

void append_listen_row(std::string* out, std::string_view key, std::string_view value, Time time,
                       Diff diff) {
  out->append("{\"key\":").append(key).append(",\"value\":").append(value);
  out->append(",\"time\":");
  append_u64(out, time);
  out->append(",\"diff\":");
  append_i64(out, diff);
  out->append("}\n");
}

void append_progress_row(std::string* out, const Frontier& progress) {
  out->append("{\"progress\":").append(progress.to_json()).append("}\n");
}

std::optional<Time> latest_complete_time(const Frontier& upper) {
  if (upper.is_closed()) return std::numeric_limits<Time>::max();
  if (upper.time() == 0) return std::nullopt;
  return upper.time() - 1;
}

}  // namespace tidemark
