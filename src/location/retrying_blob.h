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

#include "tidemark/location.h"
#include "tidemark/retry.h"

namespace tidemark {

class RetryingBlob final : public Blob {
 public:
  RetryingBlob(std::shared_ptr<Blob> inner, RetryPolicy policy,
               std::function<bool()> stop = {});

  Result<std::optional<std::string>> get(std::string_view key) override;
  Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                std::uint64_t length) override;
  Status set(std::string_view key, std::string_view bytes) override;
  Status remove(std::string_view key) override;
  Status remove_many(const std::vector<std::string>& keys) override;
  Status list(std::string_view prefix,
              const std::function<void(std::string_view, std::uint64_t)>& visit) override;

 private:
  const std::shared_ptr<Blob> inner_;
  const RetryPolicy policy_;
  const std::function<bool()> stop_;
};

}  // namespace tidemark
