// The background appender: tokens, memory bounds, re-timing, faults.
#include "tidemark/appender.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "location/faulty.h"
#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "shard/machine.h"
#include "shard/state.h"
#include "testing/shard_util.h"
#include "tidemark/read.h"
#include "tidemark/write.h"

namespace tidemark {
namespace {

using testing::Collection;
using testing::read_snapshot;

class AppenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    blob_ = std::make_shared<FaultyBlob>(std::make_shared<MemBlob>());
    mem_consensus_ = std::make_shared<MemConsensus>();
    consensus_ = std::make_shared<FaultyConsensus>(mem_consensus_);
    ClientOptions options;
    options.part_target_bytes = 64 << 10;
    client_ = *Client::open(Location{blob_, consensus_}, options);
    ASSERT_TRUE(client_->create_shard("s"));
    shard_ = *client_->open_shard("s");
  }

  std::shared_ptr<Appender> open(AppenderOptions options = {}) {
    auto appender = Appender::open(shard_, options);
    EXPECT_TRUE(appender) << appender.error().to_string();
    return *appender;
  }

  // Every (key, value) in the shard with its count, at its latest time.
  testing::Collection contents() {
    Frontier upper = *shard_->upper();
    if (upper == Frontier::at(0)) return {};
    return *read_snapshot(*shard_, upper.time() - 1);
  }

  static AppendRecord record(int i, std::size_t value_bytes = 8) {
    return AppendRecord{"\"k" + std::to_string(i) + "\"", std::string(value_bytes, 'v'), 1};
  }

  std::shared_ptr<FaultyBlob> blob_;
  std::shared_ptr<MemConsensus> mem_consensus_;
  std::shared_ptr<FaultyConsensus> consensus_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Shard> shard_;
};

TEST_F(AppenderTest, TokensResolveInOrderOnceDurable) {
  auto appender = open();
  AppendSender sender = appender->sender();
  std::vector<CommitToken> tokens;
  for (int i = 0; i < 2000; ++i) tokens.push_back(*sender.enqueue_with_token(record(i)));
  Time previous = 0;
  for (const CommitToken& token : tokens) {
    auto time = token.wait();
    ASSERT_TRUE(time) << time.error().to_string();
    EXPECT_GE(*time, previous);  // enqueue order is commit order
    previous = *time;
  }
  // Durable: a fresh client on the same location sees every record.
  auto fresh = *(*Client::open(client_->location()))->open_shard("s");
  auto seen = *read_snapshot(*fresh, previous);
  EXPECT_EQ(seen.size(), 2000u);
  appender->close();
  EXPECT_EQ(appender->pool()->used(), 0u);
}

TEST_F(AppenderTest, TimesAreWallClockMillisAndAboveTheUpper) {
  auto writer = *shard_->open_writer();
  std::vector<Batch> none;
  ASSERT_TRUE(writer->compare_and_append(none, Frontier::at(0), Frontier::at(5)));
  AppenderOptions options;
  options.clock = [] { return Time{3}; };  // behind the upper
  auto appender = open(options);
  AppendSender sender = appender->sender();
  auto first = *sender.enqueue_with_token(record(1));
  ASSERT_EQ(*first.wait(), 5u);
  auto second = *sender.enqueue_with_token(record(2));
  EXPECT_GT(*second.wait(), 5u);

  auto wall = open();
  AppendSender wall_sender = wall->sender();
  Time before = static_cast<Time>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count());
  auto token = *wall_sender.enqueue_with_token(record(3));
  auto time = token.wait();
  ASSERT_TRUE(time);
  EXPECT_GE(*time, before);
}

TEST_F(AppenderTest, LeasesAreReleasedBeforeTokensResolve) {
  auto appender = open();
  AppendSender sender = appender->sender();
  std::atomic<std::uint64_t> used_at_resolution{UINT64_MAX};
  auto token = *sender.enqueue_with_token(record(1, 1000));
  token.on_complete([&](const Result<Time>&) { used_at_resolution = appender->pool()->used(); });
  ASSERT_TRUE(token.wait());
  appender->flush().value();
  EXPECT_EQ(used_at_resolution.load(), 0u);
}

TEST_F(AppenderTest, ARecordsChargeCoversItsTokenToo) {
  // Held in the queue by a slow first commit, each record holds its
  // charge: key + value + the entry's overhead, + the token's state when it
  // has one (a server enqueuing tiny records with tokens held twice its
  // queue bound in uncharged token states).
  consensus_->set_config(FaultConfig{std::chrono::milliseconds(200)});
  auto appender = open();
  AppendSender sender = appender->sender();
  const AppendRecord plain = record(1, 100), tokened = record(2, 100);
  const std::uint64_t entry = plain.key.size() + plain.value.size() + kRecordOverheadBytes;
  ASSERT_TRUE(sender.enqueue(plain));
  EXPECT_EQ(appender->pool()->used(), entry);
  auto token = sender.enqueue_with_token(tokened);
  ASSERT_TRUE(token) << token.error().to_string();
  EXPECT_EQ(appender->pool()->used(), 2 * entry + kTokenOverheadBytes);
  ASSERT_TRUE(token->wait());
  appender->flush().value();
  EXPECT_EQ(appender->pool()->used(), 0u);
}

TEST_F(AppenderTest, CanaryResolvesAfterEverythingBeforeIt) {
  blob_->set_config(FaultConfig{std::chrono::milliseconds(5)});
  auto appender = open();
  AppendSender sender = appender->sender();
  for (int i = 0; i < 500; ++i) ASSERT_TRUE(sender.enqueue(record(i)));
  auto canary = *sender.canary();
  ASSERT_TRUE(canary.wait());
  EXPECT_EQ(contents().size(), 500u);
  // With nothing pending a canary resolves at once.
  EXPECT_TRUE((*sender.canary()).poll().has_value());
}

TEST_F(AppenderTest, OverdraftIsBoundedByOneCall) {
  blob_->set_config(FaultConfig{std::chrono::milliseconds(3)});
  AppenderOptions options;
  options.queue_bytes = 16 << 10;
  auto appender = open(options);
  AppendSender sender = appender->sender();
  const std::uint64_t one = 1000 + 3 + kRecordOverheadBytes;  // key "k..." is 3-6 bytes
  int full = 0;
  for (int i = 0; i < 400; ++i) {
    for (;;) {
      auto queued = sender.enqueue(record(i, 1000));
      if (queued) break;
      ASSERT_EQ(queued.error().kind, ErrorKind::kFull) << queued.error().to_string();
      ++full;
      sender.wait_for_capacity();
    }
    EXPECT_LE(appender->pool()->used(), options.queue_bytes + one + 8);
  }
  // enqueue_many: the overdraft is at most that call's records.
  std::vector<AppendRecord> five;
  for (int i = 0; i < 5; ++i) five.push_back(record(1000 + i, 1000));
  sender.wait_for_capacity();
  ASSERT_TRUE(sender.enqueue_many(five));
  EXPECT_LE(appender->pool()->used(), options.queue_bytes + 5 * (one + 8));
  ASSERT_TRUE(appender->flush());
  EXPECT_GT(full, 0) << "the queue never filled: the test proves nothing";
  EXPECT_LE(appender->stats().pool.peak_used, options.queue_bytes + 5 * (one + 8));
  EXPECT_EQ(contents().size(), 405u);
  appender->close();
  EXPECT_EQ(appender->pool()->used(), 0u);
}

