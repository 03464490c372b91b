#include "sink/consensus_lease.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "location/mem_consensus.h"
#include "testing/shard_util.h"
#include "util/clock.h"

namespace tidemark {
namespace {

using std::chrono::milliseconds;

// A Consensus that can be cut off: every call fails (Determinate) while it is.
class SeveredConsensus final : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;
  void sever(bool severed) { severed_ = severed; }

  Result<std::optional<VersionedData>> head(std::string_view key) override {
    if (severed_) return determinate("severed");
    return ForwardingConsensus::head(key);
  }
  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    if (severed_) return determinate("severed");
    return ForwardingConsensus::compare_and_set(key, expected, std::move(next));
  }
  Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                          std::size_t limit) override {
    if (severed_) return determinate("severed");
    return ForwardingConsensus::scan(key, from, limit);
  }
  Result<std::size_t> truncate(std::string_view key, SeqNo seqno) override {
    if (severed_) return determinate("severed");
    return ForwardingConsensus::truncate(key, seqno);
  }

 private:
  std::atomic<bool> severed_{false};
};

LeaseRecord holder(std::string runner, std::string owner = "", std::string sink = "s/a") {
  LeaseRecord record;
  record.subject = "sink a of shard s";
  record.sink = std::move(sink);
  record.owner = std::move(owner);
  record.runner = std::move(runner);
  record.process = this_process();
  return record;
}

// A record as another machine's live runner would have written it.
LeaseRecord elsewhere(std::uint64_t expires_at_ms) {
  LeaseRecord record = holder("tidemark sink run");
  record.token = "t";
  record.process.host = "far-away";
  record.process.machine = "another-boot/pid:[1]";
  record.epoch = 7;
  record.acquired_at_ms = 1;
  record.expires_at_ms = expires_at_ms;
  return record;
}

LeaseRecord head_record(Consensus& consensus, std::string_view key) {
  auto head = consensus.head(key);
  EXPECT_TRUE(head && *head);
  auto record = LeaseRecord::parse((*head)->data);
  EXPECT_TRUE(record) << record.error().message;
  return *record;
}

TEST(TakeOverTest, WhenALeaseMayBeTaken) {
  const LeaseRecord me = holder("me", "server-1");
  LeaseRecord current = elsewhere(1000);
  EXPECT_EQ(take_over(std::nullopt, me, 500, Liveness::kUnknown), Takeover::kFree);
  EXPECT_EQ(take_over(current, me, 500, Liveness::kUnknown), Takeover::kRefused);
  EXPECT_EQ(take_over(current, me, 500, Liveness::kAlive), Takeover::kRefused);
  EXPECT_EQ(take_over(current, me, 1001, Liveness::kUnknown), Takeover::kExpired);
  // A live holder of this machine keeps it even expired (it may be paused).
  EXPECT_EQ(take_over(current, me, 1001, Liveness::kAlive), Takeover::kRefused);
  EXPECT_EQ(take_over(current, me, 500, Liveness::kDead), Takeover::kHolderDead);
  // Between servers an expired lease moves even from a live holder here (a
  // paused server), never one still within its expiry.
  LeaseRecord server = current;
  server.owner = "server-2";
  EXPECT_EQ(take_over(server, me, 1001, Liveness::kAlive), Takeover::kExpired);
  EXPECT_EQ(take_over(server, me, 500, Liveness::kAlive), Takeover::kRefused);
  EXPECT_EQ(take_over(server, holder("me"), 1001, Liveness::kAlive), Takeover::kRefused);
  current.owner = "server-1";  // a previous life of this server's same sink
  EXPECT_EQ(take_over(current, me, 500, Liveness::kUnknown), Takeover::kSameRunner);
  current.sink = "s/b";  // but not another sink of it
  EXPECT_EQ(take_over(current, me, 500, Liveness::kUnknown), Takeover::kRefused);
  current.token.clear();  // released
  EXPECT_EQ(take_over(current, me, 500, Liveness::kAlive), Takeover::kFree);
  // A live command's record, even this process's, is not taken.
  LeaseRecord mine = holder("me");
  mine.token = "old";
  mine.expires_at_ms = 1000;
  EXPECT_EQ(take_over(mine, holder("me"), 500, Liveness::kAlive), Takeover::kRefused);
  EXPECT_EQ(take_over(mine, holder("me"), 2000, Liveness::kAlive), Takeover::kRefused);
}

