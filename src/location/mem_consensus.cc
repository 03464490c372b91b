#include "location/mem_consensus.h"

#include <iterator>
#include <string>
#include <utility>

#include "tidemark/seqno_bounds.h"
#include "util/try.h"

namespace tidemark {

Result<std::optional<VersionedData>> MemConsensus::head(std::string_view key) {
  std::lock_guard lock(mutex_);
  auto found = logs_.find(key);
  if (found == logs_.end()) return std::nullopt;
  const auto& [seqno, data] = *found->second.rbegin();
  return VersionedData{seqno, data};
}

Result<CasOutcome> MemConsensus::compare_and_set(std::string_view key,
                                                 std::optional<SeqNo> expected,
                                                 VersionedData next) {
  TM_TRY(validate_compare_and_set(expected, next.seqno));
  std::lock_guard lock(mutex_);
  auto found = logs_.find(key);
  std::optional<SeqNo> current;
  if (found != logs_.end()) current = found->second.rbegin()->first;
  if (current != expected) return CasOutcome::kExpectationMismatch;
  if (found == logs_.end()) found = logs_.emplace(std::string(key), Versions()).first;
  found->second.emplace(next.seqno, std::move(next.data));
  return CasOutcome::kCommitted;
}

Result<std::vector<VersionedData>> MemConsensus::scan(std::string_view key, SeqNo from,
                                                      std::size_t limit) {
  std::vector<VersionedData> out;
  std::lock_guard lock(mutex_);
  auto found = logs_.find(key);
  if (found == logs_.end()) return out;
  for (auto it = found->second.lower_bound(from); it != found->second.end() && out.size() < limit;
       ++it) {
    out.push_back(VersionedData{it->first, it->second});
  }
  return out;
}

Result<std::size_t> MemConsensus::truncate(std::string_view key, SeqNo seqno) {
  std::lock_guard lock(mutex_);
  auto found = logs_.find(key);
  if (found == logs_.end()) {
    return invalid_usage("truncate " + std::string(key) + " to seqno " + std::to_string(seqno) +
                         ": there is no version yet");
  }
  Versions& versions = found->second;
  SeqNo head = versions.rbegin()->first;
  if (seqno > head) {
    return invalid_usage("truncate " + std::string(key) + " to seqno " + std::to_string(seqno) +
                         ": beyond the head seqno " + std::to_string(head));
  }
  auto end = versions.lower_bound(seqno);
  auto count = static_cast<std::size_t>(std::distance(versions.begin(), end));
  versions.erase(versions.begin(), end);
  return count;
}

}  // namespace tidemark
