#include "sink/sink_status.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "location/forwarding.h"
#include "location/mem_consensus.h"

namespace tidemark {
namespace {

using std::chrono::milliseconds;

// Fails every write while `failing` is set (a backend that is down).
class FailingWrites final : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;
  std::atomic<bool> failing{false};
  std::atomic<int> writes{0};

  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    ++writes;
    if (failing) return determinate("injected: down");
    return ForwardingConsensus::compare_and_set(key, expected, std::move(next));
  }
};

TEST(SinkStatusRecord, RoundTripsEveryField) {
  SinkStatusRecord record;
  record.status = "failed";
  record.error = "broker \"b\" unreachable";
  record.frontier = Frontier::at(42);
  record.runner = "tidemark serve on db1:6875";
  record.owner = "server-a";
  record.written_at_ms = 1'700'000'000'000;
  auto parsed = SinkStatusRecord::parse(record.to_json());
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->to_json(), record.to_json());
  EXPECT_EQ(parsed->frontier, Frontier::at(42));
  EXPECT_EQ(parsed->error, record.error);

  record.error.reset();
  record.frontier = Frontier::closed();
  parsed = SinkStatusRecord::parse(record.to_json());
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->frontier, Frontier::closed());
  EXPECT_FALSE(parsed->error);

  record.frontier.reset();
  parsed = SinkStatusRecord::parse(record.to_json());
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_FALSE(parsed->frontier);
}

TEST(SinkStatusRecord, AnythingElseIsCorruptionNotACrash) {
  for (
      const char* bad :
      {"", "[]", "{}", "{\"status\":1}", "null",
       R"({"status":"running","error":null,"frontier":{"at":-1},"runner":"r","owner":"o","written_at_ms":1})",
       R"({"status":"running","error":null,"frontier":{},"runner":"r","owner":"o","written_at_ms":1})",
       R"({"status":"running","error":3,"frontier":null,"runner":"r","owner":"o","written_at_ms":1})",
       R"({"status":"running","error":null,"frontier":null,"runner":"r","owner":"o"})"}) {
    auto parsed = SinkStatusRecord::parse(bad);
    ASSERT_FALSE(parsed) << bad;
    EXPECT_TRUE(parsed.error().is(ErrorKind::kCorruption)) << parsed.error().message;
  }
}

TEST(SinkStatusPublisher, StatusAtOnceFrontierAtMostEveryPeriodAndFlushCatchesUp) {
  auto consensus = std::make_shared<FailingWrites>(std::make_shared<MemConsensus>());
  SinkStatusPublisher publisher(consensus, "files", "tidemark serve on h:1", "server-a",
                                milliseconds(60'000));
  auto read = [&] {
    auto record = read_sink_status(*consensus, "files");
    EXPECT_TRUE(record) << record.error().message;
    return record && *record ? **record : SinkStatusRecord{};
  };
  EXPECT_FALSE(*read_sink_status(*consensus, "files"));
  ASSERT_TRUE(publisher.set_status("running", std::nullopt));
  EXPECT_EQ(read().status, "running");
  EXPECT_EQ(read().runner, "tidemark serve on h:1");
  EXPECT_EQ(read().owner, "server-a");
  EXPECT_GT(read().written_at_ms, 0u);

  // Within the period a frontier waits; flush publishes it.
  publisher.set_frontier(Frontier::at(5));
  EXPECT_FALSE(read().frontier);
  publisher.flush();
  EXPECT_EQ(read().frontier, Frontier::at(5));
  const int writes = consensus->writes;
  publisher.flush();  // nothing pending: no write
  EXPECT_EQ(consensus->writes, writes);

  // A failed write stays pending and lands with the next flush.
  consensus->failing = true;
  EXPECT_FALSE(publisher.set_status("failed", "the disk is full"));
  consensus->failing = false;
  EXPECT_EQ(read().status, "running");
  publisher.flush();
  EXPECT_EQ(read().status, "failed");
  EXPECT_EQ(read().error, "the disk is full");
  EXPECT_EQ(read().frontier, Frontier::at(5));

  // A staged status waits for the next write.
  publisher.stage_status("running", "broker down (retrying)");
  EXPECT_EQ(read().status, "failed");
  publisher.flush();
  EXPECT_EQ(read().error, "broker down (retrying)");
}

TEST(SinkStatusPublisher, ANewRunnerWritesOverThePreviousOnesAndHistoryIsTruncated) {
  auto consensus = std::make_shared<MemConsensus>();
  {
    SinkStatusPublisher before(consensus, "files", "tidemark serve on a:1", "server-a");
    ASSERT_TRUE(before.set_status("running", std::nullopt));
  }
  SinkStatusPublisher after(consensus, "files", "tidemark serve on b:1", "server-b",
                            milliseconds(0));
  for (Time t = 1; t <= 40; ++t) after.set_frontier(Frontier::at(t));
  ASSERT_TRUE(after.set_status("stopped", std::nullopt));
  auto record = read_sink_status(*consensus, "files");
  ASSERT_TRUE(record && *record);
  EXPECT_EQ((*record)->runner, "tidemark serve on b:1");
  EXPECT_EQ((*record)->status, "stopped");
  EXPECT_EQ((*record)->frontier, Frontier::at(40));
  auto versions = consensus->scan(sink_status_key("files"), 0, 1000);
  ASSERT_TRUE(versions);
  EXPECT_LE(versions->size(), SinkStatusPublisher::kTruncateEvery);
}

TEST(SinkStatusPublisher, ConcurrentReportsLandInOrderOfTheirWrites) {
  auto consensus = std::make_shared<MemConsensus>();
  SinkStatusPublisher publisher(consensus, "files", "r", "o", milliseconds(0));
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (Time t = 0; t < 200; ++t) publisher.set_frontier(Frontier::at(t * 4 + i));
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(publisher.set_status("stopped", std::nullopt));
  auto record = read_sink_status(*consensus, "files");
  ASSERT_TRUE(record && *record);
  EXPECT_EQ((*record)->status, "stopped");
  EXPECT_TRUE((*record)->frontier.has_value());
}

}  // namespace
}  // namespace tidemark
