#include "sink/server_presence.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "location/mem_consensus.h"

namespace tidemark {
namespace {

constexpr std::uint64_t kNow = 1'700'000'000'000;

ServerPresence server(std::string owner, std::uint64_t sinks) {
  ServerPresence s;
  s.owner = std::move(owner);
  s.runner = "tidemark serve on " + s.owner + ":6875";
  s.host = "host-" + s.owner;
  s.sinks = sinks;
  return s;
}

std::vector<std::string> owners(const std::vector<ServerPresence>& servers) {
  std::vector<std::string> out;
  for (const auto& s : servers) out.push_back(s.owner);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ServerPresence, RoundTripsEveryField) {
  ServerPresence a = server("a", 3);
  a.scope = "0123abcd";
  a.s3_endpoints = "http://127.0.0.1:4568";
  a.kafka_brokers = "k1:9092,k2";
  a.handing.push_back({"orders", "b", kNow + 10'000});
  a.written_at_ms = kNow;
  const std::vector<ServerPresence> servers = {a, server("b \"quoted\"", 0)};
  auto parsed = parse_presence(presence_to_json(servers));
  ASSERT_TRUE(parsed) << parsed.error().to_string();
  ASSERT_EQ(parsed->size(), 2u);
  const ServerPresence& p = (*parsed)[0];
  EXPECT_EQ(p.owner, "a");
  EXPECT_EQ(p.runner, a.runner);
  EXPECT_EQ(p.host, a.host);
  EXPECT_EQ(p.scope, a.scope);
  EXPECT_EQ(p.sinks, 3u);
  EXPECT_EQ(p.s3_endpoints, a.s3_endpoints);
  EXPECT_EQ(p.kafka_brokers, a.kafka_brokers);
  ASSERT_EQ(p.handing.size(), 1u);
  EXPECT_EQ(p.handing[0].sink, "orders");
  EXPECT_EQ(p.handing[0].to, "b");
  EXPECT_EQ(p.handing[0].until_ms, kNow + 10'000);
  EXPECT_EQ(p.written_at_ms, kNow);
  EXPECT_EQ((*parsed)[1].owner, "b \"quoted\"");
}

TEST(ServerPresence, RefusesARecordWithoutEveryField) {
  EXPECT_FALSE(parse_presence("[]"));
  EXPECT_FALSE(parse_presence("{\"servers\":{}}"));
  EXPECT_FALSE(parse_presence("{\"servers\":[{\"owner\":\"a\"}]}"));
  EXPECT_TRUE(parse_presence("{\"servers\":[]}"));
}

// Each server replaces its own entry; a server that stopped writing stops
// counting after kPresenceLiveFor and is dropped after kPresenceForgetAfter;
// one that withdraws is gone at once.
TEST(ServerPresence, ServersSeeOneAnotherWhileTheyWrite) {
  MemConsensus consensus;
  ASSERT_TRUE(publish_presence(consensus, server("a", 2), kNow));
  auto seen = publish_presence(consensus, server("b", 0), kNow + 1'000);
  ASSERT_TRUE(seen);
  EXPECT_EQ(owners(*seen), (std::vector<std::string>{"a", "b"}));
  // a writes again: still one entry of a, with its new count.
  seen = publish_presence(consensus, server("a", 1), kNow + 2'000);
  ASSERT_TRUE(seen);
  ASSERT_EQ(seen->size(), 2u);
  for (const auto& s : *seen) {
    if (s.owner == "a") {
      EXPECT_EQ(s.sinks, 1u);
    }
  }
  // b stops writing: not live past kPresenceLiveFor, still in the record.
  const std::uint64_t later = kNow + 1'000 + kPresenceLiveFor.count() + 1;
  seen = publish_presence(consensus, server("a", 1), later);
  ASSERT_TRUE(seen);
  EXPECT_EQ(owners(*seen), (std::vector<std::string>{"a"}));
  auto head = consensus.head("server/presence");
  ASSERT_TRUE(head && *head);
  EXPECT_NE((*head)->data.find("\"owner\":\"b\""), std::string::npos);
  // Past kPresenceForgetAfter it is dropped from the record.
  const std::uint64_t much_later = kNow + 1'000 + kPresenceForgetAfter.count() + 1;
  ASSERT_TRUE(publish_presence(consensus, server("a", 1), much_later));
  head = consensus.head("server/presence");
  ASSERT_TRUE(head && *head);
  EXPECT_EQ((*head)->data.find("\"owner\":\"b\""), std::string::npos);
  // c joins, then withdraws.
  ASSERT_TRUE(publish_presence(consensus, server("c", 0), much_later));
  withdraw_presence(consensus, "c");
  auto read = read_presence(consensus, much_later);
  ASSERT_TRUE(read);
  EXPECT_EQ(owners(*read), (std::vector<std::string>{"a"}));
}

// An unchanged entry is written again only once kPresenceRefreshEvery
// old; a change is written at once.
TEST(ServerPresence, AnUnchangedEntryIsWrittenOnlyOnceItAges) {
  MemConsensus consensus;
  ASSERT_TRUE(publish_presence(consensus, server("a", 2), kNow));
  auto seqno = [&] {
    auto head = consensus.head("server/presence");
    return head && *head ? (*head)->seqno : 0;
  };
  const SeqNo first = seqno();
  ASSERT_TRUE(publish_presence(consensus, server("a", 2), kNow + 2'000));
  EXPECT_EQ(seqno(), first) << "an unchanged, recent entry was written again";
  ASSERT_TRUE(publish_presence(consensus, server("a", 3), kNow + 2'500));
  EXPECT_EQ(seqno(), first + 1) << "a changed count was not written";
  ASSERT_TRUE(
      publish_presence(consensus, server("a", 3), kNow + 2'500 + kPresenceRefreshEvery.count()));
  EXPECT_EQ(seqno(), first + 2) << "an aging entry was not written again";
}

// Servers writing at once each keep their entry (compare_and_set, tried
// again), and the versions are truncated as they go.
TEST(ServerPresence, ConcurrentWritersLoseNoEntry) {
  MemConsensus consensus;
  constexpr int kServers = 4, kRounds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kServers; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        (void)publish_presence(consensus, server("s" + std::to_string(t), r), kNow + r);
      }
    });
  }
  for (auto& t : threads) t.join();
  // One more round, in turn: every server's entry is there.
  for (int t = 0; t < kServers; ++t) {
    ASSERT_TRUE(publish_presence(consensus, server("s" + std::to_string(t), 0), kNow + kRounds));
  }
  auto read = read_presence(consensus, kNow + kRounds);
  ASSERT_TRUE(read);
  EXPECT_EQ(owners(*read), (std::vector<std::string>{"s0", "s1", "s2", "s3"}));
  auto versions = consensus.scan("server/presence", 0, 1'000);
  ASSERT_TRUE(versions);
  EXPECT_LE(versions->size(), 16u) << "versions are not truncated";
}

}  // namespace
}  // namespace tidemark
