// RandomConfig: a seed means one configuration, every drawn configuration
// is within its ranges and works, and TIDEMARK_RANDOM_CONFIG's text is
// parsed strictly.
#include "shard/random_config.h"

#include <gtest/gtest.h>

#include <set>

#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "testing/shard_util.h"
#include "tidemark/appender.h"
#include "tidemark/read.h"

namespace tidemark {
namespace {

using testing::read_snapshot;

TEST(RandomConfigTest, TheSameSeedGivesTheSameConfiguration) {
  std::set<std::string> seen;
  for (std::uint64_t seed : {0ull, 1ull, 2ull, 42ull, 18446744073709551615ull}) {
    const RandomConfig config = draw_random_config(seed);
    EXPECT_EQ(config.seed, seed);
    EXPECT_EQ(config.describe(), draw_random_config(seed).describe());
    EXPECT_TRUE(config.describe().starts_with("seed=" + std::to_string(seed) + ": "))
        << config.describe();
    seen.insert(config.describe().substr(config.describe().find(':')));
  }
  EXPECT_EQ(seen.size(), 5u) << "different seeds drew the same knobs";
}

TEST(RandomConfigTest, DrawnKnobsStayInTheirRanges) {
  int background = 0, batched = 0, faulty = 0;
  for (std::uint64_t seed = 0; seed < 1000; ++seed) {
    SCOPED_TRACE(draw_random_config(seed).describe());
    const RandomConfig config = draw_random_config(seed);
    EXPECT_GE(config.client.part_target_bytes, 4u << 10);
    EXPECT_LT(config.client.part_target_bytes, 16u << 20);
    EXPECT_GE(config.client.block_bytes, 512u);
    EXPECT_LT(config.client.block_bytes, 256u << 10);
    EXPECT_GE(config.client.max_uploads_in_flight, 1u);
    EXPECT_LE(config.client.max_uploads_in_flight, 4u);
    EXPECT_GE(config.client.zstd_level, 1);
    EXPECT_LE(config.client.zstd_level, 6);
    EXPECT_GE(config.client.listen_buffer_bytes, 4u << 10);
    EXPECT_GE(config.client.listen_poll_interval.count(), 1);
    EXPECT_LE(config.client.listen_poll_interval.count(), 100);
    EXPECT_GE(config.appender.batch_max_bytes, 4u << 10);
    EXPECT_GE(config.appender.batch_max_records, 8u);
    EXPECT_GE(config.appender.queue_bytes, 1u << 20);
    EXPECT_LE(config.appender.batch_linger.count(), 20);
    for (const FaultConfig& faults : {config.blob_faults, config.consensus_faults}) {
      EXPECT_LE(faults.latency.count(), 20'000);
      EXPECT_TRUE(faults.determinate_rate == 0 ||
                  (faults.determinate_rate >= 0.01 && faults.determinate_rate <= 0.05));
      EXPECT_TRUE(faults.indeterminate_rate == 0 ||
                  (faults.indeterminate_rate >= 0.01 && faults.indeterminate_rate <= 0.05));
    }
    background += config.client.background_compaction;
    batched += config.appender.batch_appends;
    faulty += config.injects_faults();
  }
  // Both sides of every switch come up.
  EXPECT_GT(background, 500);
  EXPECT_LT(background, 1000);
  EXPECT_GT(batched, 500);
  EXPECT_LT(batched, 1000);
  EXPECT_GT(faulty, 300);
  EXPECT_LT(faulty, 1000);
}

// A configuration works end to end: a client and an appender open with it,
// records appended under its faults all commit exactly once, and a
// snapshot and a listen read them back.
TEST(RandomConfigTest, EveryDrawnConfigurationAppendsAndReads) {
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    const RandomConfig config = draw_random_config(seed);
    SCOPED_TRACE(config.describe());
    auto blob = std::make_shared<FaultyBlob>(std::make_shared<MemBlob>());
    auto consensus = std::make_shared<FaultyConsensus>(std::make_shared<MemConsensus>());
    auto client = Client::open(Location{blob, consensus}, config.client);
    ASSERT_TRUE(client) << client.error().to_string();
    ASSERT_TRUE((*client)->create_shard("s"));
    auto shard = (*client)->open_shard("s");
    ASSERT_TRUE(shard) << shard.error().to_string();

    blob->set_config(config.blob_faults);
    consensus->set_config(config.consensus_faults);
    auto appender = Appender::open(*shard, config.appender);
    ASSERT_TRUE(appender) << appender.error().to_string();
    AppendSender sender = (*appender)->sender();
    std::vector<CommitToken> tokens;
    constexpr int kRecords = 300;
    for (int i = 0; i < kRecords; ++i) {
      auto token = sender.enqueue_with_token(
          AppendRecord{"k" + std::to_string(i), std::string(i % 50, 'v'), 1});
      ASSERT_TRUE(token) << token.error().to_string();
      tokens.push_back(*token);
    }
    Time last = 0;
    for (const CommitToken& token : tokens) {
      auto time = token.wait();
      ASSERT_TRUE(time) << time.error().to_string();
      last = std::max(last, *time);
    }
    (*appender)->close();
    blob->set_config({});
    consensus->set_config({});

    auto contents = read_snapshot(**shard, last);
    ASSERT_TRUE(contents) << contents.error().to_string();
    ASSERT_EQ(contents->size(), static_cast<std::size_t>(kRecords));
    for (const auto& [kv, diff] : *contents) EXPECT_EQ(diff, 1) << kv.first;
    auto listener = (*shard)->listen(0, last + 1);
    ASSERT_TRUE(listener) << listener.error().to_string();
    auto listened = testing::read_listen(**listener);
    ASSERT_TRUE(listened) << listened.error().to_string();
    // Appender times are wall-clock milliseconds: all after 0.
    testing::Collection from_listen;
    for (const Update& u : listened->updates) from_listen[{u.key, u.value}] += u.diff;
    EXPECT_EQ(from_listen, *contents);
    // A pass racing the background compactor may lose and be told to retry.
    auto compacted = (*shard)->compact();
    for (int attempt = 0; attempt < 5 && !compacted; ++attempt) compacted = (*shard)->compact();
    ASSERT_TRUE(compacted) << compacted.error().to_string();
    auto collected = (*shard)->collect_garbage();
    for (int attempt = 0; attempt < 5 && !collected; ++attempt) {
      collected = (*shard)->collect_garbage();
    }
    ASSERT_TRUE(collected) << collected.error().to_string();
    auto after = read_snapshot(**shard, last);
    ASSERT_TRUE(after) << after.error().to_string();
    EXPECT_EQ(*after, *contents);
  }
}

TEST(RandomConfigTest, SeedTextIsADecimalNumberOrRandom) {
  EXPECT_EQ(parse_random_config_seed("0"), 0u);
  EXPECT_EQ(parse_random_config_seed("42"), 42u);
  EXPECT_EQ(parse_random_config_seed("18446744073709551615"), 18446744073709551615ull);
  EXPECT_TRUE(parse_random_config_seed("random"));
  for (std::string_view bad :
       {"", "-1", "+1", " 1", "1 ", "0x10", "1e3", "18446744073709551616", "Random", "yes"}) {
    auto seed = parse_random_config_seed(bad);
    ASSERT_FALSE(seed) << bad;
    EXPECT_TRUE(seed.error().is(ErrorKind::kInvalidUsage)) << seed.error().to_string();
    EXPECT_NE(seed.error().message.find(kRandomConfigVariable), std::string::npos);
  }
}

}  // namespace
}  // namespace tidemark
