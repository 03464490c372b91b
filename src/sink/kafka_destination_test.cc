// KafkaDestination against librdkafka's mock cluster in its own process
// (tidemark-kafka-mock), checked with a real consumer.
#include "sink/kafka_destination.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <thread>

#include "sink/destination_url.h"
#include "sink/kafka_reader.h"
#include "testing/kafka_mock_process.h"
#include "testing/sink_util.h"

namespace tidemark {
namespace {

using std::chrono::milliseconds;
using testing::insert;
using testing::remove;
using testing::update;

constexpr milliseconds kTimeout{20'000};

struct Received {
  std::string key;
  std::optional<std::string> value;
  std::optional<std::string> time;
  bool operator<(const Received& o) const {
    return std::tie(key, value, time) < std::tie(o.key, o.value, o.time);
  }
  bool operator==(const Received&) const = default;
};

class KafkaDestinationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kUnderTsan) GTEST_SKIP() << kKafkaUnderTsan;
    auto mock = KafkaMockProcess::start(TIDEMARK_KAFKA_MOCK, {"--topic", "out:3"});
    ASSERT_TRUE(mock) << mock.error().message;
    mock_ = std::move(*mock);
    address_ = *KafkaAddress::parse("kafka://" + mock_->brokers() + "/out");
  }

  Result<std::unique_ptr<KafkaDestination>> open(Envelope envelope = Envelope::kUpsert,
                                                 std::string id = "sink-a") {
    KafkaDestinationOptions options;
    options.sink_id = std::move(id);
    options.operation_timeout = kTimeout;
    options.pool = pool_;
    options.queue_bytes = queue_bytes_;
    return KafkaDestination::open(address_, envelope, options);
  }

  // The committed data messages, as a real consumer reads them.
  std::pair<KafkaSinkAudit, std::vector<Received>> committed(std::string id = "sink-a") {
    std::vector<Received> out;
    auto audit = audit_kafka_sink(address_, id, kTimeout, [&](const KafkaMessageView& m) -> Status {
      Received r{std::string(m.key), std::nullopt, std::nullopt};
      if (m.value) r.value = std::string(*m.value);
      if (m.time) r.time = std::string(*m.time);
      out.push_back(std::move(r));
      return {};
    });
    EXPECT_TRUE(audit) << audit.error().message;
    return {audit.value_or(KafkaSinkAudit{}), out};
  }

  std::unique_ptr<KafkaMockProcess> mock_;
  KafkaAddress address_;
  std::shared_ptr<MemoryPool> pool_ = MemoryPool::create("sink", 64 << 20);
  std::uint64_t queue_bytes_ = 1 << 20;
};

TEST(KafkaAddressTest, ParsesBrokersTopicAndProgressTopic) {
  auto a = KafkaAddress::parse("kafka://h1:9092,h2:9093/orders");
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(a->brokers, "h1:9092,h2:9093");
  EXPECT_EQ(a->topic, "orders");
  EXPECT_EQ(a->progress_topic, "orders-progress");
  auto b = KafkaAddress::parse("kafka://h:1/t?progress_topic=p.t");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->progress_topic, "p.t");
}

TEST(KafkaAddressTest, RejectsMalformedUrlsClearly) {
  for (const char* url : {"kafka://h:1", "kafka:///t", "kafka://h/t", "kafka://h:0/t",
                          "kafka://h:70000/t", "kafka://h:1,/t", "kafka://h:1/", "kafka://h:1/a b",
                          "kafka://h:1/t?x=y", "kafka://h:1/t?progress_topic=t", "file:///t"}) {
    auto a = KafkaAddress::parse(url);
    ASSERT_FALSE(a) << url;
    EXPECT_EQ(a.error().kind, ErrorKind::kInvalidUsage);
    EXPECT_NE(a.error().message.find(url), std::string::npos) << a.error().message;
  }
}