TEST_F(AppenderTest, ClosedFullAndTooLarge) {
  AppenderOptions options;
  options.queue_bytes = 4096;
  auto appender = open(options);
  AppendSender sender = appender->sender();
  auto huge = sender.enqueue(record(1, 5000));
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error().kind, ErrorKind::kTooLarge);
  appender->close();
  auto closed = sender.enqueue(record(2));
  ASSERT_FALSE(closed);
  EXPECT_EQ(closed.error().kind, ErrorKind::kClosed);
  EXPECT_EQ(appender->pool()->used(), 0u);  // refused records hold nothing

  AppenderOptions counted;
  counted.queue_records = 3;
  consensus_->set_config(FaultConfig{std::chrono::milliseconds(50)});
  auto records_mode = open(counted);
  AppendSender s = records_mode->sender();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.enqueue(record(i)));
  auto full = s.enqueue(record(9));
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().kind, ErrorKind::kFull);
  // Without a copy: Full leaves the record as it was, to be offered again;
  // once queued it is moved from.
  AppendRecord kept = record(9, 64);
  const AppendRecord original = kept;
  auto full_token = s.enqueue_with_token(&kept);
  ASSERT_FALSE(full_token);
  EXPECT_EQ(full_token.error().kind, ErrorKind::kFull);
  EXPECT_EQ(kept.key, original.key);
  EXPECT_EQ(kept.value, original.value);
  s.wait_for_capacity();
  auto token = s.enqueue_with_token(&kept);
  ASSERT_TRUE(token) << token.error().to_string();
  EXPECT_TRUE(kept.value.empty());
  EXPECT_TRUE(token->wait());
  records_mode->close();
  EXPECT_EQ(records_mode->pool()->used(), 0u);
}

// Another writer moves the upper after the appender read it: its first
// commit finds a different upper and must re-time its batch.
TEST_F(AppenderTest, MismatchRetimesPendingBatches) {
  AppenderOptions options;
  options.clock = [] { return Time{0}; };
  auto appender = open(options);
  auto writer = *shard_->open_writer();
  std::vector<Batch> none;
  ASSERT_TRUE(writer->compare_and_append(none, Frontier::at(0), Frontier::at(10)));
  AppendSender sender = appender->sender();
  auto token = *sender.enqueue_with_token(record(1));
  auto time = token.wait();
  ASSERT_TRUE(time) << time.error().to_string();
  EXPECT_EQ(*time, 10u);
  EXPECT_EQ(appender->stats().mismatches, 1u);
  EXPECT_GE(appender->stats().retimed_batches, 1u);
  EXPECT_EQ(contents().size(), 1u);
}

// A second writer keeps moving the upper while the appender, its clock
// stuck below, appends: whatever the interleaving, every record lands once.
TEST_F(AppenderTest, RacingWriterNeverLosesOrDuplicates) {
  consensus_->set_config(FaultConfig{std::chrono::milliseconds(2)});
  AppenderOptions options;
  options.clock = [] { return Time{0}; };
  auto appender = open(options);
  std::atomic<bool> stop{false};
  std::atomic<int> other_records{0};
  std::thread other([&] {
    auto writer = *shard_->open_writer();
    for (int i = 0; !stop; ++i) {
      Time t = writer->upper().time();
      std::vector<Update> one{Update{"\"other" + std::to_string(i) + "\"", "1", t, 1}};
      std::vector<Batch> batches;
      batches.push_back(*writer->batch(one, Frontier::at(t), Frontier::at(t + 1)));
      if (writer->compare_and_append(batches, Frontier::at(t), Frontier::at(t + 1))) {
        ++other_records;
      }
    }
  });
  AppendSender sender = appender->sender();
  std::vector<CommitToken> tokens;
  for (int i = 0; i < 300; ++i) {
    tokens.push_back(*sender.enqueue_with_token(record(i)));
    if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (const CommitToken& token : tokens) {
    ASSERT_TRUE(token.wait()) << token.wait().error().to_string();
  }
  stop = true;
  other.join();
  auto all = contents();
  int ours = 0;
  for (const auto& [kv, diff] : all) {
    EXPECT_EQ(diff, 1) << kv.first;  // nothing appended twice
    if (kv.first.rfind("\"k", 0) == 0) ++ours;
  }
  EXPECT_EQ(ours, 300);
  EXPECT_EQ(static_cast<int>(all.size()), 300 + other_records.load());
  std::printf("racing writer: %llu mismatches, %llu batches re-timed\n",
              static_cast<unsigned long long>(appender->stats().mismatches),
              static_cast<unsigned long long>(appender->stats().retimed_batches));
}

TEST_F(AppenderTest, BailPolicyFailsTokensInsteadOfRetrying) {
  AppenderOptions options;
  options.clock = [] { return Time{0}; };
  options.on_mismatch = MismatchPolicy::kBail;
  // The appender opens its writer (upper 0); then another writer moves the
  // shard, so the appender's first commit finds a different upper.
  auto appender = open(options);
  auto writer = *shard_->open_writer();
  std::vector<Batch> none;
  ASSERT_TRUE(writer->compare_and_append(none, Frontier::at(0), Frontier::at(10)));
  AppendSender sender = appender->sender();
  auto token = *sender.enqueue_with_token(record(1));
  auto result = token.wait();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().kind, ErrorKind::kUpperMismatch);
  EXPECT_NE(result.error().message.find("bail"), std::string::npos);
  EXPECT_TRUE(contents().empty());
  // The appender goes on: its next batch is timed at the new upper.
  auto next = *sender.enqueue_with_token(record(2));
  EXPECT_TRUE(next.wait());
  EXPECT_EQ(contents().size(), 1u);
  appender->close();
  EXPECT_EQ(appender->pool()->used(), 0u);
}

