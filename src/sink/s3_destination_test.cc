// S3Destination against the S3 server named by TIDEMARK_TEST_S3
// (s3_test_prefix.h: each test writes under a fresh prefix of its own,
// emptied afterwards; without the variable these tests skip, saying so),
// and against a scripted server (scripted_http_server.h) for the requests
// of the paths s3rver cannot take (UploadPartCopy) and for failures.
#include "sink/s3_destination.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "sink/committed_name.h"
#include "sink/destination_url.h"
#include "sink/file_destination.h"
#include "testing/s3_test_prefix.h"
#include "testing/scratch_directory.h"
#include "testing/scripted_http_server.h"
#include "testing/sink_util.h"
#include "util/try.h"

namespace tidemark {
namespace {

using testing::insert;
using testing::remove;
using testing::update;

constexpr std::uint64_t kMiB = 1 << 20;

std::string name_of(Time lower, Time upper, std::string_view extension) {
  char name[64];
  std::snprintf(name, sizeof(name), "%020llu-%020llu.", static_cast<unsigned long long>(lower),
                static_cast<unsigned long long>(upper));
  return name + std::string(extension);
}

void expect_error(const Status& status, ErrorKind kind, std::string_view needle) {
  ASSERT_FALSE(status.has_value()) << "expected " << error_kind_name(kind);
  EXPECT_EQ(status.error().kind, kind) << status.error().to_string();
  EXPECT_NE(status.error().message.find(needle), std::string::npos)
      << status.error().message << " does not mention " << needle;
}

// Lines of ~`line_bytes` each, at times 0, 0, ..., 1, 1, ... (1000 a time).
std::vector<DiffPair> many_pairs(std::size_t count, std::size_t line_bytes,
                                 std::vector<std::string>* storage) {
  storage->clear();
  storage->reserve(2 * count);
  for (std::size_t i = 0; i < count; ++i) {
    storage->push_back(std::to_string(i));
    storage->push_back("{\"n\":" + std::to_string(i) + ",\"pad\":\"" +
                       std::string(line_bytes, static_cast<char>('a' + i % 26)) + "\"}");
  }
  std::vector<DiffPair> pairs;
  pairs.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    pairs.push_back(insert((*storage)[2 * i], static_cast<Time>(i / 1000), (*storage)[2 * i + 1]));
  }
  return pairs;
}

class S3DestinationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = s3_test_server();
    if (!server_) GTEST_SKIP() << no_s3_server_message();
    prefix_ = fresh_prefix();
  }

  // A fresh prefix (emptied when the test ends) with `parameters` added
  // to its URL.
  std::shared_ptr<S3Blob> fresh_prefix(std::string_view parameters = {}) {
    auto blob = open_fresh_s3_blob(*server_, parameters);
    EXPECT_TRUE(blob.has_value()) << blob.error().to_string();
    return blob.value_or(nullptr);
  }

  Result<std::unique_ptr<S3Destination>> try_open(Envelope envelope = Envelope::kUpsert,
                                                  SinkFormat format = SinkFormat::kJson,
                                                  S3DestinationOptions options = {}) {
    TM_ASSIGN(S3Credentials credentials, s3_credentials_from_environment());
    return S3Destination::open(prefix_->url(), std::move(credentials), envelope, format,
                               std::move(options));
  }

  std::unique_ptr<S3Destination> open_destination(Envelope envelope = Envelope::kUpsert,
                                                  SinkFormat format = SinkFormat::kJson,
                                                  S3DestinationOptions options = {}) {
    auto opened = try_open(envelope, format, std::move(options));
    EXPECT_TRUE(opened.has_value()) << opened.error().to_string();
    return opened ? std::move(*opened) : nullptr;
  }

  // The names directly under the prefix, sorted.
  std::vector<std::string> names() {
    std::vector<std::string> out;
    auto listed = prefix_->list("", [&](std::string_view key, std::uint64_t) {
      if (key.find('/') == std::string_view::npos) out.emplace_back(key);
    });
    EXPECT_TRUE(listed.has_value()) << listed.error().to_string();
    std::sort(out.begin(), out.end());
    return out;
  }

  // The object's bytes, read with a plain GET (sink objects have no
  // S3Blob digest).
  std::string read_object(const std::string& name) {
    auto credentials = s3_credentials_from_environment();
    EXPECT_TRUE(credentials.has_value());
    S3Client client(prefix_->url(), credentials.value_or(S3Credentials{}));
    S3Request request{.method = "GET", .target = client.object_path(name)};
    S3Call call{.operation = "test: read", .subject = name, .accepted = {200}};
    auto answer = client.exchange(request, call);
    EXPECT_TRUE(answer.has_value()) << answer.error().to_string();
    return answer ? std::move(answer->body) : "<error>";
  }

  void put_object(const std::string& name, std::string_view bytes) {
    auto stored = prefix_->set(name, bytes);
    ASSERT_TRUE(stored.has_value()) << stored.error().to_string();
  }

  // Writes one interval [lower, upper) with one insert at `lower`.
  void commit_interval(S3Destination& destination, Time lower, Time upper) {
    ASSERT_TRUE(destination.begin(Frontier::at(lower)).has_value());
    ASSERT_TRUE(destination.write(insert("1", lower, "2")).has_value());
    auto committed = destination.commit(Frontier::at(upper));
    ASSERT_TRUE(committed.has_value()) << committed.error().to_string();
  }

  std::optional<std::string> server_;
  std::shared_ptr<S3Blob> prefix_;
};