TEST(KafkaProgressRecordTest, RoundTripsAndRejectsCorruptRecords) {
  KafkaProgressRecord record;
  record.frontier = Frontier::at(42);
  record.topic = "out";
  record.offsets = {{0, 3, 9}, {2, 0, 0}};
  auto parsed = KafkaProgressRecord::parse(record.to_json());
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->frontier, Frontier::at(42));
  EXPECT_EQ(parsed->topic, "out");
  ASSERT_EQ(parsed->offsets.size(), 2u);
  EXPECT_EQ(parsed->offsets[0].last, 9);
  for (const char* bad :
       {"", "{}", R"({"frontier":1,"topic":"t"})", R"({"frontier":-1,"topic":"t","offsets":[]})",
        R"({"frontier":1,"topic":"t","offsets":[[0,5,4]]})",
        R"({"frontier":1,"topic":"t","offsets":[[0,1]]})"}) {
    auto p = KafkaProgressRecord::parse(bad);
    ASSERT_FALSE(p) << bad;
    EXPECT_EQ(p.error().kind, ErrorKind::kCorruption);
  }
}

TEST(KafkaProgressRecordTest, ASnapshotPartRoundTripsAndAnOldRecordHasNone) {
  KafkaProgressRecord record;
  record.frontier = Frontier::at(0);
  record.topic = "out";
  // Any bytes of a key, exactly.
  record.snapshot = SnapshotPosition{7, std::string("\"k\"\x00\xff\n", 6), 3, 1000};
  const std::string json = record.to_json();
  EXPECT_NE(json.find(R"("snapshot":{"as_of":7,"key_hex":"226b2200ff0a","key_pairs":3,)"),
            std::string::npos)
      << json;
  auto parsed = KafkaProgressRecord::parse(json);
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->snapshot, record.snapshot);
  // A record written before snapshots came in parts reads as it always did.
  auto old = KafkaProgressRecord::parse(R"({"frontier":5,"topic":"t","offsets":[[0,1,2]]})");
  ASSERT_TRUE(old) << old.error().message;
  EXPECT_EQ(old->frontier, Frontier::at(5));
  EXPECT_EQ(old->snapshot, std::nullopt);
  for (
      const char* bad : {
          R"({"frontier":0,"topic":"t","offsets":[],"snapshot":1})",
          R"({"frontier":0,"topic":"t","offsets":[],"snapshot":{"as_of":1,"key_hex":"a","key_pairs":1,"pairs":1}})",
          R"({"frontier":0,"topic":"t","offsets":[],"snapshot":{"as_of":1,"key_hex":"zz","key_pairs":1,"pairs":1}})",
          R"({"frontier":0,"topic":"t","offsets":[],"snapshot":{"as_of":1,"key_hex":"61","key_pairs":0,"pairs":1}})",
          R"({"frontier":0,"topic":"t","offsets":[],"snapshot":{"as_of":1,"key_hex":"61","key_pairs":2,"pairs":1}})",
          R"({"frontier":3,"topic":"t","offsets":[],"snapshot":{"as_of":1,"key_hex":"61","key_pairs":1,"pairs":1}})",
      }) {
    auto p = KafkaProgressRecord::parse(bad);
    ASSERT_FALSE(p) << bad;
    EXPECT_EQ(p.error().kind, ErrorKind::kCorruption);
  }
}