TEST(LeaseRecordTest, RoundTripsAndRefusesGarbage) {
  const LeaseRecord record = elsewhere(123456);
  auto parsed = LeaseRecord::parse(record.to_json());
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->to_json(), record.to_json());
  EXPECT_EQ(LeaseRecord::parse("{}").error().kind, ErrorKind::kCorruption);
  EXPECT_EQ(LeaseRecord::parse("nope").error().kind, ErrorKind::kCorruption);
}

TEST(ConsensusLeaseTest, OneHolderAtATimeNamedToTheOthers) {
  auto consensus = std::make_shared<MemConsensus>();
  auto first = ConsensusLease::acquire(consensus, "lease/x", holder("tidemark serve on h:1"));
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ((*first)->record().epoch, 1u);
  EXPECT_TRUE((*first)->check());
  // Another sink of this (live) process: refused, the holder named.
  auto second = ConsensusLease::acquire(consensus, "lease/x", holder("another", "", "s/b"));
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().kind, ErrorKind::kHeld);
  const std::string& message = second.error().message;
  EXPECT_NE(message.find("sink a of shard s is held by tidemark serve on h:1"), std::string::npos)
      << message;
  EXPECT_NE(message.find("pid " + std::to_string(::getpid())), std::string::npos) << message;
  EXPECT_NE(message.find("lease until"), std::string::npos) << message;
  // Released when destroyed: the next takes it at once, one epoch later.
  first->reset();
  auto third = ConsensusLease::acquire(consensus, "lease/x", holder("another", "", "s/b"));
  ASSERT_TRUE(third) << third.error().message;
  EXPECT_EQ((*third)->record().epoch, 2u);
  // Versions do not pile up.
  auto versions = consensus->scan("lease/x", 0, 100);
  ASSERT_TRUE(versions);
  EXPECT_EQ(versions->size(), 1u);
}

TEST(ConsensusLeaseTest, ADeadHolderOfThisMachineIsTakenOverAtOnce) {
  auto consensus = std::make_shared<MemConsensus>();
  LeaseRecord dead = holder("tidemark sink run", "", "s/b");
  dead.token = "t";
  dead.process.start_ticks += 1;  // this pid, but another (gone) process
  dead.epoch = 4;
  dead.expires_at_ms = wall_clock_millis() + 60'000;
  ASSERT_TRUE(consensus->compare_and_set("lease/x", std::nullopt, {1, dead.to_json()}));
  auto lease = ConsensusLease::acquire(consensus, "lease/x", holder("me"));
  ASSERT_TRUE(lease) << lease.error().message;
  EXPECT_EQ((*lease)->record().epoch, 5u);
}