// Faults on blob and consensus calls, retried: each record commits once.
// Waiting on every tenth token makes at least fifty commits, so faults land
// whatever the timing. With inline parts (the default) a small commit
// writes no blob, so its faults come from consensus; with blob parts only,
// the part writes fail too.
TEST_F(AppenderTest, InjectedFaultsAreRetriedAndCommitExactlyOnce) {
  for (bool inline_parts : {true, false}) {
    SCOPED_TRACE(inline_parts ? "inline parts" : "blob parts only");
    if (!inline_parts) {
      SetUp();  // a fresh location, opened with blob parts only
      ClientOptions options;
      options.part_target_bytes = 64 << 10;
      options.inline_part_max_bytes = 0;
      client_ = *Client::open(Location{blob_, consensus_}, options);
      shard_ = *client_->open_shard("s");
    }
    FaultConfig faults;
    faults.determinate_rate = 0.15;
    faults.indeterminate_rate = 0.15;
    faults.seed = 11;
    blob_->set_config(faults);
    faults.seed = 12;
    consensus_->set_config(faults);
    AppenderOptions options;
    options.retry.max_attempts = 51;
    auto appender = open(options);
    AppendSender sender = appender->sender();
    std::vector<CommitToken> tokens;
    for (int i = 0; i < 500; ++i) {
      tokens.push_back(*sender.enqueue_with_token(record(i)));
      if (i % 10 == 9) {
        ASSERT_TRUE(tokens.back().wait()) << tokens.back().wait().error().to_string();
      }
    }
    for (const CommitToken& token : tokens)
      ASSERT_TRUE(token.wait()) << token.wait().error().to_string();
    blob_->set_config({});
    consensus_->set_config({});
    EXPECT_GT(consensus_->injected_determinate() + consensus_->injected_indeterminate(), 0u);
    if (!inline_parts) {
      EXPECT_GT(blob_->injected_determinate() + blob_->injected_indeterminate(), 0u);
    }
    auto all = contents();
    ASSERT_EQ(all.size(), 500u);
    for (const auto& [kv, diff] : all) EXPECT_EQ(diff, 1) << kv.first;
    appender->close();
    EXPECT_EQ(appender->pool()->used(), 0u);
  }
}

// Issue 19: a batch of up to kEncodeHereMaxBytes is encoded on the
// builder's thread, and only a part too large to travel inline goes to the
// batch builds pool to be written (BatchBuilder::finish_inline, then
// finish()). Groups of 40 records of 300 bytes that do not compress make
// batches of about 12 KB, none inline: each is stored by the pool, through
// injected blob failures, and every record commits exactly once.
TEST_F(AppenderTest, BatchesEncodedOnTheBuildersThreadAreStoredByThePool) {
  FaultConfig faults;
  faults.determinate_rate = 0.2;
  faults.seed = 5;
  blob_->set_config(faults);
  AppenderOptions options;
  options.retry.max_attempts = 51;
  auto appender = open(options);
  AppendSender sender = appender->sender();
  std::uint32_t x = 99;
  std::vector<CommitToken> tokens;
  for (int group = 0; group < 10; ++group) {
    std::vector<AppendRecord> records;
    for (int i = 0; i < 40; ++i) {
      std::string value(300, ' ');
      for (char& c : value) {  // bytes at random: incompressible
        x = x * 1103515245u + 12345u;
        c = static_cast<char>('a' + (x >> 24) % 26);
      }
      records.push_back(AppendRecord{"\"g" + std::to_string(group * 40 + i) + "\"", value, 1});
    }
    auto token = sender.enqueue_group(records);
    ASSERT_TRUE(token) << token.error().to_string();
    tokens.push_back(*token);
  }
  for (const CommitToken& token : tokens) {
    ASSERT_TRUE(token.wait()) << token.wait().error().to_string();
  }
  blob_->set_config({});
  EXPECT_GT(blob_->injected_determinate(), 0u) << "the pool's writes met no failure";
  std::size_t objects = 0;
  ASSERT_TRUE(
      blob_->list(shard_part_prefix("s"), [&](std::string_view, std::uint64_t) { ++objects; }));
  EXPECT_GT(objects, 0u) << "parts too large for inline are written to the blob store";
  auto all = contents();
  ASSERT_EQ(all.size(), 400u);
  for (const auto& [kv, diff] : all) EXPECT_EQ(diff, 1) << kv.first;
  appender->close();
  EXPECT_EQ(appender->pool()->used(), 0u);
}

TEST_F(AppenderTest, FatalErrorFailsEveryPendingTokenAndCloses) {
  AppenderOptions options;
  options.retry.max_attempts = 3;
  auto appender = open(options);
  EXPECT_EQ(appender->failure(), std::nullopt);
  FaultConfig broken;
  broken.determinate_rate = 1.0;
  consensus_->set_config(broken);
  AppendSender sender = appender->sender();
  std::vector<CommitToken> tokens;
  for (int i = 0; i < 50; ++i) {
    auto token = sender.enqueue_with_token(record(i));
    if (!token) break;  // closed already: also fine
    tokens.push_back(*token);
  }
  ASSERT_FALSE(tokens.empty());
  for (const CommitToken& token : tokens) {
    auto result = token.wait();
    ASSERT_FALSE(result);
    EXPECT_EQ(result.error().kind, ErrorKind::kClosed);
    EXPECT_NE(result.error().message.find("injected"), std::string::npos);
  }
  auto after = sender.enqueue(record(99));
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().kind, ErrorKind::kClosed);
  // The error that stopped it, for whoever must decide to open a new one.
  auto failure = appender->failure();
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind, ErrorKind::kDeterminate) << failure->to_string();
  EXPECT_NE(failure->message.find("injected"), std::string::npos);
  EXPECT_FALSE(appender->flush());
  consensus_->set_config({});
  EXPECT_TRUE(contents().empty());  // nothing reported committed was, nor the reverse
  appender->close();
  EXPECT_EQ(appender->pool()->used(), 0u);
}

TEST_F(AppenderTest, BatchedAppendsCommitManyBatchesPerCall) {
  // A slow commit (150 ms) leaves the builder time to upload every other
  // batch meanwhile, even under a sanitizer.
  consensus_->set_config(FaultConfig{std::chrono::milliseconds(150)});
  for (bool batched : {true, false}) {
    AppenderOptions options;
    options.batch_appends = batched;
    options.batch_max_records = 20;  // ten small batches
    auto appender = open(options);
    AppendSender sender = appender->sender();
    for (int i = 0; i < 200; ++i) ASSERT_TRUE(sender.enqueue(record(i)));
    ASSERT_TRUE(appender->flush());
    AppenderStats stats = appender->stats();
    EXPECT_EQ(stats.records_committed, 200u);
    EXPECT_GE(stats.batches_committed, 10u);  // more when a batch is cut before 20 arrive
    if (batched) {
      EXPECT_LT(stats.commits, stats.batches_committed);
    } else {
      EXPECT_EQ(stats.commits, stats.batches_committed);
    }
    appender->close();
  }
}

