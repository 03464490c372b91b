#include "location/retrying_blob.h"

namespace tidemark {

RetryingBlob::RetryingBlob(std::shared_ptr<Blob> inner, RetryPolicy policy,
                           std::function<bool()> stop)
    : ForwardingBlob(std::move(inner)), policy_(policy), stop_(std::move(stop)) {}

Result<std::optional<std::string>> RetryingBlob::get(std::string_view key) {
  return with_retries(
      policy_, [&] { return inner().get(key); }, stop_);
}

Result<std::string> RetryingBlob::get_range(std::string_view key, std::uint64_t offset,
                                            std::uint64_t length) {
  return with_retries(
      policy_, [&] { return inner().get_range(key, offset, length); }, stop_);
}

}  // namespace tidemark
