// Shard::subscribe: a change this process makes wakes at once, one another
// process makes within the change poll, and nothing wakes once the
// subscription ends; the poll is one batched head read.
#include "shard/change_watch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "testing/shard_util.h"
#include "tidemark/client.h"
#include "tidemark/write.h"

namespace tidemark {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Counts the head reads and the batched ones.
class CountingConsensus final : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;
  std::atomic<int> heads{0}, batched{0};

  Result<std::optional<VersionedData>> head(std::string_view key) override {
    ++heads;
    return ForwardingConsensus::head(key);
  }
  Result<std::vector<std::optional<SeqNo>>> head_seqnos(
      const std::vector<std::string>& keys) override {
    ++batched;
    return inner().head_seqnos(keys);
  }
};

// Waits up to `limit` for `count` to reach `want`; how long it took.
std::chrono::duration<double> wait_for(const std::atomic<int>& count, int want,
                                       std::chrono::milliseconds limit) {
  const auto began = Clock::now();
  while (count < want && Clock::now() - began < limit) std::this_thread::sleep_for(1ms);
  return Clock::now() - began;
}

class ChangeWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    location_.blob = std::make_shared<MemBlob>();
    counting_ = std::make_shared<CountingConsensus>(std::make_shared<MemConsensus>());
    location_.consensus = counting_;
    ClientOptions options;
    options.change_poll_interval = 200ms;
    options.background_compaction = false;
    here_ = *Client::open(location_, options);
    // Another process on the same backends: a Client of its own.
    elsewhere_ = *Client::open(location_, options);
    for (const char* name : {"a", "b"}) ASSERT_TRUE(here_->create_shard(name));
  }

  // Moves shard `name`'s upper from `from` to from + 1 through `client`.
  void advance(Client& client, const std::string& name, Time from) {
    auto shard = client.open_shard(name);
    ASSERT_TRUE(shard);
    auto writer = (*shard)->open_writer();
    ASSERT_TRUE(writer);
    ASSERT_TRUE((*writer)->compare_and_append({}, Frontier::at(from), Frontier::at(from + 1)));
  }

  Location location_;
  std::shared_ptr<CountingConsensus> counting_;
  std::shared_ptr<Client> here_, elsewhere_;
};

TEST_F(ChangeWatchTest, ChangesHereWakeAtOnceAndChangesElsewhereWithinThePoll) {
  auto a = here_->open_shard("a");
  ASSERT_TRUE(a);
  std::atomic<int> woken{0}, other{0};
  auto subscription = (*a)->subscribe([&] { ++woken; });
  ASSERT_TRUE(subscription) << subscription.error().message;
  auto b = here_->open_shard("b");
  ASSERT_TRUE(b);
  auto on_b = (*b)->subscribe([&] { ++other; });
  ASSERT_TRUE(on_b);
  ASSERT_TRUE((*a)->upper());  // subscribe, then read

  // Appended through this Client (another Shard handle): at once, without
  // waiting for the poll.
  ASSERT_NO_FATAL_FAILURE(advance(*here_, "a", 0));
  EXPECT_GE(woken.load(), 1);
  EXPECT_EQ(other.load(), 0);  // another shard's subscriber is not woken

  // Appended by another process: within the poll interval.
  const int before = woken;
  const auto began = Clock::now();
  ASSERT_NO_FATAL_FAILURE(advance(*elsewhere_, "a", 1));
  const auto took = wait_for(woken, before + 1, 5s);
  EXPECT_GT(woken.load(), before);
  std::fprintf(stderr, "woken %.0f ms after another process's append\n",
               std::chrono::duration<double, std::milli>(Clock::now() - began).count());
  EXPECT_LT(took, 2s);  // the poll is every 200 ms
  EXPECT_EQ(other.load(), 0);

  // Ended: nothing wakes it.
  subscription->reset();
  const int ended_at = woken;
  ASSERT_NO_FATAL_FAILURE(advance(*here_, "a", 2));
  ASSERT_NO_FATAL_FAILURE(advance(*elsewhere_, "a", 3));
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(woken.load(), ended_at);

  // b still wakes: its subscription is its own.
  ASSERT_NO_FATAL_FAILURE(advance(*elsewhere_, "b", 0));
  wait_for(other, 1, 5s);
  EXPECT_EQ(other.load(), 1);
}

// A hundred subscribers on a hundred shards cost one batched read per poll
// while nothing changes, not a hundred polls.
TEST_F(ChangeWatchTest, IdleSubscribersCostOneBatchedReadPerPoll) {
  constexpr int kShards = 100;
  std::vector<std::shared_ptr<Shard>> shards;
  std::vector<Subscription> subscriptions;
  std::atomic<int> woken{0};
  for (int i = 0; i < kShards; ++i) {
    const std::string name = "s" + std::to_string(i);
    ASSERT_TRUE(here_->create_shard(name));
    auto shard = here_->open_shard(name);
    ASSERT_TRUE(shard);
    auto subscription = (*shard)->subscribe([&] { ++woken; });
    ASSERT_TRUE(subscription);
    subscriptions.push_back(std::move(*subscription));
    shards.push_back(*shard);
  }
  const int heads = counting_->heads, batched = counting_->batched;
  std::this_thread::sleep_for(1100ms);
  EXPECT_EQ(counting_->heads - heads, 0);
  EXPECT_GE(counting_->batched - batched, 3);
  EXPECT_LE(counting_->batched - batched, 7);
  EXPECT_EQ(woken.load(), 0);  // nothing changed
  ASSERT_NO_FATAL_FAILURE(advance(*elsewhere_, "s42", 0));
  wait_for(woken, 1, 5s);
  EXPECT_EQ(woken.load(), 1);
}

}  // namespace
}  // namespace tidemark