// ---------------------------------------------------------------------------
// Contents: the same as a file's.

TEST_F(S3DestinationTest, JsonUpsertObjectHoldsOneLinePerPair) {
  auto destination = open_destination(Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_NE(destination, nullptr);
  EXPECT_EQ(destination->progress(), std::nullopt);
  std::string key1 = R"("k1")", value1 = R"({"a":1})", key3 = R"("k3")", before3 = "[1,2]";
  ASSERT_TRUE(destination->begin(Frontier::at(2)).has_value());
  ASSERT_TRUE(destination->write(insert(key1, 3, value1)).has_value());
  ASSERT_TRUE(destination->write(update(R"("k2")", 4, "1", "2")).has_value());
  ASSERT_TRUE(destination->write(remove(key3, 7, before3)).has_value());
  auto committed = destination->commit(Frontier::at(8));
  ASSERT_TRUE(committed.has_value()) << committed.error().to_string();

  EXPECT_EQ(names(), std::vector<std::string>{name_of(2, 8, "json")});
  EXPECT_EQ(read_object(name_of(2, 8, "json")),
            "{\"time\":3,\"key\":\"k1\",\"value\":{\"a\":1}}\n"
            "{\"time\":4,\"key\":\"k2\",\"value\":2}\n"
            "{\"time\":7,\"key\":\"k3\",\"value\":null}\n");
  EXPECT_EQ(destination->progress(), Frontier::at(8));
}

TEST_F(S3DestinationTest, CsvDebeziumObjectStartsWithTheHeaderRow) {
  auto destination = open_destination(Envelope::kDebezium, SinkFormat::kCsv);
  ASSERT_NE(destination, nullptr);
  std::string object = R"({"a":1,"b":2})", string_key = R"("k")";
  ASSERT_TRUE(destination->begin(Frontier::at(5)).has_value());
  ASSERT_TRUE(destination->write(insert("1", 5, object)).has_value());
  ASSERT_TRUE(destination->write(update("2", 5, "10", "11")).has_value());
  ASSERT_TRUE(destination->write(remove(string_key, 6, "[1,2]")).has_value());
  ASSERT_TRUE(destination->commit(Frontier::at(7)).has_value());
  // An empty interval is an object too: just the header row.
  ASSERT_TRUE(destination->begin(Frontier::at(7)).has_value());
  ASSERT_TRUE(destination->commit(Frontier::at(9)).has_value());

  EXPECT_EQ(names(), (std::vector<std::string>{name_of(5, 7, "csv"), name_of(7, 9, "csv")}));
  EXPECT_EQ(read_object(name_of(5, 7, "csv")),
            "time,key,before,after\n"
            "5,1,null,\"{\"\"a\"\":1,\"\"b\"\":2}\"\n"
            "5,2,10,11\n"
            "6,\"\"\"k\"\"\",\"[1,2]\",null\n");
  EXPECT_EQ(read_object(name_of(7, 9, "csv")), "time,key,before,after\n");
}

// ---------------------------------------------------------------------------
// Names and progress.

TEST_F(S3DestinationTest, ProgressIsTheLargestCommittedUpperAfterReopen) {
  {
    auto destination = open_destination();
    ASSERT_NE(destination, nullptr);
    commit_interval(*destination, 5, 7);
    commit_interval(*destination, 7, 12);
    commit_interval(*destination, 20, 25);  // a gap is fine: no times in [12, 20)
  }
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  EXPECT_EQ(destination->progress(), Frontier::at(25));
  expect_error(destination->begin(Frontier::at(24)), ErrorKind::kInvalidUsage,
               "below the progress");
  commit_interval(*destination, 25, 30);
  EXPECT_EQ(destination->progress(), Frontier::at(30));
  // A prefix is one sink's output whatever its format: one whose format
  // changed goes on from there.
  auto csv = open_destination(Envelope::kUpsert, SinkFormat::kCsv);
  ASSERT_NE(csv, nullptr);
  EXPECT_EQ(csv->progress(), Frontier::at(30));
}

TEST_F(S3DestinationTest, OpenDeletesLeftoverTemporariesAndIgnoresUnrelatedNames) {
  const std::vector<std::string> unrelated = {
      ".hidden",
      "notes.txt",
      name_of(0, 1, "json") + ".bak",
      "0000000000000000001-00000000000000000002.json",  // 19 digits
      name_of(0, 1, "csv") + ".bak",
      "nested/" + name_of(0, 100, "json"),  // below a further '/'
      "nested/.x.tmp",
  };
  for (const std::string& name : unrelated) put_object(name, "x");
  put_object(".00000000000000000005-0123456789abcdef0123456789abcdef.tmp", "half");
  put_object(".x.tmp", "");
  put_object(name_of(2, 4, "json"), "");

  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  EXPECT_EQ(destination->progress(), Frontier::at(4));
  std::vector<std::string> all;
  ASSERT_TRUE(prefix_->list("", [&](std::string_view key, std::uint64_t) { all.emplace_back(key); })
                  .has_value());
  std::vector<std::string> expected = unrelated;
  expected.push_back(name_of(2, 4, "json"));
  std::sort(expected.begin(), expected.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, expected);
}

TEST_F(S3DestinationTest, BadAndOverlappingCommittedNamesAreCorruption) {
  put_object(name_of(9, 5, "json"), "");
  auto opened = try_open();
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kCorruption) << opened.error().to_string();
  EXPECT_NE(opened.error().message.find(name_of(9, 5, "json")), std::string::npos)
      << opened.error().message;
  ASSERT_TRUE(prefix_->remove(name_of(9, 5, "json")).has_value());

  put_object(name_of(0, 10, "json"), "");
  put_object(name_of(10, 20, "json"), "");
  put_object(name_of(15, 30, "json"), "");
  opened = try_open();
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kCorruption) << opened.error().to_string();
  const std::string& message = opened.error().message;
  EXPECT_NE(message.find(name_of(10, 20, "json")), std::string::npos) << message;
  EXPECT_NE(message.find(name_of(15, 30, "json")), std::string::npos) << message;
  EXPECT_NE(message.find("s3://"), std::string::npos) << message;
}

