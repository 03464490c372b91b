#include "sink/file_destination.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "sink/committed_name.h"
#include "testing/scratch_directory.h"
#include "testing/sink_util.h"

namespace tidemark {
namespace {

namespace fs = std::filesystem;

constexpr Time kMaxTime = UINT64_MAX;

using testing::insert;
using testing::remove;
using testing::update;

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "cannot read " << path;
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, std::string_view contents) {
  std::ofstream file(path, std::ios::binary);
  file << contents;
  ASSERT_TRUE(file.good()) << "cannot write " << path;
}

// The names in `directory` but the destination's lock file, sorted as
// bytes.
std::vector<std::string> names_in(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    if (name != FileDestination::kLockFileName) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::uint64_t size_of(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return static_cast<std::uint64_t>(info.st_size);
}

std::string name_of(Time lower, Time upper, std::string_view extension) {
  char name[64];
  std::snprintf(name, sizeof(name), "%020llu-%020llu.", static_cast<unsigned long long>(lower),
                static_cast<unsigned long long>(upper));
  return name + std::string(extension);
}

class FileDestinationTest : public ::testing::Test {
 protected:
  std::unique_ptr<FileDestination> open_destination(Envelope envelope = Envelope::kUpsert,
                                                    SinkFormat format = SinkFormat::kJson) {
    auto opened = FileDestination::open(directory_, envelope, format);
    EXPECT_TRUE(opened.has_value()) << opened.error().to_string();
    return opened ? std::move(*opened) : nullptr;
  }

  // Writes one file [lower, upper) with one insert at `lower`.
  void commit_file(FileDestination& destination, Time lower, Time upper) {
    ASSERT_TRUE(destination.begin(Frontier::at(lower)).has_value());
    ASSERT_TRUE(destination.write(insert("1", lower, "2")).has_value());
    auto committed = destination.commit(Frontier::at(upper));
    ASSERT_TRUE(committed.has_value()) << committed.error().to_string();
  }

  void expect_error(const Status& status, ErrorKind kind, std::string_view needle) {
    ASSERT_FALSE(status.has_value()) << "expected " << error_kind_name(kind);
    EXPECT_EQ(status.error().kind, kind) << status.error().to_string();
    EXPECT_NE(status.error().message.find(needle), std::string::npos)
        << status.error().message << " does not mention " << needle;
  }

  ScratchDirectory scratch_;
  std::string directory_ = scratch_.path() + "/out";
};

// ---------------------------------------------------------------------------
// Contents.

TEST_F(FileDestinationTest, JsonUpsertFileHoldsOneLinePerPair) {
  auto destination = open_destination(Envelope::kUpsert, SinkFormat::kJson);
  std::string key1 = R"("k1")", value1 = R"({"a":1})", key3 = R"("k3")", before3 = "[1,2]";
  ASSERT_TRUE(destination->begin(Frontier::at(2)).has_value());
  ASSERT_TRUE(destination->write(insert(key1, 3, value1)).has_value());
  ASSERT_TRUE(destination->write(update(R"("k2")", 4, "1", "2")).has_value());
  ASSERT_TRUE(destination->write(remove(key3, 7, before3)).has_value());
  ASSERT_TRUE(destination->commit(Frontier::at(8)).has_value());

  EXPECT_EQ(names_in(directory_), std::vector<std::string>{name_of(2, 8, "json")});
  EXPECT_EQ(read_file(directory_ + "/" + name_of(2, 8, "json")),
            "{\"time\":3,\"key\":\"k1\",\"value\":{\"a\":1}}\n"
            "{\"time\":4,\"key\":\"k2\",\"value\":2}\n"
            "{\"time\":7,\"key\":\"k3\",\"value\":null}\n");
  EXPECT_EQ(destination->progress(), Frontier::at(8));
}

TEST_F(FileDestinationTest, JsonDebeziumFileHoldsBothSides) {
  auto destination = open_destination(Envelope::kDebezium, SinkFormat::kJson);
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  ASSERT_TRUE(destination->write(insert("1", 0, "true")).has_value());
  ASSERT_TRUE(destination->write(update("2", 1, "10", "11")).has_value());
  ASSERT_TRUE(destination->write(remove("3", 1, "\"x\"")).has_value());
  ASSERT_TRUE(destination->commit(Frontier::at(2)).has_value());
  EXPECT_EQ(read_file(directory_ + "/" + name_of(0, 2, "json")),
            "{\"time\":0,\"key\":1,\"before\":null,\"after\":true}\n"
            "{\"time\":1,\"key\":2,\"before\":10,\"after\":11}\n"
            "{\"time\":1,\"key\":3,\"before\":\"x\",\"after\":null}\n");
}

TEST_F(FileDestinationTest, CsvDebeziumFileStartsWithTheHeaderRow) {
  auto destination = open_destination(Envelope::kDebezium, SinkFormat::kCsv);
  std::string object = R"({"a":1,"b":2})", string_key = R"("k")";
  ASSERT_TRUE(destination->begin(Frontier::at(5)).has_value());
  ASSERT_TRUE(destination->write(insert("1", 5, object)).has_value());
  ASSERT_TRUE(destination->write(update("2", 5, "10", "11")).has_value());
  ASSERT_TRUE(destination->write(remove(string_key, 6, "[1,2]")).has_value());
  ASSERT_TRUE(destination->commit(Frontier::at(7)).has_value());

  EXPECT_EQ(names_in(directory_), std::vector<std::string>{name_of(5, 7, "csv")});
  EXPECT_EQ(read_file(directory_ + "/" + name_of(5, 7, "csv")),
            "time,key,before,after\n"
            "5,1,null,\"{\"\"a\"\":1,\"\"b\"\":2}\"\n"
            "5,2,10,11\n"
            "6,\"\"\"k\"\"\",\"[1,2]\",null\n");
}

TEST_F(FileDestinationTest, EveryCsvFileHasItsHeaderEvenWhenEmpty) {
  auto destination = open_destination(Envelope::kUpsert, SinkFormat::kCsv);
  commit_file(*destination, 0, 1);
  ASSERT_TRUE(destination->begin(Frontier::at(1)).has_value());
  ASSERT_TRUE(destination->commit(Frontier::at(2)).has_value());
  EXPECT_EQ(read_file(directory_ + "/" + name_of(0, 1, "csv")), "time,key,value\n0,1,2\n");
  EXPECT_EQ(read_file(directory_ + "/" + name_of(1, 2, "csv")), "time,key,value\n");
}

TEST_F(FileDestinationTest, AnEmptyJsonFileIsEmpty) {
  auto destination = open_destination();
  ASSERT_TRUE(destination->begin(Frontier::at(3)).has_value());
  ASSERT_TRUE(destination->commit(Frontier::at(4)).has_value());
  EXPECT_EQ(read_file(directory_ + "/" + name_of(3, 4, "json")), "");
  EXPECT_EQ(destination->progress(), Frontier::at(4));
}

TEST_F(FileDestinationTest, OpenFileBytesCountsHeaderAndLinesUntilCommit) {
  auto destination = open_destination(Envelope::kUpsert, SinkFormat::kCsv);
  EXPECT_EQ(destination->open_bytes(), 0u);
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  EXPECT_EQ(destination->open_bytes(), std::string("time,key,value\n").size());
  ASSERT_TRUE(destination->write(insert("1", 0, "2")).has_value());
  std::uint64_t bytes = destination->open_bytes();
  EXPECT_EQ(bytes, std::string("time,key,value\n0,1,2\n").size());
  ASSERT_TRUE(destination->commit(Frontier::at(1)).has_value());
  EXPECT_EQ(destination->open_bytes(), 0u);
  EXPECT_EQ(size_of(directory_ + "/" + name_of(0, 1, "csv")), bytes);
}

TEST_F(FileDestinationTest, UpsertPrimaryKeyViolationsAreCounted) {
  auto destination = open_destination(Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  ASSERT_TRUE(destination->write(DiffPair{"1", 0, std::nullopt, "a", 0}).has_value());
  ASSERT_TRUE(destination->write(DiffPair{"1", 0, std::nullopt, "b", 1}).has_value());
  EXPECT_EQ(destination->primary_key_violations(), 1u);
}

// ---------------------------------------------------------------------------
// Names and progress.

TEST_F(FileDestinationTest, NamesAreZeroPaddedBoundsThatSortByTime) {
  auto destination = open_destination();
  const std::vector<std::pair<Time, Time>> ranges = {
      {0, 9}, {9, 10}, {10, 100}, {100, 12345678901}, {12345678901, kMaxTime}};
  for (auto [lower, upper] : ranges) commit_file(*destination, lower, upper);

  std::vector<std::string> expected;
  for (auto [lower, upper] : ranges) expected.push_back(name_of(lower, upper, "json"));
  EXPECT_EQ(names_in(directory_), expected);  // byte order is time order
  EXPECT_EQ(expected.front(), "00000000000000000000-00000000000000000009.json");
  EXPECT_EQ(expected.back(), "00000000012345678901-18446744073709551615.json");
  EXPECT_EQ(destination->progress(), Frontier::at(kMaxTime));
}

TEST_F(FileDestinationTest, OpenCreatesMissingDirectoriesAndStartsWithNoProgress) {
  directory_ = scratch_.path() + "/a/b/c";
  auto destination = open_destination();
  EXPECT_TRUE(fs::is_directory(directory_));
  EXPECT_EQ(destination->progress(), std::nullopt);
}

TEST_F(FileDestinationTest, ProgressIsTheLargestCommittedUpperAfterReopen) {
  {
    auto destination = open_destination();
    commit_file(*destination, 5, 7);
    commit_file(*destination, 7, 12);
    commit_file(*destination, 20, 25);  // a gap is fine: no times in [12, 20)
  }
  auto destination = open_destination();
  EXPECT_EQ(destination->progress(), Frontier::at(25));
  expect_error(destination->begin(Frontier::at(24)), ErrorKind::kInvalidUsage,
               "below the progress");
  commit_file(*destination, 25, 30);
  EXPECT_EQ(destination->progress(), Frontier::at(30));
}

// A directory is one sink's output whatever its format: a sink whose
// format changed (an update) goes on from the files of the other format,
// so nothing is written twice.
TEST_F(FileDestinationTest, ProgressCountsEitherFormatsFiles) {
  {
    auto destination = open_destination(Envelope::kUpsert, SinkFormat::kCsv);
    commit_file(*destination, 0, 50);
  }
  {
    auto destination = open_destination(Envelope::kUpsert, SinkFormat::kJson);
    EXPECT_EQ(destination->progress(), Frontier::at(50));
    expect_error(destination->begin(Frontier::at(0)), ErrorKind::kInvalidUsage,
                 "below the progress");
    commit_file(*destination, 50, 60);
  }
  EXPECT_EQ(open_destination(Envelope::kUpsert, SinkFormat::kCsv)->progress(), Frontier::at(60));
  EXPECT_EQ(names_in(directory_),
            (std::vector<std::string>{name_of(0, 50, "csv"), name_of(50, 60, "json")}));
}

TEST_F(FileDestinationTest, OpenDeletesLeftoverTemporariesAndIgnoresUnrelatedNames) {
  fs::create_directories(directory_);
  const std::vector<std::string> unrelated = {
      ".hidden",
      "notes.txt",
      name_of(0, 1, "json") + ".bak",
      "0000000000000000001-00000000000000000002.json",   // 19 digits
      "0000000000000000000a-00000000000000000002.json",  // not a digit
      name_of(0, 1, "csv") + ".bak",
  };
  for (const std::string& name : unrelated) write_file(directory_ + "/" + name, "x");
  write_file(directory_ + "/.00000000000000000005-0123456789abcdef0123456789abcdef.tmp", "half");
  write_file(directory_ + "/.x.tmp", "");
  write_file(directory_ + "/" + name_of(2, 4, "json"), "");

  auto destination = open_destination();
  std::vector<std::string> expected = unrelated;
  expected.push_back(name_of(2, 4, "json"));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names_in(directory_), expected);
  EXPECT_EQ(destination->progress(), Frontier::at(4));
}

TEST_F(FileDestinationTest, NameWithLowerNotBelowUpperIsCorruption) {
  fs::create_directories(directory_);
  for (const std::string& name :
       {name_of(5, 5, "json"), name_of(9, 5, "json"), name_of(9, 3, "csv"),
        std::string("99999999999999999999-99999999999999999999.json")}) {
    write_file(directory_ + "/" + name, "");
    auto opened = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson);
    ASSERT_FALSE(opened.has_value()) << name;
    EXPECT_EQ(opened.error().kind, ErrorKind::kCorruption);
    EXPECT_NE(opened.error().message.find(directory_ + "/" + name), std::string::npos)
        << opened.error().message;
    fs::remove(directory_ + "/" + name);
  }
}

TEST_F(FileDestinationTest, OverlappingCommittedRangesAreCorruption) {
  fs::create_directories(directory_);
  write_file(directory_ + "/" + name_of(0, 10, "json"), "");
  write_file(directory_ + "/" + name_of(10, 20, "json"), "");
  write_file(directory_ + "/" + name_of(15, 30, "json"), "");
  auto opened = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kCorruption);
  EXPECT_NE(opened.error().message.find(name_of(10, 20, "json")), std::string::npos)
      << opened.error().message;
  EXPECT_NE(opened.error().message.find(name_of(15, 30, "json")), std::string::npos)
      << opened.error().message;
}

