// S3 test helpers: the server named by TIDEMARK_TEST_S3, and fresh S3Blobs
// on it, each under a prefix of its own that is emptied when the blob is
// released. Test-only.
//
// TIDEMARK_TEST_S3 is a base URL such as
//   s3://tidemark/test?endpoint=http://127.0.0.1:25680&region=us-east-1
// and the credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
// (scripts/test-services.sh sets all three). When it is unset the S3 tests
// skip, saying so; when it is set but the server cannot be reached they
// fail.
//
// Thread-safety: the blobs are S3Blobs. ScopedEnvironmentVariable changes
// the process environment: use it only while no other thread reads it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "location/faulty.h"
#include "location/mem_blob.h"
#include "s3/s3_blob.h"
#include "util/ids.h"
#include "util/try.h"

namespace tidemark {

inline constexpr const char* kS3ServerVariable = "TIDEMARK_TEST_S3";

// The base URL to test against, or nullopt when none is configured.
inline std::optional<std::string> s3_test_server() {
  const char* url = std::getenv(kS3ServerVariable);
  if (url == nullptr || *url == '\0') return std::nullopt;
  return std::string(url);
}

inline std::string no_s3_server_message() {
  return std::string(kS3ServerVariable) +
         " is unset: skipping an S3 test (set it to a base URL such as "
         "s3://tidemark/test?endpoint=http://127.0.0.1:25680, with AWS_ACCESS_KEY_ID and "
         "AWS_SECRET_ACCESS_KEY, to run it)";
}

// Records a skip of the running test (GTEST_SKIP returns from the function
// it is written in, so it lives in one of its own).
inline void skip_without_s3_server() {
  GTEST_SKIP() << no_s3_server_message();
}

// An S3Blob on "<base prefix>/t-<random>" of the server at `base_url`,
// with `parameters` ("&list_page_size=2") added to its URL and credentials
// from the environment. Everything under the prefix is deleted when the
// returned pointer is released; failing to is a test failure.
inline Result<std::shared_ptr<S3Blob>> open_fresh_s3_blob(const std::string& base_url,
                                                          std::string_view parameters = {}) {
  TM_ASSIGN(S3Url url, parse_s3_url(base_url));
  url.prefix = (url.prefix.empty() ? "" : url.prefix + "/") + "t-" + random_id().substr(0, 16);
  struct EmptiedOnRelease {
    std::unique_ptr<S3Blob> blob;
    ~EmptiedOnRelease() {
      if (blob == nullptr) return;
      std::vector<std::string> keys;
      auto listed =
          blob->list("", [&](std::string_view key, std::uint64_t) { keys.emplace_back(key); });
      auto removed = listed ? blob->remove_many(keys) : Status(std::unexpected(listed.error()));
      if (!removed) {
        ADD_FAILURE() << "emptying " << blob->url().to_string() << ": "
                      << removed.error().to_string();
      }
    }
  };
  auto owner = std::make_shared<EmptiedOnRelease>();
  TM_ASSIGN(owner->blob, S3Blob::open(url.to_string() + std::string(parameters)));
  S3Blob* blob = owner->blob.get();
  return std::shared_ptr<S3Blob>(std::move(owner), blob);
}

// The conformance suite's factory: a fresh S3Blob (see above), checked to
// reach its server. Without a server it skips the running test, and
// returns a backend whose every call fails: the suite's SetUp needs a
// non-null backend, and the skipped body never uses it.
inline Result<std::shared_ptr<Blob>> open_s3_test_blob() {
  std::optional<std::string> server = s3_test_server();
  if (!server) {
    skip_without_s3_server();
    return std::make_shared<FaultyBlob>(std::make_shared<MemBlob>(),
                                        FaultConfig{.determinate_rate = 1});
  }
  TM_ASSIGN(std::shared_ptr<S3Blob> blob, open_fresh_s3_blob(*server));
  TM_TRY(blob->list("", [](std::string_view, std::uint64_t) {}));
  return std::shared_ptr<Blob>(std::move(blob));
}

// Every object under `prefix` (a fresh test prefix): name -> bytes, read
// with plain GETs (sink objects carry no S3Blob digest). A failure is a
// test failure, and its object reads "<error>".
inline std::map<std::string, std::string> s3_objects(S3Blob& prefix) {
  auto credentials = s3_credentials_from_environment();
  EXPECT_TRUE(credentials.has_value()) << credentials.error().to_string();
  S3Client client(prefix.url(), credentials.value_or(S3Credentials{}));
  std::vector<std::string> names;
  auto listed =
      prefix.list("", [&](std::string_view name, std::uint64_t) { names.emplace_back(name); });
  EXPECT_TRUE(listed.has_value()) << listed.error().to_string();
  std::map<std::string, std::string> out;
  for (const std::string& name : names) {
    S3Request request{.method = "GET", .target = client.object_path(name)};
    S3Call call{.operation = "test: read an object", .subject = name, .accepted = {200}};
    auto answer = client.exchange(request, call);
    EXPECT_TRUE(answer.has_value()) << answer.error().to_string();
    out[name] = answer ? answer->body : "<error>";
  }
  return out;
}

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class ScopedEnvironmentVariable {
 public:
  ScopedEnvironmentVariable(std::string name, const std::optional<std::string>& value)
      : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) saved_ = old;
    if (value) {
      ::setenv(name_.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnvironmentVariable(const ScopedEnvironmentVariable&) = delete;
  ScopedEnvironmentVariable& operator=(const ScopedEnvironmentVariable&) = delete;
  ~ScopedEnvironmentVariable() {
    if (saved_) {
      ::setenv(name_.c_str(), saved_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> saved_;
};

}  // namespace tidemark