// Each record's commit latency runs from its enqueue to its commit being
// durable, a commit call's from its compare_and_append to that call's
// return. Neither has a sample before a commit; after, one per record and
// one per commit, at least what the consensus store makes a commit wait
// and below what the whole test took.
TEST_F(AppenderTest, StatsReportEachRecordsCommitLatency) {
  using std::chrono::microseconds;
  constexpr auto kConsensus = std::chrono::milliseconds(20);  // each consensus call
  const auto started = std::chrono::steady_clock::now();
  consensus_->set_config(FaultConfig{kConsensus});
  auto appender = open();
  AppendSender sender = appender->sender();
  const AppenderStats before = appender->stats();
  for (const AppenderLatency& latency : {before.commit_latency, before.commit_call}) {
    EXPECT_EQ(latency.count, 0u);
    EXPECT_EQ(latency.sum_micros, 0u);
    EXPECT_EQ(latency.recent, 0u);
    EXPECT_EQ(latency.p50_micros, 0u);
    EXPECT_EQ(latency.p99_micros, 0u);
  }
  // The first record is cut and committing alone when the other 99 come:
  // they wait for its commit, then for their own.
  auto first = sender.enqueue_with_token(record(0));
  ASSERT_TRUE(first);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (int i = 1; i < 100; ++i) ASSERT_TRUE(sender.enqueue(record(i)));
  ASSERT_TRUE(appender->flush());
  const auto took =
      std::chrono::duration_cast<microseconds>(std::chrono::steady_clock::now() - started);
  const AppenderStats after = appender->stats();
  EXPECT_EQ(after.records_committed, 100u);
  EXPECT_GE(after.commits, 2u);
  EXPECT_EQ(after.commit_latency.count, after.records_committed);
  EXPECT_EQ(after.commit_call.count, after.commits);
  for (const AppenderLatency& latency : {after.commit_latency, after.commit_call}) {
    EXPECT_EQ(latency.recent, latency.count);
    // Quantiles are within 1/16 of a true sample; every sample is at least
    // one consensus call.
    EXPECT_GE(latency.p50_micros, microseconds(kConsensus).count() / 16 * 15);
    EXPECT_LE(latency.p50_micros, latency.p99_micros);
    EXPECT_LE(latency.p99_micros, took.count());
    EXPECT_GE(latency.sum_micros, latency.count * microseconds(kConsensus).count());
    EXPECT_LE(latency.sum_micros, latency.count * took.count());
  }
  // Most records waited for two commits: the wait counts from the enqueue.
  EXPECT_GE(after.commit_latency.p50_micros, microseconds(kConsensus).count() * 3 / 2);
}

TEST_F(AppenderTest, BusyAppenderLingersIdleOneCutsAtOnce) {
  // Each part upload and each consensus call takes 100 ms (a small batch's
  // part travels inline, in its commit). The first record finds the
  // appender idle and is cut at once; the 25 that follow while it is in
  // flight make full batches of 10 at once and leave 5, which wait (a
  // linger longer than the test) until the appender is idle again: 4
  // batches in all. Cutting whenever there was room (the old way) made a
  // batch of nearly each.
  blob_->set_config(FaultConfig{std::chrono::milliseconds(100)});
  consensus_->set_config(FaultConfig{std::chrono::milliseconds(100)});
  AppenderOptions options;
  options.batch_max_records = 10;
  options.batch_linger = std::chrono::minutes(10);
  auto appender = open(options);
  AppendSender sender = appender->sender();
  const auto started = std::chrono::steady_clock::now();
  auto first = sender.enqueue_with_token(record(0));
  ASSERT_TRUE(first);
  // Time for the builder to wake and cut it (its upload takes 100 ms).
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  std::vector<CommitToken> tokens;
  for (int i = 1; i <= 25; ++i) tokens.push_back(*sender.enqueue_with_token(record(i)));
  ASSERT_TRUE(first->wait());
  for (const CommitToken& token : tokens) ASSERT_TRUE(token.wait());
  // Everything was enqueued well before the first upload ended.
  ASSERT_LT(std::chrono::steady_clock::now() - started, std::chrono::minutes(1));
  AppenderStats stats = appender->stats();
  EXPECT_EQ(stats.records_committed, 26u);
  EXPECT_EQ(stats.batches_committed, 4u);
  EXPECT_EQ(contents().size(), 26u);
}

TEST_F(AppenderTest, ManySendersFromManyThreads) {
  auto appender = open();
  std::vector<std::thread> producers;
  std::atomic<int> ok{0};
  for (int p = 0; p < 8; ++p) {
    producers.emplace_back([&, p] {
      AppendSender sender = appender->sender();
      for (int i = 0; i < 100; ++i) {
        auto token = sender.enqueue_with_token(record(p * 1000 + i));
        if (token && token->wait()) ++ok;
      }
    });
  }
  for (auto& t : producers) t.join();
  EXPECT_EQ(ok.load(), 800);
  EXPECT_EQ(contents().size(), 800u);
}

// --- Idempotent producers ----------------------------------------------------

// Sends records [from, to) of `producer` through `appender`; the tokens.
std::vector<CommitToken> send(Appender& appender, const std::string& producer, int from, int to,
                              std::uint64_t* duplicates = nullptr, bool flush = true) {
  AppendSender sender = *appender.sender(producer, static_cast<std::uint64_t>(from));
  std::vector<CommitToken> tokens;
  for (int i = from; i < to; ++i) {
    AppendRecord r{"\"" + producer + "-" + std::to_string(i) + "\"", "1", 1};
    for (;;) {
      auto token = sender.enqueue_with_token(&r);
      if (token) {
        tokens.push_back(*token);
        break;
      }
      EXPECT_TRUE(token.error().is(ErrorKind::kFull)) << token.error().to_string();
      sender.wait_for_capacity();
    }
  }
  if (flush) (void)appender.flush();  // the tokens say how each record ended
  if (duplicates) *duplicates = sender.duplicates();
  return tokens;
}

TEST_F(AppenderTest, AProducersRetryCommitsEachRecordOnce) {
  auto first = open();
  for (const CommitToken& t : send(*first, "p", 0, 300)) ASSERT_TRUE(t.wait());
  first->close();
  ASSERT_EQ(shard_->lookup_producer("p")->producer->sequence, 299u);
  // A retry of records 200..500 (its first try committed 200..299, say, and
  // its answer was lost) from another process: 100 duplicates.
  auto retry_client = *Client::open(client_->location(), client_->options());
  auto retry_shard = *retry_client->open_shard("s");
  auto second = *Appender::open(retry_shard);
  std::uint64_t duplicates = 0;
  auto tokens = send(*second, "p", 200, 500, &duplicates);
  for (const CommitToken& t : tokens) ASSERT_TRUE(t.wait()) << t.wait().error().to_string();
  EXPECT_EQ(duplicates, 100u);
  EXPECT_EQ(second->stats().duplicates, 100u);
  auto seen = contents();
  EXPECT_EQ(seen.size(), 500u);
  for (const auto& [kv, diff] : seen) EXPECT_EQ(diff, 1) << kv.first;
  EXPECT_EQ(shard_->lookup_producer("p")->producer->sequence, 499u);
}

// Two processes commit the same producer's records at once (a client's
// retry on another server while the first is still committing): each
// record once, whichever wins, and every token resolves.
TEST_F(AppenderTest, RacingRetriesOfOneProducerCommitEachRecordOnce) {
  AppenderOptions options;
  options.batch_max_records = 37;  // many commits, so they interleave
  std::vector<std::shared_ptr<Appender>> appenders;
  for (int i = 0; i < 2; ++i) {
    auto client = *Client::open(client_->location(), client_->options());
    appenders.push_back(*Appender::open(*client->open_shard("s"), options));
  }
  std::uint64_t duplicates[2] = {0, 0};
  std::thread a([&] {
    for (const CommitToken& t : send(*appenders[0], "p", 0, 2000, &duplicates[0])) {
      EXPECT_TRUE(t.wait());
    }
  });
  std::thread b([&] {
    for (const CommitToken& t : send(*appenders[1], "p", 0, 2000, &duplicates[1])) {
      EXPECT_TRUE(t.wait());
    }
  });
  a.join();
  b.join();
  auto seen = contents();
  EXPECT_EQ(seen.size(), 2000u);
  for (const auto& [kv, diff] : seen) ASSERT_EQ(diff, 1) << kv.first << " committed twice";
  EXPECT_EQ(duplicates[0] + duplicates[1], 2000u) << "each record committed by one of the two";
}