// ---------------------------------------------------------------------------
// A snapshot in parts.

TEST_F(FileDestinationTest, SnapshotPartsAreFilesBeforeTheSnapshotsLastAndNameTheirPosition) {
  auto destination = open_destination();
  ASSERT_TRUE(destination->commits_snapshot_in_parts());
  EXPECT_EQ(destination->snapshot_position(), std::nullopt);
  ASSERT_TRUE(destination->begin(Frontier::at(0)));
  ASSERT_TRUE(destination->write(insert(R"("a")", 5, "1")));
  ASSERT_TRUE(destination->write(insert(R"("b")", 5, "2")));
  const SnapshotPosition first{5, R"("b")", 1, 2, std::nullopt};
  ASSERT_TRUE(destination->commit_snapshot_part(first));
  EXPECT_EQ(destination->progress(), std::nullopt);
  EXPECT_EQ(destination->snapshot_position(), first);
  ASSERT_TRUE(destination->begin(Frontier::at(0)));
  ASSERT_TRUE(destination->write(insert(R"("c")", 5, "3")));
  const SnapshotPosition second{5, R"("c")", 1, 3, std::nullopt};
  ASSERT_TRUE(destination->commit_snapshot_part(second));
  const std::string first_name = snapshot_part_name(6, 2, snapshot_pair_check(R"("b")", 1), "json");
  const std::string second_name =
      snapshot_part_name(6, 3, snapshot_pair_check(R"("c")", 1), "json");
  EXPECT_EQ(first_name.substr(0, 63),
            "00000000000000000000-00000000000000000006-00000000000000000002-");
  EXPECT_EQ(names_in(directory_), (std::vector<std::string>{first_name, second_name}));
  EXPECT_EQ(read_file(directory_ + "/" + first_name),
            "{\"time\":5,\"key\":\"a\",\"value\":1}\n{\"time\":5,\"key\":\"b\",\"value\":2}\n");

  // Reopened: no progress, and the position from the last part's name.
  destination.reset();
  destination = open_destination();
  EXPECT_EQ(destination->progress(), std::nullopt);
  ASSERT_TRUE(destination->snapshot_position().has_value());
  const SnapshotPosition read = *destination->snapshot_position();
  EXPECT_EQ(read.as_of, 5u);
  EXPECT_EQ(read.pairs, 3u);
  EXPECT_EQ(read.key, "");
  EXPECT_EQ(read.check, snapshot_pair_check(R"("c")", 1));

  // The last part is the usual file, sorted after the parts; then the
  // parts are history and the progress is the snapshot's.
  ASSERT_TRUE(destination->begin(Frontier::at(0)));
  ASSERT_TRUE(destination->write(insert(R"("d")", 5, "4")));
  ASSERT_TRUE(destination->commit(Frontier::at(6)));
  EXPECT_EQ(destination->snapshot_position(), std::nullopt);
  EXPECT_EQ(names_in(directory_),
            (std::vector<std::string>{first_name, second_name, name_of(0, 6, "json")}));
  destination.reset();
  destination = open_destination();
  EXPECT_EQ(destination->progress(), Frontier::at(6));
  EXPECT_EQ(destination->snapshot_position(), std::nullopt);
  expect_error(destination->commit_snapshot_part(SnapshotPosition{5, "x", 1, 4, std::nullopt}),
               ErrorKind::kInvalidUsage, "no open file");
  ASSERT_TRUE(destination->begin(Frontier::at(6)));
  expect_error(destination->commit_snapshot_part(SnapshotPosition{5, "x", 1, 4, std::nullopt}),
               ErrorKind::kInvalidUsage, "after the progress");
}