// A snapshot's parts: each a transaction with its position; a reopened
// destination finds the position and no progress, and the last part's
// commit ends the snapshot.
TEST_F(KafkaDestinationTest, SnapshotPartsKeepTheirPositionUntilTheSnapshotIsCommitted) {
  auto destination = open();
  ASSERT_TRUE(destination) << destination.error().message;
  EXPECT_TRUE((*destination)->commits_snapshot_in_parts());
  ASSERT_TRUE((*destination)->begin(Frontier::at(0)));
  ASSERT_TRUE((*destination)->write(insert(R"("a")", 4, "1")));
  ASSERT_TRUE((*destination)->write(insert(R"("b")", 4, "2")));
  const SnapshotPosition first{4, R"("b")", 1, 2};
  ASSERT_TRUE((*destination)->commit_snapshot_part(first));
  EXPECT_EQ((*destination)->progress(), std::nullopt);
  EXPECT_EQ((*destination)->snapshot_position(), first);
  ASSERT_TRUE((*destination)->begin(Frontier::at(0)));
  ASSERT_TRUE((*destination)->write(insert(R"("b")", 4, "2")));
  // Destroyed with the part open: aborted.
  destination->reset();

  auto reopened = open();
  ASSERT_TRUE(reopened) << reopened.error().message;
  EXPECT_EQ((*reopened)->progress(), std::nullopt);
  EXPECT_EQ((*reopened)->snapshot_position(), first);
  auto [audit, messages] = committed();
  EXPECT_EQ(audit.frontier, std::nullopt);
  EXPECT_EQ(audit.snapshot, first);
  EXPECT_EQ(messages.size(), 2u);
  // A part behind the committed one is refused (and the part stays open).
  ASSERT_TRUE((*reopened)->begin(Frontier::at(0)));
  EXPECT_EQ((*reopened)->commit_snapshot_part(SnapshotPosition{4, R"("a")", 1, 1}).error().kind,
            ErrorKind::kInvalidUsage);
  ASSERT_TRUE((*reopened)->write(insert(R"("b")", 4, "2")));
  ASSERT_TRUE((*reopened)->commit(Frontier::at(5)));
  EXPECT_EQ((*reopened)->progress(), Frontier::at(5));
  EXPECT_EQ((*reopened)->snapshot_position(), std::nullopt);
  reopened->reset();

  auto again = open();
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ((*again)->progress(), Frontier::at(5));
  EXPECT_EQ((*again)->snapshot_position(), std::nullopt);
  auto [final_audit, final_messages] = committed();
  EXPECT_EQ(final_audit.frontier, Frontier::at(5));
  EXPECT_EQ(final_audit.snapshot, std::nullopt);
  EXPECT_EQ(final_audit.transactions, 2u);
  std::multiset<Received> got(final_messages.begin(), final_messages.end());
  std::multiset<Received> want{{R"("a")", "1", "4"}, {R"("b")", "2", "4"}, {R"("b")", "2", "4"}};
  EXPECT_EQ(got, want);
}

TEST_F(KafkaDestinationTest, CommitsMessagesAndProgressTogether) {
  auto destination = open();
  ASSERT_TRUE(destination) << destination.error().message;
  EXPECT_EQ((*destination)->progress(), std::nullopt);
  ASSERT_TRUE((*destination)->begin(Frontier::at(0)));
  ASSERT_TRUE((*destination)->write(insert(R"("k1")", 5, R"({"a":1})")));
  ASSERT_TRUE((*destination)->write(update("7", 6, "1", "2")));
  ASSERT_TRUE((*destination)->write(remove(R"("k1")", 7, R"({"a":1})")));
  EXPECT_GT((*destination)->open_bytes(), 0u);
  ASSERT_TRUE((*destination)->commit(Frontier::at(8)));
  EXPECT_EQ((*destination)->progress(), Frontier::at(8));
  destination->reset();

  auto [audit, messages] = committed();
  EXPECT_EQ(audit.frontier, Frontier::at(8));
  EXPECT_EQ(audit.transactions, 1u);
  EXPECT_EQ(audit.outside, 0u);
  std::multiset<Received> got(messages.begin(), messages.end());
  std::multiset<Received> want{{R"("k1")", R"({"a":1})", "5"},
                               {"7", "2", "6"},
                               {R"("k1")", std::nullopt, "7"}};  // a tombstone
  EXPECT_EQ(got, want);

  auto reopened = open();
  ASSERT_TRUE(reopened) << reopened.error().message;
  EXPECT_EQ((*reopened)->progress(), Frontier::at(8));
}

TEST_F(KafkaDestinationTest, DebeziumValuesHaveBeforeAndAfter) {
  auto destination = open(Envelope::kDebezium);
  ASSERT_TRUE(destination) << destination.error().message;
  ASSERT_TRUE((*destination)->begin(Frontier::at(0)));
  ASSERT_TRUE((*destination)->write(update(R"("k")", 2, "1", "2")));
  ASSERT_TRUE((*destination)->write(remove(R"("j")", 2, "3")));
  ASSERT_TRUE((*destination)->commit(Frontier::at(3)));
  auto [audit, messages] = committed();
  std::multiset<Received> got(messages.begin(), messages.end());
  std::multiset<Received> want{{R"("k")", R"({"before":1,"after":2})", "2"},
                               {R"("j")", R"({"before":3,"after":null})", "2"}};
  EXPECT_EQ(got, want);
}