// A Consensus whose compare_and_sets wait at a gate, so that a test knows
// which commit is under way: the test lets them through one at a time, or
// fails them.
class GatedConsensus : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;

  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    {
      std::unique_lock lock(mu_);
      ++waiting_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !closed_ || passes_ > 0 || failing_; });
      --waiting_;
      if (failing_) return determinate("gated consensus: failed by the test");
      if (closed_) --passes_;
    }
    return ForwardingConsensus::compare_and_set(key, expected, std::move(next));
  }

  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  // Waits until a compare_and_set waits at the gate.
  void wait_for_one() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return waiting_ > 0; });
  }
  void let_one_through() {
    std::lock_guard lock(mu_);
    ++passes_;
    cv_.notify_all();
  }
  void open() {
    std::lock_guard lock(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  void fail_all() {
    std::lock_guard lock(mu_);
    failing_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;       // guarded by mu_
  int passes_ = 0;        // guarded by mu_
  bool closed_ = false;   // guarded by mu_
  bool failing_ = false;  // guarded by mu_
};

// A client that retried a request on the same server while its first try
// still waited in the appender (the server paused, or its commits stalled)
// has the same records queued twice. The second copy commits nothing of
// its own, and it is answered only when the first copy is: committed or
// failed. (It used to be settled as a duplicate at once, before the first
// copy committed: an acknowledgement of records that might never commit.)
class AppenderCopiesTest : public AppenderTest {
 protected:
  // Queues a record whose commit waits at the gate, then both copies of
  // producer p's records 0..2: they wait behind it in one batch (the
  // builder lingers while a commit is under way). Returns once the busy
  // record is committed and the copies' commit waits at the gate.
  void queue_copies_behind_a_commit() {
    gate_ = std::make_shared<GatedConsensus>(mem_consensus_);
    ClientOptions client_options = client_->options();
    client_options.background_compaction = false;  // no other commits
    client_ = *Client::open(Location{blob_, gate_}, client_options);
    auto shard = *client_->open_shard("s");
    AppenderOptions options;
    options.batch_linger = std::chrono::milliseconds(200);
    options.retry.max_attempts = 2;
    appender_ = *Appender::open(shard, options);
    plain_.emplace(appender_->sender());
    gate_->close();
    CommitToken busy = *plain_->enqueue_with_token(record(0));
    gate_->wait_for_one();
    first_.emplace(*appender_->sender("p", 0));
    second_.emplace(*appender_->sender("p", 0));
    for (auto* sender : {&*first_, &*second_}) {
      auto& tokens = sender == &*first_ ? first_tokens_ : second_tokens_;
      for (int i = 0; i < 3; ++i) {
        AppendRecord r{"\"p-" + std::to_string(i) + "\"", "1", 1};
        tokens.push_back(*sender->enqueue_with_token(&r));
      }
    }
    // Whenever a second copy resolves, its first copy must have already.
    for (std::size_t i = 0; i < second_tokens_.size(); ++i) {
      second_tokens_[i].on_complete([this, i](const Result<Time>&) {
        if (!first_tokens_[i].poll()) ++answered_early_;
      });
    }
    gate_->let_one_through();
    ASSERT_TRUE(busy.wait());
    gate_->wait_for_one();
    for (const CommitToken& t : second_tokens_) {
      EXPECT_FALSE(t.poll()) << "a copy was answered before its records were committed";
    }
  }

  // The tokens (and the count their callbacks update) are declared first,
  // so they outlive the appender, whose committer thread may still run
  // those callbacks while the test is torn down.
  std::vector<CommitToken> first_tokens_, second_tokens_;
  std::atomic<int> answered_early_{0};
  std::shared_ptr<GatedConsensus> gate_;
  std::shared_ptr<Appender> appender_;
  std::optional<AppendSender> plain_, first_, second_;
};

TEST_F(AppenderCopiesTest, ASecondCopyResolvesWithTheFirstOnceCommitted) {
  queue_copies_behind_a_commit();
  gate_->open();
  for (std::size_t i = 0; i < 3; ++i) {
    auto first = first_tokens_[i].wait();
    auto second = second_tokens_[i].wait();
    ASSERT_TRUE(first) << first.error().to_string();
    ASSERT_TRUE(second) << second.error().to_string();
    EXPECT_EQ(*first, *second) << "both copies answer the commit's time";
  }
  EXPECT_EQ(answered_early_.load(), 0) << "a copy was answered before the records committed";
  EXPECT_EQ(second_->duplicates(), 3u);
  EXPECT_EQ(first_->duplicates(), 0u);
  auto seen = contents();
  EXPECT_EQ(seen.size(), 4u);
  for (const auto& [kv, diff] : seen) EXPECT_EQ(diff, 1) << kv.first;
  EXPECT_EQ(shard_->lookup_producer("p", true)->producer->sequence, 2u);
}

TEST_F(AppenderCopiesTest, ASecondCopyFailsWithTheFirstWhenTheCommitFails) {
  queue_copies_behind_a_commit();
  gate_->fail_all();  // the copies' commit, and its retry
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(first_tokens_[i].wait());
    auto second = second_tokens_[i].wait();
    EXPECT_FALSE(second) << "record " << i
                         << " of the second copy was acknowledged, but never committed";
  }
  EXPECT_EQ(answered_early_.load(), 0);
  EXPECT_FALSE(shard_->lookup_producer("p", true)->producer.has_value());
}

TEST_F(AppenderTest, AProducerCannotSkipNumbersOrOverflowTheTable) {
  ClientOptions options = client_->options();
  options.max_producers = 2;
  auto client = *Client::open(client_->location(), options);
  auto shard = *client->open_shard("s");
  auto appender = *Appender::open(shard);
  for (const CommitToken& t : send(*appender, "a", 0, 5)) ASSERT_TRUE(t.wait());
  // A gap: the shard expects 5.
  auto gap = send(*appender, "a", 7, 8);
  ASSERT_EQ(gap.size(), 1u);
  auto outcome = gap[0].wait();
  ASSERT_FALSE(outcome);
  EXPECT_EQ(outcome.error().kind, ErrorKind::kSequenceMismatch);
  EXPECT_NE(outcome.error().message.find("expects 5"), std::string::npos)
      << outcome.error().message;
  // A new producer must start at 0.
  EXPECT_FALSE(send(*appender, "b", 3, 4)[0].wait());
  for (const CommitToken& t : send(*appender, "b", 0, 2)) ASSERT_TRUE(t.wait());
  // A third producer is one too many.
  auto third = send(*appender, "c", 0, 1)[0].wait();
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().kind, ErrorKind::kFull);
  // Nothing of the refused records was appended, and the appender goes on.
  EXPECT_EQ(contents().size(), 7u);
  EXPECT_FALSE(appender->failure());
  for (const CommitToken& t : send(*appender, "a", 5, 6)) ASSERT_TRUE(t.wait());
}

