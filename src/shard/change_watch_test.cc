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
#include "testing/postgres_test_schema.h"
#include "testing/shard_util.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/write.h"

namespace tidemark {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Counts the head reads and the batched ones.
class CountingConsensus final : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;
  std::atomic<int> heads{0}, batched{0}, writes{0};

  Result<std::optional<VersionedData>> head(std::string_view key) override {
    ++heads;
    return ForwardingConsensus::head(key);
  }
  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    ++writes;
    return ForwardingConsensus::compare_and_set(key, expected, std::move(next));
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

// Idle listeners read nothing of their own: one batched head read per
// listen_poll_interval serves all of them, whatever their number (with the
// change poll itself an hour), and an append here or elsewhere wakes every
// one, which then reads the update.
TEST_F(ChangeWatchTest, IdleListenersAreWokenNotPolling) {
  ClientOptions options;
  options.change_poll_interval = std::chrono::hours(1);
  options.listen_poll_interval = 100ms;
  options.background_compaction = false;
  auto here = *Client::open(location_, options);
  auto elsewhere = *Client::open(location_, options);
  auto shard = here->open_shard("a");
  ASSERT_TRUE(shard);
  constexpr int kListeners = 50;
  std::atomic<int> wakes{0};
  std::vector<std::unique_ptr<Listener>> listeners;
  for (int i = 0; i < kListeners; ++i) {
    auto listener = (*shard)->listen(ListenStart::at_progress(Frontier::at(0)));
    ASSERT_TRUE(listener) << listener.error().to_string();
    EXPECT_TRUE((*listener)->set_wake([&] { ++wakes; }));
    // Caught up: nothing to emit until an append.
    auto event = (*listener)->poll();
    ASSERT_TRUE(event);
    EXPECT_FALSE(event->has_value());
    listeners.push_back(std::move(*listener));
  }
  // Opening them committed their readers: a poll may have seen one of
  // those commits before this process did and woken the listeners open
  // then. Each looks once more, then all are idle.
  auto idle = [&] {
    for (auto& listener : listeners) {
      auto event = listener->poll();
      ASSERT_TRUE(event);
      EXPECT_FALSE(event->has_value());
    }
  };
  ASSERT_NO_FATAL_FAILURE(idle());
  const int heads = counting_->heads, batched = counting_->batched, woken = wakes;
  std::this_thread::sleep_for(1s);
  ASSERT_NO_FATAL_FAILURE(idle());
  EXPECT_EQ(counting_->heads - heads, 0);  // not one read of their own
  EXPECT_GE(counting_->batched - batched, 4);
  EXPECT_LE(counting_->batched - batched, 20);
  EXPECT_EQ(wakes.load(), woken);

  // An append wakes every listener, and each reads its update.
  auto expect_update = [&](Time time) {
    for (auto& listener : listeners) {
      std::optional<ListenEvent> update;
      const auto deadline = Clock::now() + 10s;
      while (!update && Clock::now() < deadline) {
        auto event = listener->next();
        ASSERT_TRUE(event) << event.error().to_string();
        ASSERT_TRUE(event->has_value());
        if ((*event)->kind == ListenEvent::Kind::kUpdate) update = **event;
      }
      ASSERT_TRUE(update);
      EXPECT_EQ(update->time, time);
    }
  };
  auto append_one = [&](Client& client, Time time) {
    auto s = client.open_shard("a");
    ASSERT_TRUE(s);
    auto writer = (*s)->open_writer();
    ASSERT_TRUE(writer);
    BatchBuilder builder = (*writer)->builder(Frontier::at(time));
    ASSERT_TRUE(builder.add("k", "v", time, 1));
    auto batch = builder.finish(Frontier::at(time + 1));
    ASSERT_TRUE(batch) << batch.error().to_string();
    std::vector<Batch> batches;
    batches.push_back(std::move(*batch));
    ASSERT_TRUE((*writer)->compare_and_append(batches, Frontier::at(time), Frontier::at(time + 1)));
  };
  ASSERT_NO_FATAL_FAILURE(append_one(*here, 0));
  wait_for(wakes, woken + kListeners, 10s);
  EXPECT_GE(wakes.load(), woken + kListeners);
  ASSERT_NO_FATAL_FAILURE(expect_update(0));
  // Another process's append: only the listeners' batched poll can see it
  // (the change poll is an hour).
  const int before = wakes;
  ASSERT_NO_FATAL_FAILURE(append_one(*elsewhere, 1));
  wait_for(wakes, before + kListeners, 10s);
  EXPECT_GE(wakes.load(), before + kListeners);
  ASSERT_NO_FATAL_FAILURE(expect_update(1));
}

// The leased readers of a shard opened here with the default lease (every
// listen's and snapshot's) share one heartbeat: fifty idle readers cost
// one consensus write per beat, not fifty, and each keeps its hold well
// past its lease.
TEST_F(ChangeWatchTest, ReadersOfOneShardShareOneHeartbeat) {
  ClientOptions options;
  options.reader_lease = 600ms;  // a beat every 200 ms
  options.background_compaction = false;
  auto client = *Client::open(location_, options);
  auto shard = client->open_shard("a");
  ASSERT_TRUE(shard);
  constexpr std::size_t kReaders = 50;
  std::vector<std::unique_ptr<ReadHandle>> readers;
  for (std::size_t i = 0; i < kReaders; ++i) {
    auto reader = (*shard)->open_reader(ReaderOptions{options.reader_lease, true});
    ASSERT_TRUE(reader) << reader.error().to_string();
    readers.push_back(std::move(*reader));
  }
  const int writes = counting_->writes;
  std::this_thread::sleep_for(2s);  // over three leases
  const int beats = counting_->writes - writes;
  EXPECT_GE(beats, 4);
  EXPECT_LE(beats, 15);  // about ten beats of one write each, not 500
  auto info = (*shard)->inspect();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->readers.size(), kReaders);  // none expired
  // A reader with a lease of its own beats alone, and still holds.
  auto alone = (*shard)->open_reader(ReaderOptions{300ms, true});
  ASSERT_TRUE(alone);
  std::this_thread::sleep_for(1s);
  info = (*shard)->inspect();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->readers.size(), kReaders + 1);
  readers.clear();
  alone->reset();
  info = (*shard)->inspect();
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->readers.empty());
}

