#include "location/file_blob.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "testing/scratch_directory.h"

namespace tidemark {
namespace {

namespace fs = std::filesystem;

class FileBlobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = scratch_.path() + "/blob";
    auto opened = FileBlob::open(root_);
    ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
    blob_ = std::move(*opened);
  }

  std::map<std::string, std::uint64_t> list(std::string_view prefix) {
    std::map<std::string, std::uint64_t> out;
    auto listed = blob_->list(prefix, [&](std::string_view key, std::uint64_t size) {
      out.emplace(std::string(key), size);
    });
    EXPECT_TRUE(listed.has_value()) << listed.error().to_string();
    return out;
  }

  // Every file name under the root, recursively.
  std::vector<std::string> file_names() {
    std::vector<std::string> names;
    for (const auto& entry : fs::recursive_directory_iterator(root_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

  ScratchDirectory scratch_;
  std::string root_;
  std::unique_ptr<FileBlob> blob_;
};

TEST_F(FileBlobTest, ObjectsAreFilesUnderTheRoot) {
  ASSERT_TRUE(blob_->set("shard/orders/part/abc", "bytes").has_value());
  std::ifstream file(root_ + "/shard/orders/part/abc", std::ios::binary);
  std::string contents((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(contents, "bytes");
  EXPECT_EQ(blob_->root_directory(), root_);
}

TEST_F(FileBlobTest, SetLeavesNoTemporaryFile) {
  ASSERT_TRUE(blob_->set("top", "1").has_value());
  ASSERT_TRUE(blob_->set("shard/s/part/a", "2").has_value());
  ASSERT_TRUE(blob_->set("shard/s/part/a", "overwritten").has_value());
  ASSERT_TRUE(blob_->remove("top").has_value());
  for (const auto& name : file_names()) EXPECT_FALSE(name.starts_with(".tmp-")) << name;
}

TEST_F(FileBlobTest, LeftoverTemporaryFilesAreNeverListed) {
  ASSERT_TRUE(blob_->set("shard/s/part/a", "object").has_value());
  // What a crash between creating and renaming a temporary leaves behind.
  std::ofstream(root_ + "/shard/s/part/.tmp-x") << "half written";
  std::ofstream(root_ + "/.tmp-y") << "half written";
  std::ofstream(root_ + "/not a key") << "placed by hand";
  const std::map<std::string, std::uint64_t> expected = {{"shard/s/part/a", 6}};
  EXPECT_EQ(list(""), expected);
  EXPECT_EQ(list("shard/s/part/"), expected);
  EXPECT_EQ(list("shard/s/part/."), (std::map<std::string, std::uint64_t>{}));
  // And never read as an object: the name is not a valid key.
  auto got = blob_->get("shard/s/part/.tmp-x");
  ASSERT_FALSE(got.has_value());
  EXPECT_EQ(got.error().kind, ErrorKind::kInvalidUsage);
}

// list() deletes what crashed writers left: temporaries whose writer's pid
// is gone and that are over a minute old. It keeps in-flight ones.
TEST_F(FileBlobTest, ListDeletesTemporariesOfDeadWriters) {
  ASSERT_TRUE(blob_->set("shard/s/part/a", "object").has_value());
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const std::string dir = root_ + "/shard/s/part/";
  const std::string old_dead = ".tmp-" + std::to_string(dead) + "-old";
  const std::string new_dead = ".tmp-" + std::to_string(dead) + "-new";
  const std::string old_alive = ".tmp-" + std::to_string(::getpid()) + "-old";
  for (const std::string& name : {old_dead, new_dead, old_alive, std::string(".tmp-legacy")}) {
    std::ofstream(dir + name) << "half written";
  }
  const auto two_minutes_ago = fs::file_time_type::clock::now() - std::chrono::minutes(2);
  for (const std::string& name : {old_dead, old_alive, std::string(".tmp-legacy")}) {
    fs::last_write_time(dir + name, two_minutes_ago);
  }
  EXPECT_EQ(list("shard/s/part/").size(), 1u);
  EXPECT_FALSE(fs::exists(dir + old_dead)) << "a dead writer's old temporary stays";
  EXPECT_TRUE(fs::exists(dir + new_dead)) << "too recent to judge";
  EXPECT_TRUE(fs::exists(dir + old_alive)) << "its writer is alive";
  EXPECT_TRUE(fs::exists(dir + ".tmp-legacy")) << "no pid: left alone";
}

TEST_F(FileBlobTest, KeysCannotEscapeTheRoot) {
  for (std::string_view key : {"../x", "/abs", "a//b", "../../etc/passwd", "a/../../x"}) {
    auto stored = blob_->set(key, "x");
    ASSERT_FALSE(stored.has_value()) << key;
    EXPECT_EQ(stored.error().kind, ErrorKind::kInvalidUsage) << key;
  }
  EXPECT_FALSE(fs::exists(scratch_.path() + "/x"));
  EXPECT_TRUE(file_names().empty());
}

TEST_F(FileBlobTest, ObjectsSurviveReopening) {
  ASSERT_TRUE(blob_->set("shard/s/state", "durable").has_value());
  blob_.reset();
  auto reopened = FileBlob::open(root_ + "/");  // a trailing '/' names the same root
  ASSERT_TRUE(reopened.has_value()) << reopened.error().to_string();
  auto got = (*reopened)->get("shard/s/state");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, "durable");
}

TEST_F(FileBlobTest, OpenCreatesMissingAncestors) {
  auto nested = FileBlob::open(scratch_.path() + "/a/b/c");
  ASSERT_TRUE(nested.has_value()) << nested.error().to_string();
  EXPECT_TRUE(fs::is_directory(scratch_.path() + "/a/b/c"));
}

TEST_F(FileBlobTest, OpenOnAFileFails) {
  std::ofstream(scratch_.path() + "/file") << "not a directory";
  auto opened = FileBlob::open(scratch_.path() + "/file");
  ASSERT_FALSE(opened.has_value());
  EXPECT_NE(opened.error().message.find(scratch_.path() + "/file"), std::string::npos)
      << opened.error().to_string();
}

TEST_F(FileBlobTest, AKeyCannotAlsoBeADirectoryOfKeys) {
  ASSERT_TRUE(blob_->set("a", "file").has_value());
  auto under_file = blob_->set("a/b", "x");
  ASSERT_FALSE(under_file.has_value());
  EXPECT_EQ(under_file.error().kind, ErrorKind::kInvalidUsage) << under_file.error().to_string();
  EXPECT_NE(under_file.error().message.find("conflicts"), std::string::npos);
  EXPECT_NE(under_file.error().message.find(root_ + "/a"), std::string::npos)
      << under_file.error().to_string();

  ASSERT_TRUE(blob_->set("c/d", "x").has_value());
  auto over_directory = blob_->set("c", "x");
  ASSERT_FALSE(over_directory.has_value());
  EXPECT_EQ(over_directory.error().kind, ErrorKind::kInvalidUsage);
  // The directory "c" is not an object.
  auto got = blob_->get("c");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, std::nullopt);
  EXPECT_TRUE(blob_->remove("c").has_value());
  EXPECT_EQ(list(""), (std::map<std::string, std::uint64_t>{{"a", 4}, {"c/d", 1}}));
  for (const auto& name : file_names()) EXPECT_FALSE(name.starts_with(".tmp-")) << name;
}

TEST_F(FileBlobTest, RecreatesDirectoriesRemovedBehindItsBack) {
  ASSERT_TRUE(blob_->set("shard/s/part/a", "1").has_value());
  fs::remove_all(root_ + "/shard");
  auto stored = blob_->set("shard/s/part/b", "2");
  ASSERT_TRUE(stored.has_value()) << stored.error().to_string();
  EXPECT_EQ(list("shard/"), (std::map<std::string, std::uint64_t>{{"shard/s/part/b", 1}}));
}

}  // namespace
}  // namespace tidemark
