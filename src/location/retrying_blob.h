// RetryingBlob: a Blob whose reads ride out failures that may pass.
//
// get and get_range are retried under a RetryPolicy (retry.h) while they
// fail with a Determinate or Indeterminate error; reading twice is
// harmless. Writes, deletes and listings go through once: a write's retry
// must be judged by its caller (what it wrote may have landed), and a
// listing that failed part way has already visited keys. The read path
// (snapshots, listens, sinks, compaction's inputs) reads parts through
// one, so a stream that meets a fault resumes at the block it was reading.
//
// `stop`, when given, ends a retry early (a shard closing, a server
// shutting down).
//
// Thread-safety: as safe as the blob it wraps (the policy is immutable).
#pragma once

#include <functional>
#include <memory>

#include "location/forwarding.h"
#include "tidemark/location.h"
#include "tidemark/retry.h"

namespace tidemark {

// Built on ForwardingBlob (forwarding.h): everything but the two reads
// goes to the wrapped blob as made.
class RetryingBlob final : public ForwardingBlob {
 public:
  RetryingBlob(std::shared_ptr<Blob> inner, RetryPolicy policy, std::function<bool()> stop = {});

  Result<std::optional<std::string>> get(std::string_view key) override;
  Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                std::uint64_t length) override;

 private:
  const RetryPolicy policy_;
  const std::function<bool()> stop_;
};

}  // namespace tidemark