// ---------------------------------------------------------------------------
// Visibility.

TEST_F(S3DestinationTest, AnUncommittedIntervalIsNeverVisible) {
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  commit_interval(*destination, 0, 1);
  ASSERT_TRUE(destination->begin(Frontier::at(1)).has_value());
  ASSERT_TRUE(destination->write(insert("1", 1, "2")).has_value());
  EXPECT_EQ(names(), std::vector<std::string>{name_of(0, 1, "json")});
  destination.reset();  // abandons the open interval
  EXPECT_EQ(names(), std::vector<std::string>{name_of(0, 1, "json")});
  auto reopened = open_destination();
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->progress(), Frontier::at(1));
}

TEST_F(S3DestinationTest, ALargeUncommittedIntervalIsNeverVisibleEither) {
  prefix_ = fresh_prefix("&part_size=5MiB");
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  std::vector<std::string> storage;
  auto pairs = many_pairs(60'000, 100, &storage);  // ~7.5 MiB: one part is up
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  for (const DiffPair& pair : pairs) ASSERT_TRUE(destination->write(pair).has_value());
  EXPECT_GT(destination->open_bytes(), 5 * kMiB);
  // The part is in an upload, not an object.
  EXPECT_EQ(names(), std::vector<std::string>{});
  destination.reset();
  EXPECT_EQ(names(), std::vector<std::string>{});
  auto reopened = open_destination();
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->progress(), std::nullopt);
}