TEST_F(FileDestinationTest, ASnapshotPartMustFollowTheLastOne) {
  auto destination = open_destination();
  ASSERT_TRUE(destination->begin(Frontier::at(0)));
  ASSERT_TRUE(destination->write(insert(R"("a")", 5, "1")));
  ASSERT_TRUE(destination->commit_snapshot_part(SnapshotPosition{5, R"("a")", 1, 1, std::nullopt}));
  ASSERT_TRUE(destination->begin(Frontier::at(0)));
  ASSERT_TRUE(destination->write(insert(R"("b")", 5, "2")));
  // Not more pairs than the last part, another as_of, a pair at another
  // time: refused, nothing committed.
  expect_error(destination->commit_snapshot_part(SnapshotPosition{5, R"("b")", 1, 1, std::nullopt}),
               ErrorKind::kInvalidUsage, "does not follow");
  expect_error(destination->commit_snapshot_part(SnapshotPosition{6, R"("b")", 1, 2, std::nullopt}),
               ErrorKind::kInvalidUsage, "does not follow");
  EXPECT_EQ(names_in(directory_).size(), 2u);  // the part and the open temporary
  ASSERT_TRUE(destination->commit_snapshot_part(SnapshotPosition{5, R"("b")", 1, 2, std::nullopt}));
  ASSERT_TRUE(destination->begin(Frontier::at(3)));
  ASSERT_TRUE(destination->write(insert(R"("c")", 5, "3")));
  expect_error(destination->commit_snapshot_part(SnapshotPosition{5, R"("c")", 1, 3, std::nullopt}),
               ErrorKind::kInvalidUsage, "does not follow");
}