TEST_F(AppenderTest, AGroupIsCommittedWholeByOneCommit) {
  AppenderOptions options;
  options.batch_max_records = 10;  // groups are far larger than a batch
  auto appender = open(options);
  AppendSender sender = appender->sender();
  std::vector<CommitToken> tokens;
  for (int g = 0; g < 20; ++g) {
    std::vector<AppendRecord> group;
    for (int i = 0; i < 55; ++i) group.push_back(record(g * 1000 + i));
    tokens.push_back(*sender.enqueue_group(group));
  }
  std::set<Time> times;
  for (const CommitToken& t : tokens) {
    auto time = t.wait();
    ASSERT_TRUE(time);
    times.insert(*time);
  }
  EXPECT_EQ(contents().size(), 20u * 55);
  // No batch ended inside a group: the records at each time are whole
  // groups.
  for (Time t : times) {
    auto rows = *read_snapshot(*shard_, t);
    Collection before = t == 0 ? Collection{} : *read_snapshot(*shard_, t - 1);
    EXPECT_EQ((rows.size() - before.size()) % 55, 0u) << "a group split at time " << t;
  }
  // A producer's sender does not take groups.
  auto producer = *appender->sender("p", 0);
  std::vector<AppendRecord> group{record(1)};
  EXPECT_EQ(producer.enqueue_group(group).error().kind, ErrorKind::kInvalidUsage);
}

TEST_F(AppenderTest, EachCommitIsOneOrderedBatchOrAFewLooseParts) {
  // Small parts: a group of 3,000 records is far more parts than a read
  // should merge at once, and small batches are a part each. A slow commit
  // leaves the builder time to upload many batches meanwhile.
  ClientOptions small;
  small.part_target_bytes = 2048;
  small.block_bytes = 512;
  small.background_compaction = false;
  auto client = *Client::open(Location{blob_, consensus_}, small);
  ASSERT_TRUE(client->create_shard("many"));
  auto shard = *client->open_shard("many");
  consensus_->set_config(FaultConfig{std::chrono::milliseconds(100)});
  AppenderOptions options;
  options.batch_max_records = 5;
  auto opened = Appender::open(shard, options);
  ASSERT_TRUE(opened) << opened.error().to_string();
  auto appender = *opened;
  AppendSender sender = appender->sender();
  std::vector<CommitToken> tokens;
  for (int round = 0; round < 3; ++round) {
    std::vector<AppendRecord> group;
    for (int i = 0; i < 3000; ++i) group.push_back(record(round * 100000 + i, 100));
    tokens.push_back(*sender.enqueue_group(group));
    for (int i = 0; i < 400; ++i) {
      tokens.push_back(*sender.enqueue_with_token(record(round * 100000 + 50000 + i, 300)));
    }
  }
  for (const CommitToken& t : tokens) ASSERT_TRUE(t.wait());
  const AppenderStats stats = appender->stats();
  EXPECT_LT(stats.commits, stats.batches_committed) << "the test wants batched commits";
  appender->close();
  auto state = ShardMachine("many", consensus_, blob_).fetch();
  ASSERT_TRUE(state) << state.error().to_string();
  std::size_t ordered = 0, most_loose = 0;
  for (const HollowBatch& batch : (*state)->batches) {
    if (batch.ordered) {
      ++ordered;
    } else {
      most_loose = std::max(most_loose, batch.parts.get().size());
    }
  }
  EXPECT_EQ(ordered, 3u) << "each group's batch commits alone, as one run";
  EXPECT_LE(most_loose, BatchBuilder::kMaxLooseParts);
  EXPECT_GT(most_loose, 1u) << "the test wants several small batches in one commit";
  const Frontier upper = *shard->upper();
  EXPECT_EQ(read_snapshot(*shard, upper.time() - 1)->size(), 3u * 3400);
}

// --- Leases that expire while a process is cut off ---------------------------

// Cut off from consensus past its lease (another process drops it
// meanwhile), a writer registers anew: the append that found it gone fails
// once with LeaseExpired, then appends go on. An appender rides it out.
TEST_F(AppenderTest, HandlesWhoseLeaseExpiredRegisterAgain) {
  ClientOptions options = client_->options();
  options.writer_lease = std::chrono::milliseconds(300);
  options.background_compaction = false;
  auto cut_off_client = *Client::open(client_->location(), options);
  auto shard = *cut_off_client->open_shard("s");
  auto writer = *shard->open_writer();
  const std::string first_id = writer->writer_id();
  AppenderOptions appender_options;  // retries outlast the cut
  appender_options.retry = RetryPolicy{std::chrono::milliseconds(10),
                                       std::chrono::milliseconds(100), 0, std::chrono::seconds(20)};
  auto appender = *Appender::open(shard, appender_options);
  for (const CommitToken& t : send(*appender, "p", 0, 10)) ASSERT_TRUE(t.wait());

  // The cut: every consensus call fails for a second. Another process
  // (healthy) drops the expired writers meanwhile.
  consensus_->set_config(FaultConfig{.determinate_rate = 1});
  auto other_client = *Client::open(Location{blob_, mem_consensus_}, options);
  auto other = *other_client->open_shard("s");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_TRUE(other->collect_garbage()) << "expires the cut-off writers";
  // Records sent during the cut wait in the appender, a batch is built.
  auto pending = send(*appender, "p", 10, 20, nullptr, /*flush=*/false);
  const Time at = *other->upper() == Frontier::at(0) ? 0 : other->upper()->time();
  std::vector<Batch> batches;
  const std::vector<Update> early{Update{"\"explicit\"", "1", at, 1}};
  batches.push_back(*writer->batch(early, Frontier::at(at), Frontier::at(at + 1)));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  consensus_->set_config(FaultConfig{});

  // The explicit append built under the lost writer fails once, clearly...
  auto lost = writer->compare_and_append(batches, Frontier::at(at), Frontier::at(at + 1));
  Frontier upper = *shard->upper();
  if (!lost) {
    EXPECT_TRUE(lost.error().is(ErrorKind::kLeaseExpired) ||
                lost.error().is(ErrorKind::kUpperMismatch))
        << lost.error().to_string();
  }
  EXPECT_NE(writer->writer_id(), first_id) << "the handle registered a new writer";
  // ...and a batch built again appends.
  batches.clear();
  const Time now = upper.time();
  const std::vector<Update> later{Update{"\"explicit\"", "1", now, 1}};
  batches.push_back(*writer->batch(later, Frontier::at(now), Frontier::at(now + 1)));
  ASSERT_TRUE(writer->compare_and_append(batches, Frontier::at(now), Frontier::at(now + 1)));
  // The appender committed what was sent during the cut.
  for (const CommitToken& t : pending) ASSERT_TRUE(t.wait()) << t.wait().error().to_string();
  for (const CommitToken& t : send(*appender, "p", 20, 30)) ASSERT_TRUE(t.wait());
  EXPECT_FALSE(appender->failure());
  auto seen = contents();
  EXPECT_EQ(seen.size(), 31u);
  for (const auto& [kv, diff] : seen) EXPECT_EQ(diff, 1) << kv.first;
}

