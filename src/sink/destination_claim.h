// DestinationClaim: the right to write one sink destination.
//
// A destination given a claim calls check() right before each step that
// makes output visible (a file's rename, an object's PUT or copy, a Kafka
// transaction's commit) and commits nothing when it fails. The claim
// itself is taken before the destination is opened, so opening (which
// deletes a crashed run's temporaries) never touches a destination another
// runner writes. SinkClaim (sink_claim.h) is the one the command line and
// the server use.
//
// Thread-safety: check() is called from the sink's thread. Memory: the
// implementation's.
#pragma once

#include <string>
#include <string_view>

#include "tidemark/error.h"

namespace tidemark {

class DestinationClaim {
 public:
  DestinationClaim() = default;
  DestinationClaim(const DestinationClaim&) = delete;
  DestinationClaim& operator=(const DestinationClaim&) = delete;
  virtual ~DestinationClaim() = default;

  // The destination it covers, normalised (destination_url.h,
  // destination_identity): "file:///abs/dir", "s3://...", "kafka://...".
  virtual const std::string& destination() const = 0;

  // OK while the claim holds. Otherwise the caller must not make output
  // visible: Held when the claim is lost for good (taken over, naming the
  // new holder), Determinate or Indeterminate when it cannot tell now (a
  // runner keeps such a claim and checks it again later).
  [[nodiscard]] virtual Status check() = 0;
};

// The identity of a file destination whose directory is `directory`
// (absolute, lexically normal, no trailing '/').
inline std::string file_destination_identity(std::string_view directory) {
  return "file://" + std::string(directory);
}

}  // namespace tidemark