TEST_F(FileDestinationTest, SnapshotPartsThatDisagreeAreCorruption) {
  auto open_with = [&](const std::vector<std::string>& names) {
    fs::remove_all(directory_);
    fs::create_directories(directory_);
    for (const std::string& name : names) write_file(directory_ + "/" + name, "");
    return FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson);
  };
  // Parts of two snapshots.
  auto opened =
      open_with({snapshot_part_name(6, 2, 1, "json"), snapshot_part_name(7, 3, 1, "json")});
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().kind, ErrorKind::kCorruption);
  EXPECT_NE(opened.error().message.find("different snapshots"), std::string::npos)
      << opened.error().message;
  // Two ending at the same pair (one json, one csv).
  opened = open_with({snapshot_part_name(6, 2, 1, "json"), snapshot_part_name(6, 2, 1, "csv")});
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().kind, ErrorKind::kCorruption);
  // A part above the committed progress.
  opened = open_with({name_of(0, 4, "json"), snapshot_part_name(6, 2, 1, "json")});
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().kind, ErrorKind::kCorruption);
  EXPECT_NE(opened.error().message.find("above the committed progress"), std::string::npos)
      << opened.error().message;
  // Shaped as a part, with a lower other than 0 or no pairs.
  for (const std::string& name :
       {std::string(
            "00000000000000000001-00000000000000000006-00000000000000000002-0000000000000001.json"),
        std::string("00000000000000000000-00000000000000000006-00000000000000000000-"
                    "0000000000000001.json")}) {
    opened = open_with({name});
    ASSERT_FALSE(opened) << name;
    EXPECT_EQ(opened.error().kind, ErrorKind::kCorruption) << name;
  }
  // Parts below the progress are the complete snapshot's: fine. Names that
  // only look alike (upper-case hex, a short field) are not parts: ignored.
  opened = open_with(
      {snapshot_part_name(6, 2, 1, "json"), name_of(0, 6, "json"),
       "00000000000000000000-00000000000000000006-00000000000000000002-000000000000000A.json",
       "00000000000000000000-00000000000000000006-0002-0000000000000001.json"});
  ASSERT_TRUE(opened) << opened.error().message;
  EXPECT_EQ((*opened)->progress(), Frontier::at(6));
  EXPECT_EQ((*opened)->snapshot_position(), std::nullopt);
}

