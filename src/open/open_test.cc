#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "location/file_blob.h"
#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "testing/scratch_directory.h"
#include "location/sqlite_consensus.h"
#include "tidemark/location.h"

namespace tidemark {
namespace {

TEST(OpenLocationTest, MemUrlsOpenFreshInstances) {
  auto first = open_blob("mem://");
  auto second = open_blob("mem://");
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_NE(dynamic_cast<MemBlob*>(first->get()), nullptr);
  ASSERT_TRUE((*first)->set("key", "x").has_value());
  EXPECT_EQ(*(*second)->get("key"), std::nullopt);

  auto consensus = open_consensus("mem://");
  ASSERT_TRUE(consensus.has_value());
  EXPECT_NE(dynamic_cast<MemConsensus*>(consensus->get()), nullptr);
}

TEST(OpenLocationTest, FileUrlOpensAFileBlob) {
  ScratchDirectory scratch;
  auto blob = open_blob("file://" + scratch.path() + "/blob");
  ASSERT_TRUE(blob.has_value()) << blob.error().to_string();
  auto* file_blob = dynamic_cast<FileBlob*>(blob->get());
  ASSERT_NE(file_blob, nullptr);
  EXPECT_EQ(file_blob->root_directory(), scratch.path() + "/blob");
  EXPECT_TRUE(std::filesystem::is_directory(scratch.path() + "/blob"));
}

TEST(OpenLocationTest, SqliteUrlOpensASqliteConsensus) {
  ScratchDirectory scratch;
  auto consensus = open_consensus("sqlite://" + scratch.path() + "/consensus.db");
  ASSERT_TRUE(consensus.has_value()) << consensus.error().to_string();
  auto* sqlite = dynamic_cast<SqliteConsensus*>(consensus->get());
  ASSERT_NE(sqlite, nullptr);
  EXPECT_EQ(sqlite->path(), scratch.path() + "/consensus.db");
}

void expect_invalid(const Error& error, std::string_view mentions) {
  EXPECT_EQ(error.kind, ErrorKind::kInvalidUsage) << error.to_string();
  EXPECT_NE(error.message.find(mentions), std::string::npos) << error.to_string();
}

TEST(OpenLocationTest, RelativePathsAreInvalidUsage) {
  for (std::string_view url : {"file://relative/dir", "file://", "file://./x"}) {
    auto blob = open_blob(url);
    ASSERT_FALSE(blob.has_value()) << url;
    expect_invalid(blob.error(), "absolute");
  }
  for (std::string_view url : {"sqlite://relative.db", "sqlite://"}) {
    auto consensus = open_consensus(url);
    ASSERT_FALSE(consensus.has_value()) << url;
    expect_invalid(consensus.error(), "absolute");
  }
}

TEST(OpenLocationTest, ScaleOutUrlsReachTheirBackends) {
  // s3:// is parsed by the S3 backend: an endpoint is required.
  auto blob = open_blob("s3://bucket/prefix?region=us-east-1");
  ASSERT_FALSE(blob.has_value());
  expect_invalid(blob.error(), "endpoint");
  // postgres:// connects at open (to create the schema): nothing listens on
  // port 1, which is an infrastructure error that names no password.
  auto consensus = open_consensus("postgres://user:hunter2@127.0.0.1:1/db");
  ASSERT_FALSE(consensus.has_value());
  EXPECT_EQ(consensus.error().kind, ErrorKind::kDeterminate) << consensus.error().to_string();
  EXPECT_EQ(consensus.error().message.find("hunter2"), std::string::npos)
      << consensus.error().message;
}

TEST(OpenLocationTest, UnknownOrMismatchedUrlsAreInvalidUsage) {
  for (std::string_view url :
       {"", "ftp://host/x", "/abs/path", "mem:", "mem://x", "sqlite:///x.db"}) {
    auto blob = open_blob(url);
    ASSERT_FALSE(blob.has_value()) << url;
    EXPECT_EQ(blob.error().kind, ErrorKind::kInvalidUsage) << url;
  }
  for (std::string_view url : {"", "ftp://host/x", "mem://x", "file:///tmp/x", "s3://bucket"}) {
    auto consensus = open_consensus(url);
    ASSERT_FALSE(consensus.has_value()) << url;
    EXPECT_EQ(consensus.error().kind, ErrorKind::kInvalidUsage) << url;
  }
}

}  // namespace
}  // namespace tidemark
