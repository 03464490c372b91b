// Helpers shared by the sink tests: diff pairs built by hand, and a
// destination claim a test can take away.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "sink/destination_claim.h"
#include "sink/diff_pairs.h"

namespace tidemark::testing {

inline DiffPair insert(std::string_view key, Time time, std::string_view after) {
  return DiffPair{key, time, std::nullopt, after, 0};
}
inline DiffPair remove(std::string_view key, Time time, std::string_view before) {
  return DiffPair{key, time, before, std::nullopt, 0};
}
inline DiffPair update(std::string_view key, Time time, std::string_view before,
                       std::string_view after) {
  return DiffPair{key, time, before, after, 0};
}

// A claim that holds until `lost` is set, then fails check() with Held.
class ToggledClaim final : public DestinationClaim {
 public:
  explicit ToggledClaim(std::string destination) : destination_(std::move(destination)) {}
  const std::string& destination() const override { return destination_; }
  Status check() override {
    if (lost) return make_error(ErrorKind::kHeld, "taken by someone else");
    return {};
  }
  bool lost = false;

 private:
  std::string destination_;
};

}  // namespace tidemark::testing