// ---------------------------------------------------------------------------
// Visibility and streaming.

TEST_F(FileDestinationTest, AnUncommittedFileHasOnlyATemporaryName) {
  auto destination = open_destination();
  ASSERT_TRUE(destination->begin(Frontier::at(4)).has_value());
  ASSERT_TRUE(destination->write(insert("1", 4, "2")).has_value());
  std::vector<std::string> names = names_in(directory_);
  ASSERT_EQ(names.size(), 1u);
  EXPECT_TRUE(std::regex_match(names[0], std::regex(R"(\.00000000000000000004-[0-9a-f]{32}\.tmp)")))
      << names[0];

  ASSERT_TRUE(destination->commit(Frontier::at(5)).has_value());
  EXPECT_EQ(names_in(directory_), std::vector<std::string>{name_of(4, 5, "json")});
}

TEST_F(FileDestinationTest, DestroyingWithAnOpenFileDeletesItsTemporary) {
  auto destination = open_destination();
  commit_file(*destination, 0, 1);
  ASSERT_TRUE(destination->begin(Frontier::at(1)).has_value());
  ASSERT_TRUE(destination->write(insert("1", 1, "2")).has_value());
  destination.reset();
  EXPECT_EQ(names_in(directory_), std::vector<std::string>{name_of(0, 1, "json")});
  EXPECT_EQ(open_destination()->progress(), Frontier::at(1));
}