// A Consensus that applies the next compare_and_set it is armed for and
// answers it Indeterminate (an answer lost on the way back), then fails
// every call (Determinate) until healed: a commit that landed, seen from a
// process cut off right after.
class LandThenCutConsensus : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;

  Result<std::optional<VersionedData>> head(std::string_view key) override {
    if (cut_) return determinate("cut off by the test");
    return ForwardingConsensus::head(key);
  }
  Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                          std::size_t limit) override {
    if (cut_) return determinate("cut off by the test");
    return ForwardingConsensus::scan(key, from, limit);
  }
  Result<std::size_t> truncate(std::string_view key, SeqNo seqno) override {
    if (cut_) return determinate("cut off by the test");
    return ForwardingConsensus::truncate(key, seqno);
  }
  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    if (cut_) return determinate("cut off by the test");
    auto outcome = ForwardingConsensus::compare_and_set(key, expected, std::move(next));
    if (armed_.exchange(false) && outcome && *outcome == CasOutcome::kCommitted) {
      cut_ = true;
      landed_ = true;
      return indeterminate("the answer was lost (the test)");
    }
    return outcome;
  }

  void arm() { armed_ = true; }
  bool landed() const { return landed_; }
  void heal() { cut_ = false; }

 private:
  std::atomic<bool> armed_{false};
  std::atomic<bool> cut_{false};
  std::atomic<bool> landed_{false};
};

// Found by the nemesis: a commit that landed but was answered
// Indeterminate, then determinate failures while the process stayed cut
// off past its lease, then LeaseExpired. The writer's record of its last
// token went with the lease, so nothing can tell whether the records
// landed: those without a producer fail Indeterminate, and are never
// committed a second time (they were, under a new writer, when a
// determinate failure had made the appender forget the first attempt).
TEST_F(AppenderTest, RecordsThatMayHaveLandedAreNotCommittedAgainUnderANewWriter) {
  auto cut = std::make_shared<LandThenCutConsensus>(mem_consensus_);
  ClientOptions options = client_->options();
  options.writer_lease = std::chrono::milliseconds(300);
  options.background_compaction = false;
  auto cut_client = *Client::open(Location{blob_, cut}, options);
  auto shard = *cut_client->open_shard("s");
  AppenderOptions appender_options;  // retries outlast the cut
  appender_options.retry = RetryPolicy{std::chrono::milliseconds(10),
                                       std::chrono::milliseconds(100), 0, std::chrono::seconds(20)};
  auto appender = *Appender::open(shard, appender_options);
  AppendSender sender = appender->sender();
  ASSERT_TRUE(sender.enqueue_with_token(record(0))->wait());

  cut->arm();
  CommitToken token = *sender.enqueue_with_token(record(1));
  while (!cut->landed()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Cut off past the lease; a healthy process drops the expired writer.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto other = *(*Client::open(Location{blob_, mem_consensus_}, options))->open_shard("s");
  ASSERT_TRUE(other->collect_garbage()) << "expires the cut-off writer";
  cut->heal();

  auto outcome = token.wait();
  ASSERT_FALSE(outcome) << "answered committed at " << *outcome
                        << ": nothing can tell, so it may not say so";
  EXPECT_TRUE(outcome.error().is(ErrorKind::kIndeterminate)) << outcome.error().to_string();
  // It landed once, and only once.
  auto seen = contents();
  EXPECT_EQ(seen.size(), 2u);
  for (const auto& [kv, diff] : seen) EXPECT_EQ(diff, 1) << kv.first << " committed twice";
  // The appender goes on.
  ASSERT_TRUE(sender.enqueue_with_token(record(2))->wait());
  EXPECT_EQ(contents().size(), 3u);
}

// The same for an explicit writer: retried under its token after its
// writer was replaced, an append that landed is not called a mismatch
// (the new writer has no record of the token, and the upper moved).
TEST_F(AppenderTest, AnExplicitRetryWhoseWriterWasReplacedStaysInDoubt) {
  auto cut = std::make_shared<LandThenCutConsensus>(mem_consensus_);
  ClientOptions options = client_->options();
  options.writer_lease = std::chrono::milliseconds(300);
  options.background_compaction = false;
  options.write_retry.max_attempts = 1;
  auto cut_client = *Client::open(Location{blob_, cut}, options);
  auto shard = *cut_client->open_shard("s");
  auto writer = *shard->open_writer();
  const std::string first_id = writer->writer_id();
  std::vector<Batch> batches;
  const std::vector<Update> updates{Update{"\"explicit\"", "1", 0, 1}};
  batches.push_back(*writer->batch(updates, Frontier::at(0), Frontier::at(1)));

  cut->arm();
  auto first = writer->compare_and_append(batches, Frontier::at(0), Frontier::at(1), "t");
  ASSERT_FALSE(first);
  ASSERT_TRUE(first.error().is(ErrorKind::kIndeterminate)) << first.error().to_string();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto other = *(*Client::open(Location{blob_, mem_consensus_}, options))->open_shard("s");
  ASSERT_TRUE(other->collect_garbage()) << "expires the cut-off writer";
  cut->heal();
  for (int i = 0; i < 200 && writer->writer_id() == first_id; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(writer->writer_id(), first_id) << "the heartbeat registered a new writer";

  auto again = writer->compare_and_append(batches, Frontier::at(0), Frontier::at(1), "t");
  ASSERT_FALSE(again) << "the first attempt landed; nothing may append it twice";
  EXPECT_TRUE(again.error().is(ErrorKind::kIndeterminate)) << again.error().to_string();
  EXPECT_EQ(contents().size(), 1u);
}

// Forwards every call and watches one thread's compare_and_set calls: it
// counts them and can hold the next at a gate, or fail it (after making it,
// for an indeterminate failure). Remembers which threads made the calls
// that succeeded.
class WatchedConsensus final : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;
  enum class Fault : std::uint8_t { kNone, kDeterminate, kIndeterminateApplied };

  // Watches the calling thread from now on.
  void watch_this_thread(bool hold, Fault fault = Fault::kNone) {
    std::lock_guard lock(mu_);
    watched_ = std::this_thread::get_id();
    hold_ = hold;
    fault_ = fault;
  }
  // Waits until the watched thread is held at the gate.
  void wait_until_held() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return held_; });
  }
  void release() {
    std::lock_guard lock(mu_);
    hold_ = false;
    cv_.notify_all();
  }
  int watched_calls() const {
    std::lock_guard lock(mu_);
    return watched_calls_;
  }
  // Calls that succeeded on `thread`.
  int succeeded_on(std::thread::id thread) const {
    std::lock_guard lock(mu_);
    return static_cast<int>(std::count(succeeded_on_.begin(), succeeded_on_.end(), thread));
  }
  std::vector<std::thread::id> succeeded_on() const {
    std::lock_guard lock(mu_);
    return succeeded_on_;
  }

  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    Fault fault = Fault::kNone;
    {
      std::unique_lock lock(mu_);
      if (std::this_thread::get_id() == watched_) {
        ++watched_calls_;
        held_ = hold_;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !hold_; });
        held_ = false;
        fault = std::exchange(fault_, Fault::kNone);
      }
    }
    if (fault == Fault::kDeterminate) {
      return make_error(ErrorKind::kDeterminate, "injected: the write was refused");
    }
    auto outcome = ForwardingConsensus::compare_and_set(key, expected, std::move(next));
    if (fault == Fault::kIndeterminateApplied) {
      return make_error(ErrorKind::kIndeterminate, "injected: the write was made, the answer lost");
    }
    if (outcome && *outcome == CasOutcome::kCommitted) {
      std::lock_guard lock(mu_);
      succeeded_on_.push_back(std::this_thread::get_id());
    }
    return outcome;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread::id watched_;
  bool hold_ = false;
  bool held_ = false;
  Fault fault_ = Fault::kNone;
  int watched_calls_ = 0;
  std::vector<std::thread::id> succeeded_on_;
};

