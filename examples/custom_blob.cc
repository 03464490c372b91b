// A Blob backend of your own, held to the contract every Tidemark backend
// meets by the conformance suite installed with the headers
// (tidemark/testing/conformance.h, GoogleTest).
//
// MapBlob keeps objects in memory, in a std::map behind a mutex: small
// enough to read whole, and what a real backend (a database table, an
// object store) must do too: validate keys (tidemark/blob_key.h), replace
// objects atomically, answer ranges, delete absent keys quietly and list by
// prefix. Running this program runs the suite against it.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>

#include "tidemark/blob_key.h"
#include "tidemark/location.h"
#include "tidemark/testing/conformance.h"

namespace {

class MapBlob final : public tidemark::Blob {
 public:
  tidemark::Result<std::optional<std::string>> get(std::string_view key) override {
    if (auto valid = tidemark::validate_blob_key(key); !valid)
      return std::unexpected(valid.error());
    std::lock_guard lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }

  tidemark::Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                          std::uint64_t length) override {
    if (auto valid = tidemark::validate_blob_key(key); !valid)
      return std::unexpected(valid.error());
    std::lock_guard lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) {
      return tidemark::make_error(tidemark::ErrorKind::kNotFound, "no object " + std::string(key));
    }
    if (offset >= it->second.size()) return std::string();
    return it->second.substr(offset, length);
  }

  tidemark::Status set(std::string_view key, std::string_view bytes) override {
    if (auto valid = tidemark::validate_blob_key(key); !valid)
      return std::unexpected(valid.error());
    std::lock_guard lock(mu_);
    objects_.insert_or_assign(std::string(key), std::string(bytes));
    return {};
  }

  tidemark::Status remove(std::string_view key) override {
    if (auto valid = tidemark::validate_blob_key(key); !valid)
      return std::unexpected(valid.error());
    std::lock_guard lock(mu_);
    if (auto it = objects_.find(key); it != objects_.end()) objects_.erase(it);
    return {};
  }

  tidemark::Status list(
      std::string_view prefix,
      const std::function<void(std::string_view key, std::uint64_t size)>& visit) override {
    if (auto valid = tidemark::validate_blob_prefix(prefix); !valid) {
      return std::unexpected(valid.error());
    }
    std::map<std::string, std::uint64_t> found;  // visited outside the lock
    {
      std::lock_guard lock(mu_);
      for (auto it = objects_.lower_bound(prefix);
           it != objects_.end() && it->first.starts_with(prefix); ++it) {
        found.emplace(it->first, it->second.size());
      }
    }
    for (const auto& [key, size] : found) visit(key, size);
    return {};
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string, std::less<>> objects_;
};

}  // namespace

namespace tidemark {

INSTANTIATE_TEST_SUITE_P(MapBlob, BlobConformance,
                         ::testing::Values(BlobBackend{"map",
                                                       []() -> Result<std::shared_ptr<Blob>> {
                                                         return std::make_shared<MapBlob>();
                                                       }}),
                         BackendName());
// This program brings a blob backend only.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ConsensusConformance);

}  // namespace tidemark