TEST_F(FileDestinationTest, ALargeFileStreamsThroughTheBuffer) {
  constexpr int kPairs = 200'000;
  constexpr std::uint64_t kBuffer = FileDestination::kWriteBufferBytes;
  auto destination = open_destination();
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  const std::string temporary = directory_ + "/" + names_in(directory_).at(0);

  std::string expected;
  std::string key, value;
  for (int i = 0; i < kPairs; ++i) {
    key = std::to_string(i);
    value = "{\"n\":" + key + ",\"pad\":\"" + std::string(40, 'x') + "\"}";
    Time time = static_cast<Time>(i / 1000);
    ASSERT_TRUE(destination->write(insert(key, time, value)).has_value()) << i;
    expected +=
        "{\"time\":" + std::to_string(time) + ",\"key\":" + key + ",\"value\":" + value + "}\n";
    if (i % 20'000 == 19'999) {
      // Everything but the buffered tail is already on disk.
      std::uint64_t on_disk = size_of(temporary);
      EXPECT_LE(on_disk, destination->open_bytes());
      EXPECT_LT(destination->open_bytes() - on_disk, kBuffer) << i;
    }
  }
  ASSERT_EQ(destination->open_bytes(), expected.size());
  EXPECT_GT(expected.size(), 10 * kBuffer);
  EXPECT_EQ(names_in(directory_).size(), 1u);  // still only the temporary

  ASSERT_TRUE(destination->commit(Frontier::at(kPairs / 1000)).has_value());
  EXPECT_FALSE(fs::exists(temporary));
  EXPECT_TRUE(read_file(directory_ + "/" + name_of(0, kPairs / 1000, "json")) == expected);
}

// ---------------------------------------------------------------------------
// Contract errors: each is InvalidUsage and leaves the open file usable.

TEST_F(FileDestinationTest, WriteAndCommitNeedAnOpenFile) {
  auto destination = open_destination();
  expect_error(destination->write(insert("1", 0, "2")), ErrorKind::kInvalidUsage, "begin");
  expect_error(destination->commit(Frontier::at(1)), ErrorKind::kInvalidUsage, "begin");
  EXPECT_TRUE(names_in(directory_).empty());
}

TEST_F(FileDestinationTest, BeginRejectsAClosedLowerAFileOpenAndALowerBelowProgress) {
  auto destination = open_destination();
  expect_error(destination->begin(Frontier::closed()), ErrorKind::kInvalidUsage, "closed");
  commit_file(*destination, 0, 10);
  expect_error(destination->begin(Frontier::at(9)), ErrorKind::kInvalidUsage, "below the progress");
  ASSERT_TRUE(destination->begin(Frontier::at(10)).has_value());
  expect_error(destination->begin(Frontier::at(11)), ErrorKind::kInvalidUsage, "is open");
  EXPECT_EQ(names_in(directory_).size(), 2u);  // the committed file and one temporary
}

TEST_F(FileDestinationTest, WriteRejectsATimeBelowTheLower) {
  auto destination = open_destination();
  ASSERT_TRUE(destination->begin(Frontier::at(5)).has_value());
  expect_error(destination->write(insert("1", 4, "x")), ErrorKind::kInvalidUsage, "below");
  ASSERT_TRUE(destination->write(insert("1", 5, "y")).has_value());  // the lower itself is fine
  ASSERT_TRUE(destination->commit(Frontier::at(6)).has_value());
  EXPECT_EQ(read_file(directory_ + "/" + name_of(5, 6, "json")),
            "{\"time\":5,\"key\":1,\"value\":y}\n");
}

TEST_F(FileDestinationTest, CommitRejectsAnUpperNotAboveTheLowerOrTheTimesOrClosed) {
  auto destination = open_destination();
  ASSERT_TRUE(destination->begin(Frontier::at(5)).has_value());
  expect_error(destination->commit(Frontier::at(5)), ErrorKind::kInvalidUsage, "lower");
  expect_error(destination->commit(Frontier::at(3)), ErrorKind::kInvalidUsage, "lower");
  ASSERT_TRUE(destination->write(insert("1", 9, "2")).has_value());
  expect_error(destination->commit(Frontier::at(9)), ErrorKind::kInvalidUsage, "time written");
  expect_error(destination->commit(Frontier::closed()), ErrorKind::kInvalidUsage, "closed upper");
  EXPECT_EQ(destination->progress(), std::nullopt);
  EXPECT_EQ(names_in(directory_).size(), 1u);  // only the temporary

  ASSERT_TRUE(destination->commit(Frontier::at(10)).has_value());
  EXPECT_EQ(read_file(directory_ + "/" + name_of(5, 10, "json")),
            "{\"time\":9,\"key\":1,\"value\":2}\n");
}