TEST(ConsensusLeaseTest, ALiveHolderOfThisMachineKeepsItEvenExpired) {
  auto consensus = std::make_shared<MemConsensus>();
  LeaseRecord stalled = holder("tidemark sink run", "", "s/b");  // this (live) process
  stalled.token = "t";
  stalled.expires_at_ms = wall_clock_millis() - 60'000;
  ASSERT_TRUE(consensus->compare_and_set("lease/x", std::nullopt, {1, stalled.to_json()}));
  auto refused = ConsensusLease::acquire(consensus, "lease/x", holder("me"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, ErrorKind::kHeld);
  EXPECT_NE(refused.error().message.find("pid " + std::to_string(::getpid())), std::string::npos)
      << refused.error().message;
}

TEST(ConsensusLeaseTest, AnotherMachinesHolderWaitsForItsExpiry) {
  auto consensus = std::make_shared<MemConsensus>();
  const std::uint64_t now = wall_clock_millis();
  ASSERT_TRUE(
      consensus->compare_and_set("lease/x", std::nullopt, {1, elsewhere(now + 60'000).to_json()}));
  auto refused = ConsensusLease::acquire(consensus, "lease/x", holder("me"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, ErrorKind::kHeld);
  EXPECT_NE(refused.error().message.find("on host far-away"), std::string::npos)
      << refused.error().message;
  ASSERT_TRUE(consensus->compare_and_set("lease/x", 1, {2, elsewhere(now - 1).to_json()}));
  auto taken = ConsensusLease::acquire(consensus, "lease/x", holder("me"));
  ASSERT_TRUE(taken) << taken.error().message;
  EXPECT_EQ((*taken)->record().epoch, 8u);
}

TEST(ConsensusLeaseTest, RenewalKeepsItAndATakeoverIsNoticedByCheck) {
  auto consensus = std::make_shared<MemConsensus>();
  LeaseOptions options{milliseconds(600), milliseconds(50), milliseconds(200)};
  auto lease = ConsensusLease::acquire(consensus, "lease/x", holder("me"), options);
  ASSERT_TRUE(lease) << lease.error().message;
  const std::uint64_t first_expiry = head_record(*consensus, "lease/x").expires_at_ms;
  std::this_thread::sleep_for(milliseconds(900));  // past the first expiry: renewed meanwhile
  EXPECT_TRUE((*lease)->check());
  EXPECT_GT(head_record(*consensus, "lease/x").expires_at_ms, first_expiry);

  // Someone takes it (as after an expiry): check() names them. A renewal
  // may land between the read and the write (a slow machine, a sanitizer):
  // then the write is refused, and the usurper reads again.
  for (;;) {
    auto head = consensus->head("lease/x");
    ASSERT_TRUE(head && *head);
    LeaseRecord usurper = elsewhere(wall_clock_millis() + 60'000);
    auto taken = consensus->compare_and_set("lease/x", (*head)->seqno,
                                            {(*head)->seqno + 1, usurper.to_json()});
    ASSERT_TRUE(taken);
    if (*taken == CasOutcome::kCommitted) break;
  }
  auto checked = (*lease)->check();
  ASSERT_FALSE(checked);
  EXPECT_EQ(checked.error().kind, ErrorKind::kHeld);
  EXPECT_NE(checked.error().message.find("taken over by"), std::string::npos);
  EXPECT_NE(checked.error().message.find("far-away"), std::string::npos);
  // Destroying it leaves the new holder's record alone.
  lease->reset();
  EXPECT_EQ(head_record(*consensus, "lease/x").token, "t");
}

// Counts the calls it forwards; `lose_next_reply` makes the next
// compare_and_set land but report Indeterminate.
class CountingConsensus final : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;
  std::atomic<int> heads{0}, writes{0}, truncates{0};
  std::atomic<bool> lose_next_reply{false};

  Result<std::optional<VersionedData>> head(std::string_view key) override {
    ++heads;
    return ForwardingConsensus::head(key);
  }
  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    ++writes;
    auto outcome = ForwardingConsensus::compare_and_set(key, expected, std::move(next));
    if (lose_next_reply.exchange(false)) return indeterminate("the reply was lost");
    return outcome;
  }
  Result<std::size_t> truncate(std::string_view key, SeqNo seqno) override {
    ++truncates;
    return ForwardingConsensus::truncate(key, seqno);
  }
};

// A renewal is one write (a server renews a lease per sink every 10 s, so
// a thousand sinks made 300 consensus calls a second), and the versions
// stay few.
TEST(ConsensusLeaseTest, ARenewalIsOneWriteAndVersionsStayFew) {
  auto inner = std::make_shared<MemConsensus>();
  auto consensus = std::make_shared<CountingConsensus>(inner);
  LeaseOptions options{milliseconds(2000), milliseconds(10), milliseconds(500)};
  auto lease = ConsensusLease::acquire(consensus, "lease/x", holder("me"), options);
  ASSERT_TRUE(lease) << lease.error().message;
  const int heads_before = consensus->heads, writes_before = consensus->writes;
  for (int i = 0; i < 500 && consensus->writes - writes_before < 30; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  const int renewals = consensus->writes - writes_before;
  ASSERT_GE(renewals, 30);
  EXPECT_EQ(consensus->heads - heads_before, 0);
  EXPECT_LE(consensus->truncates.load(), renewals / 3);
  auto versions = inner->scan("lease/x", 0, 100);
  ASSERT_TRUE(versions);
  EXPECT_LE(versions->size(), static_cast<std::size_t>(ConsensusLease::kTruncateEvery));

  // A renewal whose reply is lost but which landed: the next one finds the
  // head still ours, and the lease stays trusted.
  consensus->lose_next_reply = true;
  const int at = consensus->writes;
  for (int i = 0; i < 500 && consensus->writes - at < 5; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(consensus->lose_next_reply.load());
  EXPECT_TRUE((*lease)->check());
  const std::uint64_t expiry = head_record(*inner, "lease/x").expires_at_ms;
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_GT(head_record(*inner, "lease/x").expires_at_ms, expiry);  // still renewing

  // Taken over: the next renewal's write fails, it reads the head, and stops.
  // (The takeover is written against the head it read, so it may race a
  // renewal: then it reads again.)
  bool taken = false;
  for (int attempt = 0; attempt < 100 && !taken; ++attempt) {
    auto head = inner->head("lease/x");
    ASSERT_TRUE(head && *head);
    auto outcome = inner->compare_and_set(
        "lease/x", (*head)->seqno,
        {(*head)->seqno + 1, elsewhere(wall_clock_millis() + 60'000).to_json()});
    ASSERT_TRUE(outcome);
    taken = *outcome == CasOutcome::kCommitted;
  }
  ASSERT_TRUE(taken);
  std::this_thread::sleep_for(milliseconds(100));
  const int stopped_at = consensus->writes;
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(consensus->writes.load(), stopped_at);  // no more renewals
  EXPECT_EQ(head_record(*inner, "lease/x").token, "t");
  auto checked = (*lease)->check();
  ASSERT_FALSE(checked);
  EXPECT_EQ(checked.error().kind, ErrorKind::kHeld);
}

// Counts compare_and_set_many calls and their requests, forwarding them
// whole to the inner Consensus; single writes are counted by what became of
// them, and those to "lease/churn" apart.
class BatchCountingConsensus final : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;
  std::atomic<int> singles{0}, batches{0}, batched{0}, largest{0};
  std::atomic<int> churn_committed{0}, churn_lost{0};

  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    ++singles;
    auto outcome = ForwardingConsensus::compare_and_set(key, expected, std::move(next));
    if (key == "lease/churn" && outcome) {
      ++(*outcome == CasOutcome::kCommitted ? churn_committed : churn_lost);
    }
    return outcome;
  }
  std::vector<Result<CasOutcome>> compare_and_set_many(
      const std::vector<CasRequest>& requests) override {
    ++batches;
    batched += static_cast<int>(requests.size());
    largest = std::max(largest.load(), static_cast<int>(requests.size()));
    return inner().compare_and_set_many(requests);
  }
};

// A server holds a lease per sink: a thousand of them renewing one by one
// made a hundred SQLite commits (each with its sync) a second. The leases
// of a process on one Consensus renew together, kRenewalBatch to a write,
// and each stays renewed however many come and go meanwhile.
TEST(ConsensusLeaseTest, LeasesOnOneConsensusRenewInBatches) {
  auto inner = std::make_shared<MemConsensus>();
  auto consensus = std::make_shared<BatchCountingConsensus>(inner);
  LeaseOptions options{milliseconds(3000), milliseconds(100), milliseconds(1000)};
  constexpr int kLeases = 600;
  std::vector<std::unique_ptr<ConsensusLease>> leases;
  for (int i = 0; i < kLeases; ++i) {
    auto lease = ConsensusLease::acquire(consensus, "lease/" + std::to_string(i),
                                         holder("me", "", "s/" + std::to_string(i)), options);
    ASSERT_TRUE(lease) << lease.error().message;
    leases.push_back(std::move(*lease));
  }
  std::vector<std::uint64_t> expiries;
  for (int i = 0; i < kLeases; ++i) {
    expiries.push_back(head_record(*inner, "lease/" + std::to_string(i)).expires_at_ms);
  }
  const int singles = consensus->singles;  // the acquisitions
  const int batches_before = consensus->batches, batched_before = consensus->batched;
  // Leases leave and join while rounds run.
  std::thread churn([&] {
    for (int i = 0; i < 50; ++i) {
      auto lease =
          ConsensusLease::acquire(consensus, "lease/churn", holder("me", "", "s/churn"), options);
      EXPECT_TRUE(lease) << lease.error().message;
      std::this_thread::sleep_for(milliseconds(10));
    }
  });
  std::this_thread::sleep_for(milliseconds(650));  // about six rounds
  churn.join();
  const int batches = consensus->batches - batches_before;
  const int batched = consensus->batched - batched_before;
  ASSERT_GT(batches, 0);
  // Every renewal went through a batch, 256 to a batch at most, so that 600
  // leases cost three batches a round.
  // Single writes: only the churning lease's 50 acquisitions and releases,
  // and their retries when a renewal of the lease that just left landed
  // between a head read and its write (release() and acquire() read again).
  EXPECT_EQ(consensus->churn_committed.load(), 100);
  EXPECT_EQ(consensus->singles - singles, consensus->churn_committed + consensus->churn_lost);
  EXPECT_LE(consensus->largest.load(), static_cast<int>(ConsensusLease::kRenewalBatch));
  EXPECT_GE(batched / batches, 150) << batched << " renewals in " << batches << " batches";
  for (int i = 0; i < kLeases; ++i) {
    EXPECT_GT(head_record(*inner, "lease/" + std::to_string(i)).expires_at_ms, expiries[i]) << i;
    ASSERT_TRUE(leases[static_cast<std::size_t>(i)]->check());
  }
  // Versions stay few under batched truncation too.
  auto versions = inner->scan("lease/0", 0, 100);
  ASSERT_TRUE(versions);
  EXPECT_LE(versions->size(), static_cast<std::size_t>(ConsensusLease::kTruncateEvery) + 1);
  leases.clear();
  EXPECT_TRUE(head_record(*inner, "lease/0").released());
}

// Batched renewals stall (a slow backend) while armed.
class StallingConsensus final : public ForwardingConsensus {
 public:
  using ForwardingConsensus::ForwardingConsensus;
  std::atomic<bool> stall{false};
  std::atomic<int> stalled{0};

  std::vector<Result<CasOutcome>> compare_and_set_many(
      const std::vector<CasRequest>& requests) override {
    if (stall) {
      ++stalled;
      std::this_thread::sleep_for(milliseconds(1500));
    }
    return inner().compare_and_set_many(requests);
  }
};

// A round of renewals may take a slow backend's timeout for every write;
// destroying a lease (a sink deleted, a server stopping) does not wait for
// it, and the lease still ends released, whichever lands first.
TEST(ConsensusLeaseTest, ALeaseLeavesWithoutWaitingForASlowRound) {
  auto inner = std::make_shared<MemConsensus>();
  auto consensus = std::make_shared<StallingConsensus>(inner);
  LeaseOptions options{milliseconds(5000), milliseconds(50), milliseconds(1000)};
  auto kept = ConsensusLease::acquire(consensus, "lease/kept", holder("me", "", "s/kept"), options);
  auto leaving =
      ConsensusLease::acquire(consensus, "lease/leaving", holder("me", "", "s/leaving"), options);
  ASSERT_TRUE(kept && leaving);
  consensus->stall = true;
  for (int i = 0; i < 200 && consensus->stalled == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_GT(consensus->stalled.load(), 0);
  const auto started = std::chrono::steady_clock::now();
  leaving->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - started, milliseconds(700));
  consensus->stall = false;
  std::this_thread::sleep_for(milliseconds(1700));  // the stalled round ends
  EXPECT_TRUE(head_record(*inner, "lease/leaving").released());
  EXPECT_TRUE((*kept)->check());
  EXPECT_FALSE(head_record(*inner, "lease/kept").released());
}

TEST(ConsensusLeaseTest, NotRenewedInTimeItIsNotTrusted) {
  auto inner = std::make_shared<MemConsensus>();
  auto consensus = std::make_shared<SeveredConsensus>(inner);
  LeaseOptions options{milliseconds(600), milliseconds(50), milliseconds(200)};
  auto lease = ConsensusLease::acquire(consensus, "lease/x", holder("me"), options);
  ASSERT_TRUE(lease) << lease.error().message;
  consensus->sever(true);
  std::this_thread::sleep_for(milliseconds(500));  // past duration - margin
  // Its last renewal is too old to trust (another machine may have taken
  // it over by its own clock), whatever the head would say.
  auto checked = (*lease)->check();
  ASSERT_FALSE(checked);
  EXPECT_EQ(checked.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(checked.error().message.find("not renewed in time"), std::string::npos);
  // Renewals resume once the consensus is back.
  consensus->sever(false);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_TRUE((*lease)->check());
}

TEST(ConsensusLeaseTest, RacingCandidatesGetOneLeaseBetweenThem) {
  auto consensus = std::make_shared<MemConsensus>();
  std::atomic<int> won{0}, held{0};
  std::vector<std::unique_ptr<ConsensusLease>> leases(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto lease = ConsensusLease::acquire(
          consensus, "lease/x", holder("r" + std::to_string(i), "", "s/" + std::to_string(i)));
      if (lease) {
        ++won;
        leases[static_cast<std::size_t>(i)] = std::move(*lease);
      } else if (lease.error().is(ErrorKind::kHeld)) {
        ++held;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(held.load(), 7);
}

}  // namespace
}  // namespace tidemark
