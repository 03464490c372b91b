// Consensus's default batch methods: one call per key or request, for
// backends that cannot do better (location.h).
#include "tidemark/location.h"
#include "util/try.h"

namespace tidemark {

Result<std::vector<std::optional<SeqNo>>> Consensus::head_seqnos(
    const std::vector<std::string>& keys) {
  std::vector<std::optional<SeqNo>> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) {
    TM_ASSIGN(auto version, head(key));
    out.push_back(version ? std::optional(version->seqno) : std::nullopt);
  }
  return out;
}

std::optional<std::uint64_t> Consensus::subscribe_change_hints(
    std::function<void(const ChangeHint&)> /*on_hint*/) {
  return std::nullopt;
}

void Consensus::unsubscribe_change_hints(std::uint64_t /*id*/) {}

std::vector<Result<CasOutcome>> Consensus::compare_and_set_many(
    const std::vector<CasRequest>& requests) {
  std::vector<Result<CasOutcome>> out;
  out.reserve(requests.size());
  for (const CasRequest& request : requests) {
    out.push_back(compare_and_set(request.key, request.expected, request.next));
  }
  return out;
}

std::vector<Result<std::size_t>> Consensus::truncate_many(
    const std::vector<std::pair<std::string, SeqNo>>& truncations) {
  std::vector<Result<std::size_t>> out;
  out.reserve(truncations.size());
  for (const auto& [key, seqno] : truncations) out.push_back(truncate(key, seqno));
  return out;
}

}  // namespace tidemark