TEST_F(FileDestinationTest, EmptyDirectoryIsInvalidUsage) {
  auto opened = FileDestination::open("", Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kInvalidUsage);
}

// ---------------------------------------------------------------------------
// One sink per directory.

TEST_F(FileDestinationTest, ASecondOpenOfTheDirectoryIsRefusedAndDeletesNothing) {
  auto first = open_destination();
  ASSERT_NE(first, nullptr);
  const std::string temporary = directory_ + "/.00000000000000000003-abc.tmp";
  write_file(temporary, "a line being written");
  auto second = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error().kind, ErrorKind::kHeld);
  const std::string holder = "file destination " + directory_ +
                             " is written by a file destination of pid " +
                             std::to_string(::getpid());
  EXPECT_NE(second.error().message.find(holder), std::string::npos) << second.error().message;
  EXPECT_TRUE(fs::exists(temporary)) << "a refused opener deleted the holder's temporary";
  first.reset();
  // Free once the first is gone, and the lock file is no output.
  auto third = open_destination();
  ASSERT_NE(third, nullptr);
  EXPECT_FALSE(fs::exists(temporary));
  EXPECT_TRUE(fs::exists(directory_ + "/" + std::string(FileDestination::kLockFileName)));
  EXPECT_EQ(third->progress(), std::nullopt);
}

TEST_F(FileDestinationTest, AClaimThatFailsItsCheckCommitsNothing) {
  auto claim = std::make_shared<testing::ToggledClaim>(file_destination_identity(directory_));
  auto destination = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson, claim);
  ASSERT_TRUE(destination) << destination.error().message;
  // Given a claim, it takes no lock of its own.
  EXPECT_FALSE(fs::exists(directory_ + "/" + std::string(FileDestination::kLockFileName)));
  commit_file(**destination, 0, 1);
  ASSERT_TRUE((*destination)->begin(Frontier::at(1)));
  ASSERT_TRUE((*destination)->write(insert("1", 1, "2")));
  claim->lost = true;
  expect_error((*destination)->commit(Frontier::at(2)), ErrorKind::kHeld, "taken by someone else");
  EXPECT_EQ((*destination)->progress(), Frontier::at(1));
  EXPECT_EQ(names_in(directory_), std::vector<std::string>{name_of(0, 1, "json")});
}

TEST_F(FileDestinationTest, AClaimOfAnotherDirectoryIsInvalidUsage) {
  auto claim = std::make_shared<testing::ToggledClaim>(
      file_destination_identity(scratch_.path() + "/elsewhere"));
  auto destination = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson, claim);
  ASSERT_FALSE(destination);
  EXPECT_EQ(destination.error().kind, ErrorKind::kInvalidUsage);
}

TEST_F(FileDestinationTest, ALockFileReplacedUnderneathStopsTheCommit) {
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  ASSERT_TRUE(destination->begin(Frontier::at(0)));
  fs::remove(directory_ + "/" + std::string(FileDestination::kLockFileName));
  expect_error(destination->commit(Frontier::at(1)), ErrorKind::kDeterminate,
               "was deleted or replaced");
  EXPECT_EQ(names_in(directory_), std::vector<std::string>{});
}

// ---------------------------------------------------------------------------
// File-system errors.

TEST_F(FileDestinationTest, ADirectoryThatIsAFileIsInvalidUsage) {
  write_file(directory_, "not a directory");
  auto opened = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_NE(opened.error().message.find(directory_), std::string::npos) << opened.error().message;
}

TEST_F(FileDestinationTest, ADirectoryRemovedUnderneathFailsBeginNamingThePath) {
  auto destination = open_destination();
  fs::remove_all(directory_);
  auto begun = destination->begin(Frontier::at(0));
  expect_error(begun, ErrorKind::kDeterminate, directory_ + "/.");
  expect_error(begun, ErrorKind::kDeterminate, "No such file or directory");
}

