#include "tidemark/blob_key.h"

#include <gtest/gtest.h>

#include <string>

namespace tidemark {
namespace {

TEST(BlobKeyTest, ValidKeys) {
  for (std::string_view key :
       {"a", "shard/orders/part/0123abcd", "a.b-c_D9", ".hidden", "..x", "a/.b/c", "x.tmp-y"}) {
    EXPECT_TRUE(validate_blob_key(key).has_value()) << key;
  }
  EXPECT_TRUE(validate_blob_key(std::string(kMaxBlobKeyLength, 'k')).has_value());
}

TEST(BlobKeyTest, InvalidKeys) {
  for (std::string_view key : {"", "/a", "a/", "a//b", ".", "..", "a/./b", "a/..", ".tmp-1",
                               "a/.tmp-1/b", "a:b", "a b", "é"}) {
    auto checked = validate_blob_key(key);
    ASSERT_FALSE(checked.has_value()) << key;
    EXPECT_EQ(checked.error().kind, ErrorKind::kInvalidUsage);
  }
  EXPECT_FALSE(validate_blob_key(std::string(kMaxBlobKeyLength + 1, 'k')).has_value());
}

TEST(BlobKeyTest, PrefixesMayEndInsideAComponent) {
  for (std::string_view prefix : {"", "a", "a/", "shard/ord", "a/.", "a/..", "a/.tmp-"}) {
    EXPECT_TRUE(validate_blob_prefix(prefix).has_value()) << prefix;
  }
  for (std::string_view prefix : {"/", "/a", "../", "a//", "./x", "a/../b", "a b"}) {
    EXPECT_FALSE(validate_blob_prefix(prefix).has_value()) << prefix;
  }
}

}  // namespace
}  // namespace tidemark