TEST_F(KafkaDestinationTest, AnAbandonedTransactionIsNeitherProgressNorOutput) {
  {
    auto destination = open();
    ASSERT_TRUE(destination) << destination.error().message;
    ASSERT_TRUE((*destination)->begin(Frontier::at(0)));
    ASSERT_TRUE((*destination)->write(insert("1", 1, "10")));
    ASSERT_TRUE((*destination)->commit(Frontier::at(2)));
    ASSERT_TRUE((*destination)->begin(Frontier::at(2)));
    for (int i = 0; i < 100; ++i) ASSERT_TRUE((*destination)->write(insert("2", 3, "20")));
    // Destroyed with the transaction open: aborted.
  }
  auto reopened = open();
  ASSERT_TRUE(reopened) << reopened.error().message;
  EXPECT_EQ((*reopened)->progress(), Frontier::at(2));
  ASSERT_TRUE((*reopened)->begin(Frontier::at(2)));
  ASSERT_TRUE((*reopened)->write(insert("3", 4, "30")));
  ASSERT_TRUE((*reopened)->commit(Frontier::at(5)));

  auto [audit, messages] = committed();
  EXPECT_EQ(audit.frontier, Frontier::at(5));
  EXPECT_EQ(audit.transactions, 2u);
  std::multiset<Received> got(messages.begin(), messages.end());
  std::multiset<Received> want{{"1", "10", "1"}, {"3", "30", "4"}};
  EXPECT_EQ(got, want);
}

TEST_F(KafkaDestinationTest, AClaimLostBeforeTheCommitAbortsTheTransaction) {
  auto claim = std::make_shared<testing::ToggledClaim>("kafka://" + mock_->brokers() + "/out");
  KafkaDestinationOptions options;
  options.sink_id = "sink-a";
  options.operation_timeout = kTimeout;
  options.claim = claim;
  {
    auto destination = KafkaDestination::open(address_, Envelope::kUpsert, options);
    ASSERT_TRUE(destination) << destination.error().message;
    ASSERT_TRUE((*destination)->begin(Frontier::at(0)));
    ASSERT_TRUE((*destination)->write(insert("1", 1, "10")));
    ASSERT_TRUE((*destination)->commit(Frontier::at(2)));
    ASSERT_TRUE((*destination)->begin(Frontier::at(2)));
    ASSERT_TRUE((*destination)->write(insert("2", 3, "20")));
    claim->lost = true;
    auto committed = (*destination)->commit(Frontier::at(4));
    ASSERT_FALSE(committed);
    EXPECT_EQ(committed.error().kind, ErrorKind::kHeld);
    EXPECT_EQ((*destination)->progress(), Frontier::at(2));
  }
  auto [audit, messages] = committed();
  EXPECT_EQ(audit.frontier, Frontier::at(2));
  EXPECT_EQ(messages, (std::vector<Received>{{"1", "10", "1"}}));
}

TEST_F(KafkaDestinationTest, SinksWithDifferentIdsKeepTheirOwnProgress) {
  auto a = open(Envelope::kUpsert, "sink-a");
  auto b = open(Envelope::kUpsert, "sink-b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE((*a)->begin(Frontier::at(0)));
  ASSERT_TRUE((*a)->write(insert("1", 1, "1")));
  ASSERT_TRUE((*a)->commit(Frontier::at(10)));
  ASSERT_TRUE((*b)->begin(Frontier::at(0)));
  ASSERT_TRUE((*b)->commit(Frontier::at(3)));
  a->reset();
  b->reset();
  EXPECT_EQ((*open(Envelope::kUpsert, "sink-a"))->progress(), Frontier::at(10));
  EXPECT_EQ((*open(Envelope::kUpsert, "sink-b"))->progress(), Frontier::at(3));
  EXPECT_EQ((*open(Envelope::kUpsert, "sink-c"))->progress(), std::nullopt);
}

TEST_F(KafkaDestinationTest, ASmallQueueIsBackpressureNotLoss) {
  queue_bytes_ = 16 << 10;  // 8 KiB of payload, 16 messages
  auto destination = open();
  ASSERT_TRUE(destination) << destination.error().message;
  EXPECT_EQ(pool_->used(), 16u << 10);  // the queue's bytes are reserved
  ASSERT_TRUE((*destination)->begin(Frontier::at(0)));
  const std::string value(200, 'x');
  const std::string json = "\"" + value + "\"";
  constexpr int kMessages = 3'000;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE((*destination)->write(insert(std::to_string(i), 1, json)));
  }
  ASSERT_TRUE((*destination)->commit(Frontier::at(2)));
  destination->reset();
  EXPECT_EQ(pool_->used(), 0u);
  auto [audit, messages] = committed();
  ASSERT_EQ(messages.size(), static_cast<std::size_t>(kMessages));
  std::set<std::string> keys;
  for (const auto& m : messages) keys.insert(m.key);
  EXPECT_EQ(keys.size(), static_cast<std::size_t>(kMessages));
}