// A snapshot in parts: each part an object named with its position (one
// PUT, or an upload of several parts when it is larger than part_size),
// read back by a reopened destination; the snapshot's last object moves
// the progress.
TEST_F(S3DestinationTest, SnapshotPartsAreObjectsThatNameTheirPosition) {
  prefix_ = fresh_prefix("&part_size=5MiB");
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  ASSERT_TRUE(destination->commits_snapshot_in_parts());
  ASSERT_TRUE(destination->begin(Frontier::at(0)));
  ASSERT_TRUE(destination->write(insert(R"("a")", 5, "1")));
  ASSERT_TRUE(destination->write(insert(R"("b")", 5, "2")));
  ASSERT_TRUE(destination->commit_snapshot_part(SnapshotPosition{5, R"("b")", 1, 2, std::nullopt}));
  // ~7.5 MiB: an upload of two parts.
  std::vector<std::string> keys;
  for (int i = 0; i < 60'000; ++i) keys.push_back("\"c" + std::to_string(100'000 + i) + "\"");
  const std::string value = "\"" + std::string(100, 'v') + "\"";
  ASSERT_TRUE(destination->begin(Frontier::at(0)));
  for (const std::string& key : keys) ASSERT_TRUE(destination->write(insert(key, 5, value)));
  EXPECT_GT(destination->open_bytes(), 5 * kMiB);
  ASSERT_TRUE(
      destination->commit_snapshot_part(SnapshotPosition{5, keys.back(), 1, 60'002, std::nullopt}));
  EXPECT_EQ(destination->progress(), std::nullopt);
  const std::string first = snapshot_part_name(6, 2, snapshot_pair_check(R"("b")", 1), "json");
  const std::string second =
      snapshot_part_name(6, 60'002, snapshot_pair_check(keys.back(), 1), "json");
  EXPECT_EQ(names(), (std::vector<std::string>{first, second}));
  EXPECT_EQ(read_object(first),
            "{\"time\":5,\"key\":\"a\",\"value\":1}\n{\"time\":5,\"key\":\"b\",\"value\":2}\n");
  EXPECT_GT(read_object(second).size(), 5 * kMiB);

  destination = open_destination();
  ASSERT_NE(destination, nullptr);
  EXPECT_EQ(destination->progress(), std::nullopt);
  ASSERT_TRUE(destination->snapshot_position().has_value());
  EXPECT_EQ(destination->snapshot_position()->as_of, 5u);
  EXPECT_EQ(destination->snapshot_position()->pairs, 60'002u);
  EXPECT_EQ(destination->snapshot_position()->check, snapshot_pair_check(keys.back(), 1));
  ASSERT_TRUE(destination->begin(Frontier::at(0)));
  ASSERT_TRUE(destination->write(insert(R"("d")", 5, "4")));
  ASSERT_TRUE(destination->commit(Frontier::at(6)));
  EXPECT_EQ(destination->snapshot_position(), std::nullopt);
  EXPECT_EQ(names(), (std::vector<std::string>{first, second, name_of(0, 6, "json")}));
  destination = open_destination();
  ASSERT_NE(destination, nullptr);
  EXPECT_EQ(destination->progress(), Frontier::at(6));
  EXPECT_EQ(destination->snapshot_position(), std::nullopt);
}

TEST_F(S3DestinationTest, AClaimLostBeforeTheCommitMakesNothingAppear) {
  for (const bool large : {false, true}) {
    SCOPED_TRACE(large ? "uploaded in parts" : "one PUT");
    prefix_ = fresh_prefix("&part_size=5MiB");
    auto claim = std::make_shared<testing::ToggledClaim>("s3://any");
    S3DestinationOptions options;
    options.claim = claim;
    auto destination = open_destination(Envelope::kUpsert, SinkFormat::kJson, options);
    ASSERT_NE(destination, nullptr);
    commit_interval(*destination, 0, 1);
    std::vector<std::string> storage;
    auto pairs = many_pairs(large ? 60'000 : 10, 100, &storage);
    ASSERT_TRUE(destination->begin(Frontier::at(1)).has_value());
    for (const DiffPair& pair : pairs) {
      ASSERT_TRUE(destination->write(DiffPair{pair.key, pair.time + 1, pair.before, pair.after, 0})
                      .has_value());
    }
    claim->lost = true;
    auto committed = destination->commit(Frontier::at(1000));
    ASSERT_FALSE(committed.has_value());
    EXPECT_EQ(committed.error().kind, ErrorKind::kHeld);
    EXPECT_EQ(destination->progress(), Frontier::at(1));
    // Nothing but the first interval, whatever s3rver kept of the temporary.
    std::vector<std::string> visible;
    for (const std::string& name : names()) {
      if (!is_temporary_name(name)) visible.push_back(name);
    }
    EXPECT_EQ(visible, std::vector<std::string>{name_of(0, 1, "json")});
  }
}

// ---------------------------------------------------------------------------
// Large intervals and memory.

// ~12 MiB with part_size 5 MiB: three parts to a temporary, completed,
// copied to the final name and deleted; the bytes are exactly a file's.
TEST_F(S3DestinationTest, AnIntervalLargerThanAPartIsUploadedInPartsAndCopied) {
  prefix_ = fresh_prefix("&part_size=5MiB");
  auto pool = MemoryPool::create("sink", 64 * kMiB);
  auto destination =
      open_destination(Envelope::kUpsert, SinkFormat::kJson, S3DestinationOptions{.pool = pool});
  ASSERT_NE(destination, nullptr);
  const std::uint64_t buffer_bytes = 5 * kMiB + S3Destination::kLineSlackBytes;
  EXPECT_EQ(pool->used(), buffer_bytes);

  ScratchDirectory scratch;
  auto file = FileDestination::open(scratch.path(), Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_TRUE(file.has_value()) << file.error().to_string();

  std::vector<std::string> storage;
  auto pairs = many_pairs(100'000, 100, &storage);
  const Time upper = static_cast<Time>(pairs.size() / 1000);
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  ASSERT_TRUE((*file)->begin(Frontier::at(0)).has_value());
  for (const DiffPair& pair : pairs) {
    ASSERT_TRUE(destination->write(pair).has_value());
    ASSERT_TRUE((*file)->write(pair).has_value());
  }
  const std::uint64_t bytes = destination->open_bytes();
  EXPECT_EQ(bytes, (*file)->open_bytes());
  EXPECT_GT(bytes, 12 * kMiB);
  auto committed = destination->commit(Frontier::at(upper));
  ASSERT_TRUE(committed.has_value()) << committed.error().to_string();
  ASSERT_TRUE((*file)->commit(Frontier::at(upper)).has_value());
  EXPECT_EQ(destination->progress(), Frontier::at(upper));

  // Only the final name: the temporary is gone.
  const std::string name = name_of(0, upper, "json");
  EXPECT_EQ(names(), std::vector<std::string>{name});
  std::ifstream in(scratch.path() + "/" + name, std::ios::binary);
  const std::string expected((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  ASSERT_EQ(expected.size(), bytes);
  const std::string object = read_object(name);
  EXPECT_EQ(object.size(), bytes);
  EXPECT_TRUE(object == expected) << "the object differs from the file";

  // The buffer never held more than one part and a line.
  EXPECT_LE(pool->stats().peak_used, buffer_bytes);
  EXPECT_EQ(open_destination()->progress(), Frontier::at(upper));
}

TEST_F(S3DestinationTest, ALineLongerThanTheSlackIsChargedThenGivenBack) {
  prefix_ = fresh_prefix("&part_size=5MiB");
  auto pool = MemoryPool::create("sink", 64 * kMiB);
  auto destination =
      open_destination(Envelope::kUpsert, SinkFormat::kJson, S3DestinationOptions{.pool = pool});
  ASSERT_NE(destination, nullptr);
  const std::uint64_t buffer_bytes = 5 * kMiB + S3Destination::kLineSlackBytes;
  std::vector<std::string> storage;
  auto pairs = many_pairs(40'000, 100, &storage);
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  // Fill the buffer to just under a part, then a line of 3 MiB.
  for (const DiffPair& pair : pairs) {
    if (destination->open_bytes() > 5 * kMiB - 1000) break;
    ASSERT_TRUE(destination->write(pair).has_value());
  }
  ASSERT_LT(destination->open_bytes(), 5 * kMiB);
  EXPECT_EQ(pool->stats().peak_used, buffer_bytes);
  const std::string huge = "\"" + std::string(3 * kMiB, 'h') + "\"";
  ASSERT_TRUE(destination->write(insert("\"huge\"", 50, huge)).has_value());
  const std::uint64_t peak = pool->stats().peak_used;
  EXPECT_GT(peak, buffer_bytes);                    // charged
  EXPECT_LE(peak, 2 * buffer_bytes + huge.size());  // by one regrowth at most
  EXPECT_EQ(pool->used(), buffer_bytes);            // and given back once the part went up
  const std::uint64_t bytes = destination->open_bytes();
  auto committed = destination->commit(Frontier::at(51));
  ASSERT_TRUE(committed.has_value()) << committed.error().to_string();
  EXPECT_EQ(pool->used(), buffer_bytes);
  const std::string object = read_object(name_of(0, 51, "json"));
  EXPECT_EQ(object.size(), bytes);
  EXPECT_TRUE(object.ends_with(",\"key\":\"huge\",\"value\":" + huge + "}\n"));
}

// s3rver does not implement UploadPartCopy: the copy of a temporary above
// max_copy_object_bytes fails, Determinate, and leaves nothing behind.
TEST_F(S3DestinationTest, ACopyInPartsThatFailsLeavesNothing) {
  prefix_ = fresh_prefix("&part_size=5MiB");
  auto destination = open_destination(
      Envelope::kUpsert, SinkFormat::kJson,
      S3DestinationOptions{
          .pool = nullptr, .max_copy_object_bytes = 1 * kMiB, .copy_part_bytes = 5 * kMiB});
  ASSERT_NE(destination, nullptr);
  std::vector<std::string> storage;
  auto pairs = many_pairs(50'000, 100, &storage);  // ~6 MiB
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  for (const DiffPair& pair : pairs) ASSERT_TRUE(destination->write(pair).has_value());
  auto committed = destination->commit(Frontier::at(50));
  if (committed.has_value()) {
    GTEST_SKIP() << "this S3 server implements UploadPartCopy; the scripted test covers failures";
  }
  EXPECT_EQ(committed.error().kind, ErrorKind::kDeterminate) << committed.error().to_string();
  EXPECT_NE(committed.error().message.find("copy part 1"), std::string::npos)
      << committed.error().message;
  EXPECT_EQ(destination->progress(), std::nullopt);
  EXPECT_EQ(names(), std::vector<std::string>{});
  expect_error(destination->commit(Frontier::at(50)), ErrorKind::kInvalidUsage, "abandoned");
  // A small interval still commits.
  commit_interval(*destination, 0, 1);
  EXPECT_EQ(names(), std::vector<std::string>{name_of(0, 1, "json")});
}

// ---------------------------------------------------------------------------
// Contract errors: each is InvalidUsage and changes nothing.

TEST_F(S3DestinationTest, ContractErrorsAreInvalidUsage) {
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  expect_error(destination->write(insert("1", 0, "2")), ErrorKind::kInvalidUsage, "begin");
  expect_error(destination->commit(Frontier::at(1)), ErrorKind::kInvalidUsage, "begin");
  expect_error(destination->begin(Frontier::closed()), ErrorKind::kInvalidUsage, "closed");
  ASSERT_TRUE(destination->begin(Frontier::at(5)).has_value());
  expect_error(destination->begin(Frontier::at(6)), ErrorKind::kInvalidUsage, "is open");
  expect_error(destination->write(insert("1", 4, "x")), ErrorKind::kInvalidUsage, "below");
  expect_error(destination->commit(Frontier::at(5)), ErrorKind::kInvalidUsage, "lower");
  ASSERT_TRUE(destination->write(insert("1", 9, "2")).has_value());
  expect_error(destination->commit(Frontier::at(9)), ErrorKind::kInvalidUsage, "time written");
  expect_error(destination->commit(Frontier::closed()), ErrorKind::kInvalidUsage, "closed upper");
  EXPECT_EQ(names(), std::vector<std::string>{});
  ASSERT_TRUE(destination->commit(Frontier::at(10)).has_value());
  EXPECT_EQ(read_object(name_of(5, 10, "json")), "{\"time\":9,\"key\":1,\"value\":2}\n");
  expect_error(destination->begin(Frontier::at(9)), ErrorKind::kInvalidUsage, "below the progress");
}

// ---------------------------------------------------------------------------
// Without a server: URLs, credentials, memory, failures (scripted).

TEST(S3DestinationUrlTest, SinkUrlsAcceptS3InEitherFormat) {
  const std::string url = "s3://bucket/out/sink?endpoint=http://127.0.0.1:9&part_size=6MiB";
  for (SinkFormat format : {SinkFormat::kJson, SinkFormat::kCsv}) {
    auto parsed = parse_sink_url(url, format);
    ASSERT_TRUE(parsed.has_value()) << parsed.error().to_string();
    ASSERT_TRUE(parsed->s3.has_value());
    EXPECT_EQ(parsed->s3->bucket, "bucket");
    EXPECT_EQ(parsed->s3->prefix, "out/sink");
    EXPECT_EQ(parsed->s3->part_size, 6 * kMiB);
    EXPECT_FALSE(parsed->directory || parsed->kafka);
  }
  for (const char* bad : {"s3://bucket/p", "s3://B/p?endpoint=http://h:1",
                          "s3://bucket/p?endpoint=http://h:1&part_size=1MiB",
                          "s3://bucket/../p?endpoint=http://h:1"}) {
    auto parsed = parse_sink_url(bad, SinkFormat::kJson);
    ASSERT_FALSE(parsed.has_value()) << bad;
    EXPECT_EQ(parsed.error().kind, ErrorKind::kInvalidUsage) << bad;
  }
  auto other = parse_sink_url("ftp://x", SinkFormat::kJson);
  ASSERT_FALSE(other.has_value());
  EXPECT_NE(other.error().message.find("s3://"), std::string::npos) << other.error().message;
  EXPECT_EQ(other.error().message.find("not built"), std::string::npos) << other.error().message;
}

TEST(S3DestinationUrlTest, OpeningNeedsCredentialsFromTheEnvironment) {
  ScopedEnvironmentVariable id("AWS_ACCESS_KEY_ID", std::nullopt);
  auto url = parse_sink_url("s3://bucket/p?endpoint=http://127.0.0.1:1", SinkFormat::kJson);
  ASSERT_TRUE(url.has_value());
  auto opened = open_sink_destination(*url, Envelope::kUpsert, SinkFormat::kJson, "s", "s",
                                      MemoryPool::create("sink", 64 * kMiB), nullptr);
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_NE(opened.error().message.find("AWS_ACCESS_KEY_ID"), std::string::npos);
}

TEST(S3DestinationUrlTest, APoolThatCannotHoldThePartIsInvalidUsage) {
  auto url = parse_s3_url("s3://bucket/p?endpoint=http://127.0.0.1:1");
  ASSERT_TRUE(url.has_value());
  auto opened = S3Destination::open(
      *url, S3Credentials{"id", "secret", ""}, Envelope::kUpsert, SinkFormat::kJson,
      S3DestinationOptions{.pool = MemoryPool::create("small", 4 * kMiB)});
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kInvalidUsage) << opened.error().to_string();
  EXPECT_NE(opened.error().message.find("part_size"), std::string::npos) << opened.error().message;
}

TEST(S3DestinationUrlTest, AnUnreachableEndpointFailsOpenDeterminately) {
  auto url = parse_s3_url("s3://bucket/p?endpoint=http://127.0.0.1:1&max_attempts=2");
  ASSERT_TRUE(url.has_value());
  auto opened = S3Destination::open(*url, S3Credentials{"id", "secret", ""}, Envelope::kUpsert,
                                    SinkFormat::kJson);
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kDeterminate) << opened.error().to_string();
  EXPECT_NE(opened.error().message.find("127.0.0.1"), std::string::npos) << opened.error().message;
}

// A scripted S3: an empty listing, multipart uploads, copies; knobs make
// steps fail.
struct ScriptedS3 {
  std::atomic<int> failing_put_status{0};   // answer plain PUTs with it
  std::atomic<int> failing_part{0};         // answer this part number with 400
  std::atomic<bool> fail_completes{false};  // answer completions 200 + <Error>

  std::string operator()(const RecordedRequest& request) {
    using Server = ScriptedHttpServer;
    if (request.method == "GET") {
      return Server::answer(200,
                            "<ListBucketResult><IsTruncated>false</IsTruncated>"
                            "</ListBucketResult>");
    }
    if (request.method == "POST" && request.query == "uploads=") {
      return Server::answer(200, "<InitiateMultipartUploadResult><UploadId>up-" +
                                     std::to_string(++uploads) +
                                     "</UploadId></InitiateMultipartUploadResult>");
    }
    if (request.method == "PUT" && request.query.starts_with("partNumber=")) {
      std::string number = request.query.substr(11, request.query.find('&') - 11);
      if (std::to_string(failing_part.load()) == number) {
        return Server::s3_error(400, "InvalidArgument", "Part refused");
      }
      if (!request.header("x-amz-copy-source").empty()) {
        return Server::answer(
            200, "<CopyPartResult><ETag>&quot;copy-" + number + "&quot;</ETag></CopyPartResult>");
      }
      return Server::answer(200, "", {"ETag: \"etag-" + number + "\""});
    }
    if (request.method == "POST" && request.query.starts_with("uploadId=")) {
      if (fail_completes) {
        return Server::answer(200,
                              "<Error><Code>InternalError</Code><Message>no</Message></Error>");
      }
      return Server::answer(200, "<CompleteMultipartUploadResult></CompleteMultipartUploadResult>");
    }
    if (request.method == "PUT" && !request.header("x-amz-copy-source").empty()) {
      return Server::answer(200, "<CopyObjectResult><ETag>x</ETag></CopyObjectResult>");
    }
    if (request.method == "PUT" && failing_put_status != 0) {
      return Server::s3_error(failing_put_status, "InternalError", "PUT refused");
    }
    if (request.method == "DELETE") return Server::answer(204);
    return Server::answer(200);
  }

  std::atomic<int> uploads{0};
};

class S3DestinationScriptedTest : public ::testing::Test {
 protected:
  std::unique_ptr<S3Destination> open_destination(S3DestinationOptions options = {}) {
    auto url = parse_s3_url("s3://bucket/out?endpoint=" + server_.endpoint() +
                            "&part_size=5MiB&max_attempts=2");
    EXPECT_TRUE(url.has_value());
    auto opened = S3Destination::open(url.value_or(S3Url{}), S3Credentials{"id", "secret", ""},
                                      Envelope::kUpsert, SinkFormat::kJson, std::move(options));
    EXPECT_TRUE(opened.has_value()) << opened.error().to_string();
    return opened ? std::move(*opened) : nullptr;
  }

  // Writes `count` lines of ~130 bytes from time 0 on.
  void write_lines(S3Destination& destination, std::size_t count) {
    pairs_ = many_pairs(count, 100, &storage_);
    for (const DiffPair& pair : pairs_) ASSERT_TRUE(destination.write(pair).has_value());
  }

  std::vector<std::string> steps() const {
    std::vector<std::string> out;
    for (const RecordedRequest& request : server_.requests()) {
      std::string step = request.method + " " + request.target;
      if (!request.header("x-amz-copy-source").empty()) {
        step += " from " + request.header("x-amz-copy-source");
      }
      if (!request.header("x-amz-copy-source-range").empty()) {
        step += " " + request.header("x-amz-copy-source-range");
      }
      out.push_back(step);
    }
    return out;
  }

  ScriptedS3 script_;
  ScriptedHttpServer server_{[this](const RecordedRequest& request) { return script_(request); }};
  std::vector<std::string> storage_;
  std::vector<DiffPair> pairs_;
};

TEST_F(S3DestinationScriptedTest, ALargeTemporaryIsCopiedInPartsThenDeleted) {
  auto destination = open_destination(S3DestinationOptions{
      .pool = nullptr, .max_copy_object_bytes = 6 * kMiB, .copy_part_bytes = 5 * kMiB});
  ASSERT_NE(destination, nullptr);
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  write_lines(*destination, 100'000);  // ~14 MiB: parts of ~5, ~5 and ~4 MiB
  const std::uint64_t bytes = destination->open_bytes();
  auto committed = destination->commit(Frontier::at(100));
  ASSERT_TRUE(committed.has_value()) << committed.error().to_string();

  const std::vector<std::string> steps = this->steps();
  ASSERT_EQ(steps.size(), 12u) << ::testing::PrintToString(steps);
  EXPECT_EQ(steps[0].substr(0, 11), "GET /bucket");
  const std::regex temporary(R"(/bucket/out/\.00000000000000000000-[0-9a-f]{32}\.tmp)");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(steps[1], match, temporary)) << steps[1];
  const std::string path = match.str();
  const std::string target = "/bucket/out/" + name_of(0, 100, "json");
  EXPECT_EQ(steps[1], "POST " + path + "?uploads=");
  for (int part = 1; part <= 3; ++part) {
    EXPECT_EQ(steps[1 + part],
              "PUT " + path + "?partNumber=" + std::to_string(part) + "&uploadId=up-1");
  }
  EXPECT_EQ(steps[5], "POST " + path + "?uploadId=up-1");
  EXPECT_EQ(steps[6], "POST " + target + "?uploads=");
  EXPECT_EQ(steps[7], "PUT " + target + "?partNumber=1&uploadId=up-2 from " + path + " bytes=0-" +
                          std::to_string(5 * kMiB - 1));
  EXPECT_EQ(steps[8], "PUT " + target + "?partNumber=2&uploadId=up-2 from " + path + " bytes=" +
                          std::to_string(5 * kMiB) + "-" + std::to_string(10 * kMiB - 1));
  EXPECT_EQ(steps[9], "PUT " + target + "?partNumber=3&uploadId=up-2 from " + path +
                          " bytes=" + std::to_string(10 * kMiB) + "-" + std::to_string(bytes - 1));
  EXPECT_EQ(steps[10], "POST " + target + "?uploadId=up-2");
  EXPECT_EQ(steps[11], "DELETE " + path);
  const auto requests = server_.requests();
  EXPECT_EQ(requests[10].body,
            "<CompleteMultipartUpload>"
            "<Part><PartNumber>1</PartNumber><ETag>&quot;copy-1&quot;</ETag></Part>"
            "<Part><PartNumber>2</PartNumber><ETag>&quot;copy-2&quot;</ETag></Part>"
            "<Part><PartNumber>3</PartNumber><ETag>&quot;copy-3&quot;</ETag></Part>"
            "</CompleteMultipartUpload>");
  EXPECT_EQ(requests[1].header("content-type"), "application/x-ndjson");
  EXPECT_EQ(destination->progress(), Frontier::at(100));
}

TEST_F(S3DestinationScriptedTest, AFailedPartIsDeterminateAndAbortsTheUpload) {
  script_.failing_part = 2;
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  pairs_ = many_pairs(100'000, 100, &storage_);
  Status written;
  for (const DiffPair& pair : pairs_) {
    written = destination->write(pair);
    if (!written) break;
  }
  expect_error(written, ErrorKind::kDeterminate, "upload part 2");
  const std::vector<std::string> steps = this->steps();
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back().substr(0, 7), "DELETE ");
  EXPECT_NE(steps.back().find("uploadId=up-1"), std::string::npos) << steps.back();
  expect_error(destination->write(insert("1", 0, "2")), ErrorKind::kInvalidUsage, "abandoned");
  EXPECT_EQ(destination->open_bytes(), 0u);
}

TEST_F(S3DestinationScriptedTest, AFailedCompletionOfTheTemporaryIsDeterminate) {
  script_.fail_completes = true;
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  ASSERT_TRUE(destination->begin(Frontier::at(0)).has_value());
  write_lines(*destination, 50'000);  // ~6.3 MiB
  auto committed = destination->commit(Frontier::at(50));
  expect_error(committed, ErrorKind::kDeterminate, "nothing was committed");
  EXPECT_EQ(destination->progress(), std::nullopt);
  // Aborted, and the temporary deleted in case it appeared.
  const std::vector<std::string> steps = this->steps();
  ASSERT_GE(steps.size(), 2u);
  EXPECT_NE(steps[steps.size() - 2].find("DELETE"), std::string::npos);
  EXPECT_NE(steps[steps.size() - 2].find("uploadId="), std::string::npos);
  EXPECT_NE(steps.back().find("DELETE"), std::string::npos);
  EXPECT_NE(steps.back().find(".tmp"), std::string::npos);
  EXPECT_EQ(steps.back().find("uploadId="), std::string::npos);
}

TEST_F(S3DestinationScriptedTest, AFinalPutWithAnUnknownOutcomeIsIndeterminate) {
  script_.failing_put_status = 500;
  auto destination = open_destination();
  ASSERT_NE(destination, nullptr);
  ASSERT_TRUE(destination->begin(Frontier::at(3)).has_value());
  ASSERT_TRUE(destination->write(insert("1", 3, "2")).has_value());
  auto committed = destination->commit(Frontier::at(4));
  expect_error(committed, ErrorKind::kIndeterminate, name_of(3, 4, "json"));
  EXPECT_EQ(destination->progress(), std::nullopt);

  // Refused for certain: Determinate.
  script_.failing_put_status = 403;
  ASSERT_TRUE(destination->begin(Frontier::at(3)).has_value());
  expect_error(destination->commit(Frontier::at(4)), ErrorKind::kDeterminate, "HTTP 403");

  script_.failing_put_status = 0;
  ASSERT_TRUE(destination->begin(Frontier::at(3)).has_value());
  ASSERT_TRUE(destination->commit(Frontier::at(4)).has_value());
  EXPECT_EQ(destination->progress(), Frontier::at(4));
  EXPECT_EQ(steps().back(), "PUT /bucket/out/" + name_of(3, 4, "json"));
}

}  // namespace
}  // namespace tidemark