// On PostgreSQL another instance's commit wakes a subscriber at once, by
// LISTEN/NOTIFY, with the polls an hour apart; a change made while the
// LISTEN connection is down is still seen once it is back (the watch reads
// every watched shard then).
TEST(ChangeWatchPostgresTest, HintsWakeAtOnceWithoutThePollAndAfterAReconnect) {
  std::optional<std::string> server = postgres_test_server();
  if (!server) GTEST_SKIP() << no_postgres_server_message();
  auto schema = PostgresTestSchema::create(*server);
  ASSERT_TRUE(schema.has_value()) << schema.error().to_string();
  {
    auto opened_here = PostgresConsensus::open((*schema)->url());
    auto opened_elsewhere = PostgresConsensus::open((*schema)->url());
    ASSERT_TRUE(opened_here.has_value()) << opened_here.error().to_string();
    ASSERT_TRUE(opened_elsewhere.has_value()) << opened_elsewhere.error().to_string();
    std::shared_ptr<Consensus> here = std::move(*opened_here);
    std::shared_ptr<Consensus> elsewhere = std::move(*opened_elsewhere);
    auto watch = std::make_shared<ChangeWatch>(here, std::chrono::hours(1), std::chrono::hours(1));
    std::atomic<int> woken{0}, other{0};
    auto id = watch->subscribe(
        "k", [&] { ++woken; }, /*fast=*/true);
    ASSERT_TRUE(id.has_value()) << id.error().to_string();
    auto other_id = watch->subscribe(
        "unrelated", [&] { ++other; }, /*fast=*/true);
    ASSERT_TRUE(other_id.has_value());
    const auto began = Clock::now();
    while (!watch->hints_healthy() && Clock::now() - began < 10s) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(watch->hints_healthy());
    // The first full read (at once on the channel's kAll) only learns where
    // the shards are.
    std::this_thread::sleep_for(200ms);

    const auto wrote = Clock::now();
    auto outcome = elsewhere->compare_and_set("k", std::nullopt, {1, "one"});
    ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
    const auto took = wait_for(woken, 1, 10s);
    EXPECT_GE(woken.load(), 1);
    EXPECT_LT(took, 10s);  // the polls are an hour apart
    EXPECT_EQ(other.load(), 0);
    std::fprintf(stderr, "woken %.1f ms after another instance's commit\n",
                 std::chrono::duration<double, std::milli>(Clock::now() - wrote).count());

    // (A hint wakes without teaching the watch the seqno; this read does,
    // so that only a later change wakes below.)
    watch->poll();

    // The LISTEN connection killed: the watch polls fast again until it is
    // back, then reads every watched shard.
    auto admin = TestConnection::open((*schema)->server());
    ASSERT_TRUE(admin.has_value()) << admin.error().to_string();
    auto pids = (*admin)->query("SELECT pid FROM pg_stat_activity WHERE application_name = '" +
                                (*schema)->name() + "' AND query LIKE 'LISTEN %'");
    ASSERT_TRUE(pids.has_value()) << pids.error().to_string();
    ASSERT_EQ(pids->size(), 1u);
    ASSERT_TRUE((*admin)->query("SELECT pg_terminate_backend(" + (*pids)[0] + ")").has_value());
    const auto killed = Clock::now();
    while (watch->hints_healthy() && Clock::now() - killed < 10s) std::this_thread::sleep_for(1ms);
    EXPECT_FALSE(watch->hints_healthy()) << "the killed connection was not noticed";
    const int before = woken;
    outcome = elsewhere->compare_and_set("k", 1, {2, "two"});
    ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
    wait_for(woken, before + 1, 10s);
    EXPECT_GT(woken.load(), before) << "a change made while the channel was down was missed";
    const auto back = Clock::now();
    while (!watch->hints_healthy() && Clock::now() - back < 10s) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(watch->hints_healthy());

    // And hints flow again.
    std::this_thread::sleep_for(200ms);
    const int again = woken;
    outcome = elsewhere->compare_and_set("k", 2, {3, "three"});
    ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
    wait_for(woken, again + 1, 10s);
    EXPECT_GT(woken.load(), again);
    EXPECT_EQ(other.load(), 0);
    watch->unsubscribe(*id);
    watch->unsubscribe(*other_id);
  }
}

}  // namespace
}  // namespace tidemark
