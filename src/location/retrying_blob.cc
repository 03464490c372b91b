#include "location/retrying_blob.h"

namespace tidemark {

RetryingBlob::RetryingBlob(std::shared_ptr<Blob> inner, RetryPolicy policy,
                           std::function<bool()> stop)
    : inner_(std::move(inner)), policy_(policy), stop_(std::move(stop)) {}

Result<std::optional<std::string>> RetryingBlob::get(std::string_view key) {
  return with_retries(policy_, [&] { return inner_->get(key); }, stop_);
}

Result<std::string> RetryingBlob::get_range(std::string_view key, std::uint64_t offset,
                                            std::uint64_t length) {
  return with_retries(policy_, [&] { return inner_->get_range(key, offset, length); }, stop_);
}

Status RetryingBlob::set(std::string_view key, std::string_view bytes) {
  return inner_->set(key, bytes);
}

Status RetryingBlob::remove(std::string_view key) {
  return inner_->remove(key);
}

Status RetryingBlob::remove_many(const std::vector<std::string>& keys) {
  return inner_->remove_many(keys);
}

Status RetryingBlob::list(std::string_view prefix,
                          const std::function<void(std::string_view, std::uint64_t)>& visit) {
  return inner_->list(prefix, visit);
}

}  // namespace tidemark