// Runs `body` on a thread of its own whose effective capabilities lack
// those that let root ignore file permissions, so that tests of permission
// errors run as root too (CI runs as root). Capabilities belong to a
// thread: the raw capset system call changes the calling thread's only,
// and that thread ends with `body`.
void without_permission_override(const std::function<void()>& body) {
  std::thread thread([&] {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
    ASSERT_EQ(::syscall(SYS_capget, &header, data), 0) << std::strerror(errno);
    for (int capability : {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER}) {
      data[CAP_TO_INDEX(capability)].effective &= ~CAP_TO_MASK(capability);
    }
    ASSERT_EQ(::syscall(SYS_capset, &header, data), 0) << std::strerror(errno);
    body();
  });
  thread.join();
}

TEST_F(FileDestinationTest, AReadOnlyDirectoryIsAClearError) {
  fs::create_directories(directory_);
  ASSERT_EQ(::chmod(directory_.c_str(), 0555), 0);
  without_permission_override([&] {
    auto unlockable = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson);
    ASSERT_FALSE(unlockable.has_value());
    EXPECT_EQ(unlockable.error().kind, ErrorKind::kDeterminate);
    EXPECT_NE(unlockable.error().message.find(directory_ + "/" +
                                              std::string(FileDestination::kLockFileName)),
              std::string::npos)
        << unlockable.error().message;
  });
  ASSERT_EQ(::chmod(directory_.c_str(), 0755), 0);

  // With its lock file made, the directory made read-only.
  open_destination().reset();
  write_file(directory_ + "/.leftover.tmp", "");
  ASSERT_EQ(::chmod(directory_.c_str(), 0555), 0);
  without_permission_override([&] {
    auto opened = FileDestination::open(directory_, Envelope::kUpsert, SinkFormat::kJson);
    ASSERT_FALSE(opened.has_value());
    EXPECT_EQ(opened.error().kind, ErrorKind::kDeterminate);
    EXPECT_NE(opened.error().message.find(directory_ + "/.leftover.tmp"), std::string::npos)
        << opened.error().message;
    EXPECT_NE(opened.error().message.find("Permission denied"), std::string::npos)
        << opened.error().message;
  });

  ASSERT_EQ(::chmod(directory_.c_str(), 0755), 0);
  fs::remove(directory_ + "/.leftover.tmp");
  ASSERT_EQ(::chmod(directory_.c_str(), 0555), 0);
  without_permission_override([&] {
    auto destination = open_destination();
    ASSERT_NE(destination, nullptr);
    auto begun = destination->begin(Frontier::at(0));
    expect_error(begun, ErrorKind::kDeterminate, directory_);
    expect_error(begun, ErrorKind::kDeterminate, "Permission denied");
  });
  ASSERT_EQ(::chmod(directory_.c_str(), 0755), 0);
}

// A write that fails (here: EFBIG past RLIMIT_FSIZE, after a short write)
// abandons the open file. Runs in a child process because the limit and the
// ignored SIGXFSZ are process-wide; the exit status names the failed step.
TEST_F(FileDestinationTest, AFailedWriteAbandonsTheFileUntilTheNextBegin) {
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  std::string value(1000, 'v');
  value = "\"" + value + "\"";
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    rlimit small = limit;
    small.rlim_cur = FileDestination::kWriteBufferBytes / 2;
    if (::setrlimit(RLIMIT_FSIZE, &small) != 0) ::_exit(10);
    if (!destination->begin(Frontier::at(0))) ::_exit(11);
    Status written;
    for (int i = 0; i < 10'000 && written; ++i) written = destination->write(insert("1", 0, value));
    if (written) ::_exit(12);
    if (!written.error().is(ErrorKind::kDeterminate)) ::_exit(13);
    if (written.error().message.find(directory_ + "/.") == std::string::npos) ::_exit(14);
    if (written.error().message.find("too large") == std::string::npos) ::_exit(15);
    if (!names_in(directory_).empty()) ::_exit(16);  // the temporary is gone
    auto again = destination->write(insert("1", 0, "2"));
    if (again || again.error().message.find("abandoned") == std::string::npos) ::_exit(17);
    if (destination->commit(Frontier::at(1))) ::_exit(18);
    if (destination->open_bytes() != 0) ::_exit(19);
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(20);
    if (!destination->begin(Frontier::at(0))) ::_exit(21);
    if (!destination->write(insert("1", 0, "2"))) ::_exit(22);
    if (!destination->commit(Frontier::at(1))) ::_exit(23);
    if (names_in(directory_) != std::vector<std::string>{name_of(0, 1, "json")}) ::_exit(24);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed step " << WEXITSTATUS(status);
}

}  // namespace
}  // namespace tidemark