class AppenderCommitHereTest : public AppenderTest {
 protected:
  void SetUp() override {
    AppenderTest::SetUp();
    watched_ = std::make_shared<WatchedConsensus>(mem_consensus_);
    // One consensus call per commit attempt of the appender (no retries
    // inside the write handle), so a test can tell the attempts apart.
    ClientOptions options;
    options.write_retry.max_attempts = 1;
    client_ = *Client::open(Location{blob_, watched_}, options);
    shard_ = *client_->open_shard("s");
  }

  std::shared_ptr<WatchedConsensus> watched_;
};

// An idle appender's commit is made by the sender's own thread, inside the
// enqueue; without commit here, by a pool thread.
TEST_F(AppenderCommitHereTest, AnIdleAppenderCommitsOnTheSendersThread) {
  {
    auto appender = open();
    watched_->watch_this_thread(/*hold=*/false);
    AppendSender plain = appender->sender();
    ASSERT_TRUE(plain.enqueue_with_token(record(0))->wait());
    EXPECT_EQ(watched_->watched_calls(), 0) << "committed by the pool";
    appender->close();
  }
  // (A fresh appender: the first one's pool threads may still be finishing
  // their runs, and an appender is idle only once they have.)
  auto appender = open();
  const auto self = std::this_thread::get_id();
  const int before = watched_->succeeded_on(self);  // registering its writer
  AppendSender here = appender->sender();
  here.set_commit_here(true);
  for (int i = 1; i <= 20; ++i) {
    std::vector<AppendRecord> group{record(i)};
    auto token = i % 2 == 0 ? here.enqueue_group(group) : here.enqueue_with_token(record(i));
    ASSERT_TRUE(token);
    auto outcome = token->poll();
    ASSERT_TRUE(outcome) << "committed before the enqueue returned";
    ASSERT_TRUE(*outcome) << outcome->error().to_string();
    std::thread::id ran_on;
    token->on_complete([&](const Result<Time>&) { ran_on = std::this_thread::get_id(); });
    EXPECT_EQ(ran_on, std::this_thread::get_id());
  }
  EXPECT_EQ(watched_->succeeded_on(self) - before, 20);
  auto all = contents();
  ASSERT_EQ(all.size(), 21u);
  for (const auto& [kv, diff] : all) EXPECT_EQ(diff, 1) << kv.first;
}

// While one sender's thread commits, another's enqueue only queues: it never
// waits for that commit, and its records are committed by the pool.
TEST_F(AppenderCommitHereTest, ABusyAppenderOnlyQueues) {
  auto appender = open();
  AppendSender first = appender->sender(), second = appender->sender();
  // (Watched from the first sender's thread, which opened nothing.)
  first.set_commit_here(true);
  second.set_commit_here(true);
  std::atomic<bool> first_returned{false};
  std::optional<Result<Time>> first_outcome;
  std::thread::id first_thread;
  std::thread committing([&] {
    first_thread = std::this_thread::get_id();
    watched_->watch_this_thread(/*hold=*/true);
    auto token = first.enqueue_with_token(record(1));
    ASSERT_TRUE(token);
    first_outcome = token->poll();
    first_returned = true;
  });
  watched_->wait_until_held();  // the first sender's thread is committing
  auto queued =
      std::async(std::launch::async, [&] { return second.enqueue_with_token(record(2)); });
  const bool returned = queued.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  EXPECT_TRUE(returned) << "the second enqueue waited for the first sender's commit";
  EXPECT_FALSE(first_returned.load());
  auto second_token = queued.get();
  ASSERT_TRUE(second_token);
  EXPECT_FALSE(second_token->poll()) << "queued behind the commit in progress, not committed";
  watched_->release();
  committing.join();
  ASSERT_TRUE(first_outcome && *first_outcome);
  ASSERT_TRUE(second_token->wait());
  EXPECT_EQ(watched_->succeeded_on(first_thread), 1) << "the second record's commit was not its";
  EXPECT_EQ(contents().size(), 2u);
}

// A failed first attempt is not retried on the sender's thread: the pool
// retries it with the same token, so an attempt that landed is not doubled.
TEST_F(AppenderCommitHereTest, AFailedAttemptIsRetriedByThePoolExactlyOnce) {
  using Fault = WatchedConsensus::Fault;
  int i = 0;  // records appended so far
  for (Fault fault : {Fault::kDeterminate, Fault::kIndeterminateApplied}) {
    SCOPED_TRACE(fault == Fault::kDeterminate ? "determinate" : "indeterminate, applied");
    auto appender = open();
    AppendSender here = appender->sender();
    here.set_commit_here(true);
    const auto before = watched_->succeeded_on().size();
    const int calls_before = watched_->watched_calls();
    std::thread sender([&] {
      watched_->watch_this_thread(/*hold=*/false, fault);
      auto token = here.enqueue_with_token(record(++i));
      ASSERT_TRUE(token);
      auto outcome = token->wait();
      ASSERT_TRUE(outcome) << outcome.error().to_string();
    });
    const std::thread::id sender_id = sender.get_id();
    sender.join();
    EXPECT_EQ(watched_->watched_calls() - calls_before, 1) << "one attempt on the sender's thread";
    const auto succeeded = watched_->succeeded_on();
    if (fault == Fault::kDeterminate) {
      ASSERT_EQ(succeeded.size(), before + 1);
      EXPECT_NE(succeeded.back(), sender_id) << "the retry ran on the pool";
    }
    appender->close();
    auto all = contents();
    ASSERT_EQ(all.size(), static_cast<std::size_t>(i));
    for (const auto& [kv, diff] : all) EXPECT_EQ(diff, 1) << kv.first;
  }
}

}  // namespace
}  // namespace tidemark