TEST_F(KafkaDestinationTest, AQueueLargerThanThePoolIsAClearError) {
  pool_ = MemoryPool::create("tiny", 64 << 10);
  auto destination = open();
  ASSERT_FALSE(destination);
  EXPECT_EQ(destination.error().kind, ErrorKind::kInvalidUsage);
}

TEST_F(KafkaDestinationTest, ASinkURLSizesTheQueueToFitItsPool) {
  // A server's sink pool is a quarter of --memory-limit: at 48 MiB that is
  // 12 MiB, under the usual 16 MiB queue, which then takes half of it.
  auto url = parse_sink_url("kafka://" + mock_->brokers() + "/out", SinkFormat::kJson);
  ASSERT_TRUE(url) << url.error().message;
  for (const std::uint64_t capacity : {std::uint64_t{12} << 20, std::uint64_t{64} << 20}) {
    pool_ = MemoryPool::create("sinks", capacity);
    auto destination = open_sink_destination(*url, Envelope::kUpsert, SinkFormat::kJson, "s",
                                             "fits", pool_, nullptr);
    ASSERT_TRUE(destination) << destination.error().message;
    EXPECT_EQ(pool_->used(), std::min(kKafkaQueueBytes, capacity / 2));
  }
}

TEST_F(KafkaDestinationTest, UnreachableBrokersAreAClearErrorWithinTheTimeout) {
  mock_.reset();  // nothing listens there any more
  KafkaDestinationOptions options;
  options.sink_id = "sink-a";
  options.operation_timeout = milliseconds(2000);
  const auto start = std::chrono::steady_clock::now();
  auto destination = KafkaDestination::open(address_, Envelope::kUpsert, options);
  ASSERT_FALSE(destination);
  EXPECT_EQ(destination.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(destination.error().message.find(address_.brokers), std::string::npos)
      << destination.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

TEST_F(KafkaDestinationTest, UsageErrorsChangeNothing) {
  auto destination = open();
  ASSERT_TRUE(destination) << destination.error().message;
  EXPECT_EQ((*destination)->write(insert("1", 1, "1")).error().kind, ErrorKind::kInvalidUsage);
  EXPECT_EQ((*destination)->commit(Frontier::at(1)).error().kind, ErrorKind::kInvalidUsage);
  ASSERT_TRUE((*destination)->begin(Frontier::at(5)));
  EXPECT_EQ((*destination)->begin(Frontier::at(5)).error().kind, ErrorKind::kInvalidUsage);
  EXPECT_EQ((*destination)->write(insert("1", 4, "1")).error().kind, ErrorKind::kInvalidUsage);
  EXPECT_EQ((*destination)->commit(Frontier::at(5)).error().kind, ErrorKind::kInvalidUsage);
  EXPECT_EQ((*destination)->commit(Frontier::closed()).error().kind, ErrorKind::kInvalidUsage);
  ASSERT_TRUE((*destination)->write(insert("1", 5, "1")));
  ASSERT_TRUE((*destination)->commit(Frontier::at(6)));
  EXPECT_EQ((*destination)->begin(Frontier::at(3)).error().kind, ErrorKind::kInvalidUsage);
}

}  // namespace
}  // namespace tidemark
