#include "location/faulty.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "util/try.h"

namespace tidemark {
namespace {

using std::chrono::milliseconds;

void expect_injected(const Error& error, ErrorKind kind) {
  EXPECT_EQ(error.kind, kind) << error.to_string();
  EXPECT_NE(error.message.find("injected"), std::string::npos) << error.to_string();
}

TEST(FaultyBlobTest, DeterminateFaultsNeverApply) {
  auto inner = std::make_shared<MemBlob>();
  ASSERT_TRUE(inner->set("kept", "value").has_value());
  FaultyBlob blob(inner, FaultConfig{.determinate_rate = 1});

  for (int i = 0; i < 20; ++i) {
    auto stored = blob.set("key" + std::to_string(i), "x");
    ASSERT_FALSE(stored.has_value());
    expect_injected(stored.error(), ErrorKind::kDeterminate);
  }
  auto removed = blob.remove("kept");
  ASSERT_FALSE(removed.has_value());
  expect_injected(removed.error(), ErrorKind::kDeterminate);
  auto got = blob.get("kept");
  ASSERT_FALSE(got.has_value());
  expect_injected(got.error(), ErrorKind::kDeterminate);
  auto range = blob.get_range("kept", 0, 1);
  ASSERT_FALSE(range.has_value());
  expect_injected(range.error(), ErrorKind::kDeterminate);
  auto listed = blob.list("", [](std::string_view, std::uint64_t) {});
  ASSERT_FALSE(listed.has_value());
  expect_injected(listed.error(), ErrorKind::kDeterminate);

  // Nothing reached the inner blob.
  int objects = 0;
  ASSERT_TRUE(inner->list("", [&](std::string_view, std::uint64_t) { ++objects; }).has_value());
  EXPECT_EQ(objects, 1);
  EXPECT_EQ(*inner->get("kept"), "value");
  EXPECT_EQ(blob.injected_determinate(), 24u);  // 20 sets and 4 other calls
  EXPECT_EQ(blob.injected_indeterminate(), 0u);
}

// A batched delete reaches the inner blob as one batch (an S3 blob's one
// request), and fails or applies as a whole.
TEST(FaultyBlobTest, BatchedDeletesStayBatched) {
  struct CountingBlob final : MemBlob {
    int singles = 0, batches = 0;
    Status remove(std::string_view key) override {
      ++singles;
      return MemBlob::remove(key);
    }
    Status remove_many(const std::vector<std::string>& keys) override {
      ++batches;
      for (const std::string& key : keys) TM_TRY(MemBlob::remove(key));
      return {};
    }
  };
  auto inner = std::make_shared<CountingBlob>();
  for (const char* key : {"a", "b", "c"}) ASSERT_TRUE(inner->set(key, "x").has_value());
  FaultyBlob blob(inner);
  ASSERT_TRUE(blob.remove_many({"a", "b"}).has_value());
  EXPECT_EQ(inner->batches, 1);
  EXPECT_EQ(inner->singles, 0);
  EXPECT_EQ(*inner->get("a"), std::nullopt);
  blob.set_config(FaultConfig{.determinate_rate = 1});
  auto refused = blob.remove_many({"c"});
  ASSERT_FALSE(refused.has_value());
  expect_injected(refused.error(), ErrorKind::kDeterminate);
  EXPECT_EQ(inner->batches, 1);  // nothing reached it
  EXPECT_EQ(*inner->get("c"), "x");
}

TEST(FaultyConsensusTest, IndeterminateFaultsSometimesApply) {
  auto inner = std::make_shared<MemConsensus>();
  FaultyConsensus consensus(inner, FaultConfig{.indeterminate_rate = 1, .seed = 42});
  constexpr int kCalls = 200;
  int applied = 0;
  int not_applied = 0;
  for (int i = 0; i < kCalls; ++i) {
    auto before = inner->head("key");
    ASSERT_TRUE(before.has_value());
    std::optional<SeqNo> expected;
    if (*before) expected = (*before)->seqno;
    auto outcome = consensus.compare_and_set("key", expected, {expected.value_or(0) + 1, "data"});
    ASSERT_FALSE(outcome.has_value());
    expect_injected(outcome.error(), ErrorKind::kIndeterminate);
    auto after = inner->head("key");
    ASSERT_TRUE(after.has_value());
    (*after != *before ? applied : not_applied)++;
  }
  EXPECT_GT(applied, 0);
  EXPECT_GT(not_applied, 0);
  EXPECT_EQ(consensus.injected_indeterminate(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(consensus.injected_determinate(), 0u);

  // Reads never get indeterminate faults, and see what was applied.
  auto head = consensus.head("key");
  ASSERT_TRUE(head.has_value());
  ASSERT_TRUE(head->has_value());
  EXPECT_EQ((*head)->seqno, static_cast<SeqNo>(applied));
  auto log = consensus.scan("key", 0, SIZE_MAX);
  ASSERT_TRUE(log.has_value());
  EXPECT_EQ(log->size(), static_cast<std::size_t>(applied));

  auto truncated = consensus.truncate("key", 1);
  ASSERT_FALSE(truncated.has_value());
  expect_injected(truncated.error(), ErrorKind::kIndeterminate);
}

TEST(FaultyBlobTest, IndeterminateFaultsSometimesApply) {
  auto inner = std::make_shared<MemBlob>();
  FaultyBlob blob(inner, FaultConfig{.indeterminate_rate = 1, .seed = 7});
  constexpr int kCalls = 100;
  for (int i = 0; i < kCalls; ++i) {
    auto stored = blob.set("key/" + std::to_string(i), "x");
    ASSERT_FALSE(stored.has_value());
    expect_injected(stored.error(), ErrorKind::kIndeterminate);
  }
  int present = 0;
  ASSERT_TRUE(inner->list("key/", [&](std::string_view, std::uint64_t) { ++present; }));
  EXPECT_GT(present, 0);
  EXPECT_LT(present, kCalls);
  // Reads pass through untouched by the indeterminate rate.
  int listed = 0;
  ASSERT_TRUE(blob.list("key/", [&](std::string_view, std::uint64_t) { ++listed; }));
  EXPECT_EQ(listed, present);
}

TEST(FaultyBlobTest, LatencyIsAppliedToEveryCall) {
  constexpr milliseconds kLatency(20);
  FaultyBlob blob(std::make_shared<MemBlob>(), FaultConfig{.latency = kLatency});
  FaultyConsensus consensus(std::make_shared<MemConsensus>(), FaultConfig{.latency = kLatency});
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(blob.get("key").has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, kLatency);
  start = std::chrono::steady_clock::now();
  ASSERT_TRUE(consensus.compare_and_set("key", std::nullopt, {1, ""}).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, kLatency);
}

// The sequence of outcomes of `calls` sets under `config`.
std::vector<bool> set_outcomes(FaultConfig config, int calls) {
  FaultyBlob blob(std::make_shared<MemBlob>(), config);
  std::vector<bool> outcomes;
  for (int i = 0; i < calls; ++i) outcomes.push_back(blob.set("key", "x").has_value());
  return outcomes;
}

TEST(FaultyBlobTest, TheSeedDeterminesTheFaults) {
  FaultConfig config{.determinate_rate = 0.5, .seed = 1234};
  auto first = set_outcomes(config, 200);
  EXPECT_EQ(set_outcomes(config, 200), first);
  auto failures = std::count(first.begin(), first.end(), false);
  EXPECT_GT(failures, 50);
  EXPECT_LT(failures, 150);
  config.seed = 4321;
  EXPECT_NE(set_outcomes(config, 200), first);
}

TEST(FaultyBlobTest, ConfigurationChangesAtRunTime) {
  FaultyBlob blob(std::make_shared<MemBlob>(), FaultConfig{.determinate_rate = 1});
  EXPECT_FALSE(blob.set("key", "x").has_value());
  blob.set_config(FaultConfig{});
  EXPECT_TRUE(blob.set("key", "x").has_value());
  EXPECT_EQ(blob.injected_determinate(), 1u);
}

TEST(FaultyConsensusTest, ConcurrentCallsWhileReconfiguring) {
  const FaultConfig faulty{.determinate_rate = 0.3, .indeterminate_rate = 0.2, .seed = 3};
  FaultyConsensus consensus(std::make_shared<MemConsensus>(), faulty);
  std::atomic<bool> running{true};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int thread = 0; thread < 4; ++thread) {
    threads.emplace_back([&, thread] {
      std::string key = "key" + std::to_string(thread);
      for (int i = 0; i < 300; ++i) {
        auto head = consensus.head(key);
        if (!head) {
          ++failed;
          continue;
        }
        std::optional<SeqNo> expected;
        if (*head) expected = (*head)->seqno;
        if (!consensus.compare_and_set(key, expected, {expected.value_or(0) + 1, ""})) ++failed;
      }
    });
  }
  // Alternates between no faults and faults with a fresh seed each time.
  std::thread reconfigure([&] {
    for (std::uint64_t round = 0; running.load(); ++round) {
      FaultConfig next = round % 2 == 0 ? FaultConfig{} : faulty;
      next.seed = round;
      consensus.set_config(next);
      std::this_thread::yield();
    }
  });
  for (auto& thread : threads) thread.join();
  running = false;
  reconfigure.join();
  // The inner backend never fails on its own here, so every failure was injected.
  EXPECT_GT(failed.load(), 0);
  EXPECT_EQ(static_cast<std::uint64_t>(failed.load()),
            consensus.injected_determinate() + consensus.injected_indeterminate());
}

}  // namespace
}  // namespace tidemark
