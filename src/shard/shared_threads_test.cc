// Issue 18: every open shard kept a compaction thread and every writer and
// leased reader a heartbeat thread of its own. Both now run on the shared
// executors (util/executor.h), so hundreds of shards, each with a writer
// and compaction to do, add only the executors' few threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "location/faulty.h"
#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "tidemark/appender.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/write.h"
#include "util/executor.h"
#include "util/proc_status.h"

namespace tidemark {
namespace {

int threads_now() {
  return proc_status().threads;
}

// Shards <prefix>0 .. <prefix>(count - 1), each with an open appender.
void open_appenders(Client& client, const std::string& prefix, int count,
                    std::vector<std::shared_ptr<Shard>>* shards,
                    std::vector<std::shared_ptr<Appender>>* appenders) {
  for (int i = 0; i < count; ++i) {
    const std::string name = prefix + std::to_string(i);
    ASSERT_TRUE(client.create_shard(name));
    auto shard = client.open_shard(name);
    ASSERT_TRUE(shard) << shard.error().to_string();
    AppenderOptions options;
    options.queue_bytes = 1 << 20;
    auto appender = Appender::open(*shard, options);
    ASSERT_TRUE(appender) << appender.error().to_string();
    shards->push_back(*shard);
    appenders->push_back(*appender);
  }
}

TEST(SharedThreadsTest, HundredsOfShardsWithWritersAndCompactionAddOnlyTheExecutorsThreads) {
  constexpr int kShards = 300;
  constexpr int kAppends = 12;
  ClientOptions options;
  options.background_compaction = true;
  options.inline_part_max_bytes = 0;                      // merges that read and write blob parts
  options.writer_lease = std::chrono::milliseconds(600);  // a heartbeat each 200 ms
  auto client = Client::open(
      Location{std::make_shared<MemBlob>(), std::make_shared<MemConsensus>()}, options);
  ASSERT_TRUE(client) << client.error().to_string();
  const int before = threads_now();
  ASSERT_GT(before, 0);

  std::vector<std::shared_ptr<Shard>> shards;
  std::vector<std::unique_ptr<WriteHandle>> writers;
  for (int i = 0; i < kShards; ++i) {
    const std::string name = "s" + std::to_string(i);
    ASSERT_TRUE((*client)->create_shard(name));
    auto shard = (*client)->open_shard(name);
    ASSERT_TRUE(shard) << shard.error().to_string();
    auto writer = (*shard)->open_writer();
    ASSERT_TRUE(writer) << writer.error().to_string();
    shards.push_back(*shard);
    writers.push_back(std::move(*writer));
  }
  // Appends enough batches to each that its spine asks for merges.
  for (Time t = 0; t < kAppends; ++t) {
    for (int i = 0; i < kShards; ++i) {
      std::vector<Update> one{Update{"k" + std::to_string(t % 5), "v", t, 1}};
      auto batch = writers[i]->batch(one, Frontier::at(t), Frontier::at(t + 1));
      ASSERT_TRUE(batch) << batch.error().to_string();
      std::vector<Batch> batches;
      batches.push_back(std::move(*batch));
      auto appended = writers[i]->compare_and_append(batches, Frontier::at(t), Frontier::at(t + 1));
      ASSERT_TRUE(appended) << appended.error().to_string();
    }
  }
  // Every shard is compacted (by the shared pool) and every writer keeps
  // beating past three leases.
  auto compacted = [&] {
    for (const auto& shard : shards) {
      auto info = shard->inspect();
      if (!info || info->batches > 6) return false;
    }
    return true;
  };
  for (int i = 0; i < 600 && !compacted(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(compacted());
  std::this_thread::sleep_for(std::chrono::milliseconds(1800));
  const int during = threads_now();
  // The executors' threads (compaction, the timers' pool, and the blob
  // transfers that help merges open their parts when that is slow), the
  // timer thread, and up to 2 of a sanitizer's runtime (ThreadSanitizer
  // starts one as the test runs).
  const int bound =
      static_cast<int>(WorkPool::compaction().max_threads() + Timers::shared().pool_threads_max() +
                       WorkPool::blob_io().max_threads()) +
      1 + 2;
  std::fprintf(stderr,
               "threads: %d before, %d with %d shards, writers and compaction (bound +%d)\n",
               before, during, kShards, bound);
  EXPECT_LE(during - before, bound);
  // The writers are still registered (their heartbeats ran): each appends.
  for (int i = 0; i < kShards; ++i) {
    std::vector<Update> one{Update{"last", "v", kAppends, 1}};
    auto batch = writers[i]->batch(one, Frontier::at(kAppends), Frontier::at(kAppends + 1));
    ASSERT_TRUE(batch);
    std::vector<Batch> batches;
    batches.push_back(std::move(*batch));
    auto appended =
        writers[i]->compare_and_append(batches, Frontier::at(kAppends), Frontier::at(kAppends + 1));
    ASSERT_TRUE(appended) << appended.error().to_string();
    auto snapshot = shards[i]->snapshot(kAppends);
    ASSERT_TRUE(snapshot) << snapshot.error().to_string();
  }
  writers.clear();
  shards.clear();
}

// Every appender kept two threads (its builder and committer) while open:
// 300 open appenders held 600. They run on the appenders' pool now, only
// while they have work, and their records are still committed in order,
// each token with its time.
TEST(SharedThreadsTest, HundredsOfOpenAppendersShareTheAppendersPool) {
  constexpr int kShards = 300;
  constexpr int kRounds = 3;
  ClientOptions options;
  options.background_compaction = false;
  auto client = Client::open(
      Location{std::make_shared<MemBlob>(), std::make_shared<MemConsensus>()}, options);
  ASSERT_TRUE(client) << client.error().to_string();
  const int before = threads_now();
  std::vector<std::shared_ptr<Shard>> shards;
  std::vector<std::shared_ptr<Appender>> appenders;
  ASSERT_NO_FATAL_FAILURE(open_appenders(**client, "a", kShards, &shards, &appenders));
  int most = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<CommitToken> tokens;
    for (int i = 0; i < kShards; ++i) {
      AppendSender sender = appenders[i]->sender();
      auto token = sender.enqueue_with_token(
          AppendRecord{"k" + std::to_string(round), "v" + std::to_string(i), 1});
      ASSERT_TRUE(token) << token.error().to_string();
      tokens.push_back(std::move(*token));
    }
    most = std::max(most, threads_now());
    for (int i = 0; i < kShards; ++i) {
      auto time = tokens[i].wait();
      ASSERT_TRUE(time) << time.error().to_string();
    }
    most = std::max(most, threads_now());
  }
  const int idle = threads_now();
  // The appenders' pool, the batch builds and blob transfer pools, the
  // timer thread and its pool (linger timers), and up to 2 of a
  // sanitizer's runtime.
  const int bound =
      static_cast<int>(WorkPool::appenders().max_threads() +
                       WorkPool::batch_builds().max_threads() + WorkPool::blob_io().max_threads() +
                       Timers::shared().pool_threads_max()) +
      1 + 2;
  std::fprintf(stderr,
               "threads: %d before, at most %d with %d appenders busy, %d idle (bound +%d)\n",
               before, most, kShards, idle, bound);
  EXPECT_LE(idle - before, bound);
  EXPECT_LE(most - before, bound);
  // Each shard holds its rounds' records, each once.
  for (int i = 0; i < kShards; i += 37) {
    auto info = shards[i]->inspect();
    ASSERT_TRUE(info);
    EXPECT_EQ(info->updates, static_cast<std::uint64_t>(kRounds)) << "shard a" << i;
  }
  for (auto& appender : appenders) appender->close();
}

// A batch an appender cut, and each part it uploaded, took a thread of its
// own while it ran: busy appenders under blob latency held two threads
// each. Builds and uploads run on two bounded pools now, so hundreds of
// appenders busy at once add at most the pools' threads, and every record
// is still committed once.
TEST(SharedThreadsTest, BusyAppendersBuildAndUploadOnBoundedPools) {
  constexpr int kShards = 200;
  ClientOptions options;
  options.background_compaction = false;
  FaultConfig slow;
  slow.latency = std::chrono::milliseconds(30);  // every blob call
  auto client =
      Client::open(Location{std::make_shared<FaultyBlob>(std::make_shared<MemBlob>(), slow),
                            std::make_shared<MemConsensus>()},
                   options);
  ASSERT_TRUE(client) << client.error().to_string();
  std::vector<std::shared_ptr<Shard>> shards;
  std::vector<std::shared_ptr<Appender>> appenders;
  ASSERT_NO_FATAL_FAILURE(open_appenders(**client, "b", kShards, &shards, &appenders));
  const int before = threads_now();
  std::atomic<bool> sampling{true};
  std::atomic<int> most{before};
  std::thread sampler([&] {
    while (sampling) {
      most = std::max(most.load(), threads_now());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<CommitToken> tokens;
  for (int i = 0; i < kShards; ++i) {
    auto token =
        appenders[i]->sender().enqueue_with_token(AppendRecord{"k", "v" + std::to_string(i), 1});
    ASSERT_TRUE(token) << token.error().to_string();
    tokens.push_back(std::move(*token));
  }
  for (auto& token : tokens) {
    auto time = token.wait();
    ASSERT_TRUE(time) << time.error().to_string();
  }
  sampling = false;
  sampler.join();
  // The three pools, the timers' pool and thread, the sampler, and up to 2
  // of a sanitizer's runtime.
  const int bound =
      static_cast<int>(WorkPool::appenders().max_threads() +
                       WorkPool::batch_builds().max_threads() + WorkPool::blob_io().max_threads() +
                       Timers::shared().pool_threads_max()) +
      1 + 1 + 2;
  std::fprintf(stderr, "threads: %d before, at most %d with %d appenders uploading (bound +%d)\n",
               before, most.load(), kShards, bound);
  EXPECT_LE(most - before, bound);
  for (int i = 0; i < kShards; i += 23) {
    auto info = shards[i]->inspect();
    ASSERT_TRUE(info);
    EXPECT_EQ(info->updates, 1u) << "shard b" << i;
  }
  for (auto& appender : appenders) appender->close();
}

}  // namespace
}  // namespace tidemark
