// MemConsensus: a Consensus held in process memory, for tests and `mem://`.
//
// Per key, an ordered map seqno -> data. Seqnos follow seqno_bounds.h; a
// compare_and_set may skip seqnos (next need only exceed expected). Nothing
// survives the object; "durable" means visible to every later call.
//
// Thread-safety: safe for concurrent use from many threads; one mutex makes
// every call atomic and linearizable.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tidemark/location.h"

namespace tidemark {

class MemConsensus : public Consensus {
 public:
  MemConsensus() = default;

  [[nodiscard]] Result<std::optional<VersionedData>> head(std::string_view key) override;
  [[nodiscard]] Result<CasOutcome> compare_and_set(std::string_view key,
                                                   std::optional<SeqNo> expected,
                                                   VersionedData next) override;
  [[nodiscard]] Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                                        std::size_t limit) override;
  [[nodiscard]] Result<std::size_t> truncate(std::string_view key, SeqNo seqno) override;

 private:
  using Versions = std::map<SeqNo, std::string>;

  std::mutex mutex_;
  // Invariant: no key maps to an empty Versions (truncate keeps the head).
  std::map<std::string, Versions, std::less<>> logs_;  // guarded by mutex_
};

}  // namespace tidemark
