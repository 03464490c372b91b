#include "postgres/postgres_consensus.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "testing/postgres_test_schema.h"

namespace tidemark {
namespace {

using namespace std::chrono_literals;

// Tests that need no server: the URL is refused, or nothing listens there.
TEST(PostgresConsensusUrlTest, UnreachableServerIsDeterminateWithoutThePassword) {
  for (const char* url :
       {"postgres://tidemark:s3cret-word@127.0.0.1:1/tidemark",
        "postgresql://tidemark@127.0.0.1:1/tidemark?password=s3cret-word",
        "postgres://tidemark@127.0.0.1:1/tidemark?connect_timeout=2&sslpassword=s3cret-word"}) {
    SCOPED_TRACE(url);
    auto opened = PostgresConsensus::open(url);
    ASSERT_FALSE(opened.has_value());
    const Error& error = opened.error();
    EXPECT_EQ(error.kind, ErrorKind::kDeterminate) << error.to_string();
    EXPECT_NE(error.message.find("127.0.0.1"), std::string::npos) << error.message;
    EXPECT_NE(error.message.find("connect"), std::string::npos) << error.message;
    EXPECT_EQ(error.message.find("s3cret"), std::string::npos) << error.message;
    EXPECT_NE(error.message.find("***"), std::string::npos) << error.message;  // the URL, redacted
  }
}

TEST(PostgresConsensusUrlTest, MalformedUrlIsInvalidUsageWithoutThePassword) {
  // libpq quotes the undecodable token, which here is the password.
  auto opened = PostgresConsensus::open("postgres://tidemark:s3cret%zz@127.0.0.1:1/tidemark");
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kInvalidUsage) << opened.error().to_string();
  EXPECT_EQ(opened.error().message.find("s3cret"), std::string::npos) << opened.error().message;

  for (const char* url : {"sqlite:///tmp/x.db", "postgres:/no-slashes", "mysql://u:p@h/db", ""}) {
    auto other = PostgresConsensus::open(url);
    ASSERT_FALSE(other.has_value()) << url;
    EXPECT_EQ(other.error().kind, ErrorKind::kInvalidUsage) << url;
  }
}

// call_timeout is Tidemark's own parameter, checked before connecting.
TEST(PostgresConsensusUrlTest, AMalformedCallTimeoutIsInvalidUsage) {
  for (const char* timeout : {"0", "3601", "-1", "ten", "", "1.5", "30s"}) {
    SCOPED_TRACE(timeout);
    auto opened = PostgresConsensus::open(
        std::string(
            "postgres://tidemark:s3cret@127.0.0.1:1/tidemark?connect_timeout=1&call_timeout=") +
        timeout);
    ASSERT_FALSE(opened.has_value());
    EXPECT_EQ(opened.error().kind, ErrorKind::kInvalidUsage) << opened.error().to_string();
    EXPECT_NE(opened.error().message.find("call_timeout"), std::string::npos);
    EXPECT_EQ(opened.error().message.find("s3cret"), std::string::npos);
  }
  // A valid one gets as far as connecting (nothing listens on port 1).
  auto unreachable = PostgresConsensus::open(
      "postgres://tidemark@127.0.0.1:1/tidemark?call_timeout=5&connect_timeout=1");
  ASSERT_FALSE(unreachable.has_value());
  EXPECT_EQ(unreachable.error().kind, ErrorKind::kDeterminate) << unreachable.error().to_string();
}

// Tests against the server in TIDEMARK_TEST_POSTGRES, each in a fresh schema.
class PostgresConsensusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::optional<std::string> server = postgres_test_server();
    if (!server) GTEST_SKIP() << no_postgres_server_message();
    auto schema = PostgresTestSchema::create(*server);
    ASSERT_TRUE(schema.has_value()) << "is the server in " << kPostgresServerVariable
                                    << " running? " << schema.error().to_string();
    schema_ = std::move(*schema);
  }

  std::unique_ptr<PostgresConsensus> open_backend() { return open_backend(schema_->url()); }

  static std::unique_ptr<PostgresConsensus> open_backend(const std::string& url) {
    auto opened = PostgresConsensus::open(url);
    EXPECT_TRUE(opened.has_value()) << opened.error().to_string();
    return opened.has_value() ? std::move(*opened) : nullptr;
  }

  std::unique_ptr<TestConnection> connect(const std::string& url) {
    auto opened = TestConnection::open(url);
    EXPECT_TRUE(opened.has_value()) << opened.error().to_string();
    return opened.has_value() ? std::move(*opened) : nullptr;
  }

  // The first column of each row of `sql`'s result; empty after a failure.
  static std::vector<std::string> query(TestConnection& connection, const std::string& sql) {
    auto rows = connection.query(sql);
    EXPECT_TRUE(rows.has_value()) << rows.error().to_string();
    return rows.value_or(std::vector<std::string>{});
  }

  // Polls `sql` until its first row's first column is not empty and not
  // "0", for up to 10 s; returns that value, or "" on timeout.
  static std::string await_value(TestConnection& connection, const std::string& sql) {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      std::vector<std::string> rows = query(connection, sql);
      if (!rows.empty() && !rows[0].empty() && rows[0] != "0") return rows[0];
      std::this_thread::sleep_for(10ms);
    }
    return "";
  }

  // How many server backends the schema's connections hold.
  std::string count_backends_sql() const {
    return "SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + schema_->name() +
           "'";
  }

  std::unique_ptr<PostgresTestSchema> schema_;
};

TEST_F(PostgresConsensusTest, CreatesTheDocumentedTables) {
  auto consensus = open_backend();
  ASSERT_NE(consensus, nullptr);
  auto admin = connect(schema_->server());
  ASSERT_NE(admin, nullptr);
  std::vector<std::string> columns =
      query(*admin,
            "SELECT table_name || '.' || column_name || ':' || data_type || ':' || is_nullable "
            "FROM information_schema.columns WHERE table_schema = '" +
                schema_->name() + "' ORDER BY table_name, ordinal_position");
  EXPECT_EQ(columns, (std::vector<std::string>{
                         "tidemark_consensus.key:text:NO",
                         "tidemark_consensus.seqno:bigint:NO",
                         "tidemark_consensus.data:bytea:NO",
                         "tidemark_consensus_heads.key:text:NO",
                         "tidemark_consensus_heads.seqno:bigint:NO",
                     }));
}

// libpq never sees call_timeout (it refuses parameters it does not know),
// wherever it stands in the query.
TEST_F(PostgresConsensusTest, TakesItsCallTimeoutFromTheUrl) {
  auto by_default = open_backend();
  ASSERT_NE(by_default, nullptr);
  EXPECT_EQ(by_default->call_timeout(), PostgresConsensus::kDefaultCallTimeout);
  const std::string url = schema_->url();  // it has a query already
  const std::size_t query = url.find('?');
  ASSERT_NE(query, std::string::npos);
  for (const std::string& with :
       {url + "&call_timeout=7",
        url.substr(0, query) + "?call_timeout=7&" + url.substr(query + 1)}) {
    SCOPED_TRACE(with);
    auto backend = open_backend(with);
    ASSERT_NE(backend, nullptr);
    EXPECT_EQ(backend->call_timeout(), std::chrono::seconds(7));
    auto created = backend->compare_and_set("k", std::nullopt, {1, "one"});
    ASSERT_TRUE(created.has_value()) << created.error().to_string();
    auto head = backend->head("k");
    ASSERT_TRUE(head.has_value()) << head.error().to_string();
    ASSERT_TRUE(head->has_value());
  }
}

TEST_F(PostgresConsensusTest, AcceptsBothSchemes) {
  std::string url = schema_->url();
  std::string other = url.starts_with("postgresql://") ? "postgres://" + url.substr(13)
                                                       : "postgresql://" + url.substr(11);
  auto first = open_backend(url);
  auto second = open_backend(other);
  ASSERT_TRUE(first && second);
  auto outcome = first->compare_and_set("key", std::nullopt, {1, "one"});
  ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
  EXPECT_EQ(*outcome, CasOutcome::kCommitted);
  auto head = second->head("key");
  ASSERT_TRUE(head.has_value()) << head.error().to_string();
  EXPECT_EQ(*head, (VersionedData{1, "one"}));
}

TEST_F(PostgresConsensusTest, KilledMidCompareAndSetIsIndeterminateAndTheNextCallReconnects) {
  auto consensus = open_backend();
  ASSERT_NE(consensus, nullptr);
  auto created = consensus->compare_and_set("key", std::nullopt, {1, "one"});
  ASSERT_TRUE(created.has_value() && *created == CasOutcome::kCommitted);

  // Hold the head row's lock, so the compare_and_set below waits on it.
  auto locker = connect(schema_->url());
  ASSERT_NE(locker, nullptr);
  query(*locker, "BEGIN");
  query(*locker, "SELECT seqno FROM tidemark_consensus_heads WHERE key = 'key' FOR UPDATE");

  std::optional<Result<CasOutcome>> outcome;
  std::thread writer([&] { outcome = consensus->compare_and_set("key", 1, {2, "two"}); });

  // Kill the backend that waits for the locker's lock: the statement was
  // sent and its result is never known.
  auto admin = connect(schema_->server());
  ASSERT_NE(admin, nullptr);
  std::string waiting = await_value(
      *admin, "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND " +
                  std::to_string(locker->backend_pid()) + " = ANY(pg_blocking_pids(pid))");
  EXPECT_FALSE(waiting.empty()) << "the compare_and_set never waited on the lock";
  if (waiting.empty()) {
    query(*locker, "ROLLBACK");  // let the writer finish before failing
    writer.join();
    return;
  }
  query(*admin, "SELECT pg_terminate_backend(" + waiting + ")");
  writer.join();
  query(*locker, "ROLLBACK");

  ASSERT_TRUE(outcome.has_value());
  ASSERT_FALSE(outcome->has_value());
  const Error& error = outcome->error();
  EXPECT_EQ(error.kind, ErrorKind::kIndeterminate) << error.to_string();
  EXPECT_NE(error.message.find("compare_and_set \"key\""), std::string::npos) << error.message;
  EXPECT_NE(error.message.find("terminating connection"), std::string::npos) << error.message;

  // The broken connection was dropped; the next calls open a fresh one. The
  // killed statement had not applied (it was still waiting).
  auto head = consensus->head("key");
  ASSERT_TRUE(head.has_value()) << head.error().to_string();
  EXPECT_EQ(*head, (VersionedData{1, "one"}));
  auto retried = consensus->compare_and_set("key", 1, {2, "two"});
  ASSERT_TRUE(retried.has_value()) << retried.error().to_string();
  EXPECT_EQ(*retried, CasOutcome::kCommitted);
}

TEST_F(PostgresConsensusTest, IdleConnectionsKilledByTheServerAreReplacedWithoutErrors) {
  // What a server restart does to a pool: every idle connection dies. Each
  // is noticed when taken from the pool, so no call fails.
  auto consensus = open_backend();
  ASSERT_NE(consensus, nullptr);
  std::vector<std::thread> readers;
  for (int reader = 0; reader < 8; ++reader) {
    readers.emplace_back([&] {
      for (int i = 0; i < 20; ++i) EXPECT_TRUE(consensus->head("key").has_value());
    });
  }
  for (auto& thread : readers) thread.join();

  auto admin = connect(schema_->server());
  ASSERT_NE(admin, nullptr);
  std::vector<std::string> killed = query(*admin,
                                          "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                          "WHERE application_name = '" +
                                              schema_->name() + "'");
  EXPECT_FALSE(killed.empty());
  // Wait until every one of those backends has exited.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (query(*admin, count_backends_sql()) != std::vector<std::string>{"0"} &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }

  std::optional<SeqNo> expected;
  for (SeqNo seqno = 1; seqno <= 20; ++seqno) {
    auto outcome = consensus->compare_and_set("key", expected, {seqno, "v"});
    ASSERT_TRUE(outcome.has_value()) << seqno << ": " << outcome.error().to_string();
    EXPECT_EQ(*outcome, CasOutcome::kCommitted);
    expected = seqno;
  }
  auto head = consensus->head("key");
  ASSERT_TRUE(head.has_value()) << head.error().to_string();
  EXPECT_EQ(*head, (VersionedData{20, "v"}));
}

TEST_F(PostgresConsensusTest, ConnectionsAreBoundedByThePool) {
  auto consensus = open_backend();
  ASSERT_NE(consensus, nullptr);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int thread = 0; thread < 3 * static_cast<int>(PostgresConsensus::kMaxConnections);
       ++thread) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        if (!consensus->scan("key", 0, 10).has_value()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  // Every connection the pool opened is still open, idle.
  auto admin = connect(schema_->server());
  ASSERT_NE(admin, nullptr);
  std::vector<std::string> count = query(*admin, count_backends_sql());
  ASSERT_EQ(count.size(), 1u);
  EXPECT_GE(std::stoi(count[0]), 1);
  EXPECT_LE(std::stoi(count[0]), static_cast<int>(PostgresConsensus::kMaxConnections));
}

TEST_F(PostgresConsensusTest, TwoInstancesRacingCompareAndSetCommitEachSeqnoOnce) {
  // Two instances stand for two processes: nothing is shared but the server.
  constexpr int kIncrements = 200;
  constexpr int kThreadsPerInstance = 3;
  std::unique_ptr<PostgresConsensus> instances[] = {open_backend(), open_backend()};
  ASSERT_TRUE(instances[0] && instances[1]);

  std::atomic<int> committed{0};
  std::atomic<int> failures{0};
  std::vector<std::vector<SeqNo>> won(2 * kThreadsPerInstance);
  std::vector<std::thread> threads;
  for (int thread = 0; thread < 2 * kThreadsPerInstance; ++thread) {
    threads.emplace_back([&, thread] {
      Consensus& consensus = *instances[thread % 2];
      const std::string data = "writer " + std::to_string(thread);
      while (committed.load() < kIncrements) {
        auto current = consensus.head("race");
        if (!current.has_value()) {
          ADD_FAILURE() << current.error().to_string();
          ++failures;
          return;
        }
        std::optional<SeqNo> expected;
        if (*current) expected = (*current)->seqno;
        SeqNo next = expected.value_or(0) + 1;
        auto outcome = consensus.compare_and_set("race", expected, {next, data});
        if (!outcome.has_value()) {
          ADD_FAILURE() << outcome.error().to_string();
          ++failures;
          return;
        }
        if (*outcome == CasOutcome::kCommitted) {
          won[thread].push_back(next);
          ++committed;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(failures.load(), 0);

  std::map<SeqNo, int> winner;
  for (int thread = 0; thread < 2 * kThreadsPerInstance; ++thread) {
    for (SeqNo seqno : won[thread]) {
      EXPECT_TRUE(winner.emplace(seqno, thread).second) << "seqno " << seqno << " won twice";
    }
  }
  auto total = static_cast<SeqNo>(committed.load());
  EXPECT_EQ(winner.size(), total);
  auto log = instances[1]->scan("race", 0, SIZE_MAX);
  ASSERT_TRUE(log.has_value()) << log.error().to_string();
  ASSERT_EQ(log->size(), total);
  for (SeqNo index = 0; index < total; ++index) {
    EXPECT_EQ((*log)[index].seqno, index + 1);
    EXPECT_EQ((*log)[index].data, "writer " + std::to_string(winner[index + 1]));
  }
}

TEST_F(PostgresConsensusTest, InstancesOpenedAtOnceCreateTheTablesWithoutErrors) {
  constexpr int kOpeners = 8;
  constexpr int kRounds = 3;  // each round on a fresh, empty schema
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto schema = PostgresTestSchema::create(schema_->server());
    ASSERT_TRUE(schema.has_value()) << schema.error().to_string();
    const std::string url = (*schema)->url();

    std::vector<std::unique_ptr<PostgresConsensus>> opened(kOpeners);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int opener = 0; opener < kOpeners; ++opener) {
      threads.emplace_back([&, opener] {
        // Start together, to race on the catalog.
        ++ready;
        while (ready.load() < kOpeners) std::this_thread::yield();
        auto consensus = PostgresConsensus::open(url);
        EXPECT_TRUE(consensus.has_value()) << consensus.error().to_string();
        if (consensus.has_value()) opened[opener] = std::move(*consensus);
      });
    }
    for (auto& thread : threads) thread.join();
    for (const auto& consensus : opened) ASSERT_NE(consensus, nullptr);

    auto outcome = opened[0]->compare_and_set("key", std::nullopt, {1, "one"});
    ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
    EXPECT_EQ(*outcome, CasOutcome::kCommitted);
    auto head = opened[kOpeners - 1]->head("key");
    ASSERT_TRUE(head.has_value()) << head.error().to_string();
    EXPECT_EQ(*head, (VersionedData{1, "one"}));
    opened.clear();  // before the schema is dropped
  }
}

TEST_F(PostgresConsensusTest, ServerErrorsOnReadsAndWritesAreDeterminate) {
  // A statement the server refuses (here: the tables are gone) rolled back,
  // so even a write reports Determinate, and names what failed.
  auto consensus = open_backend();
  ASSERT_NE(consensus, nullptr);
  auto admin = connect(schema_->url());
  ASSERT_NE(admin, nullptr);
  query(*admin, "DROP TABLE tidemark_consensus");

  auto outcome = consensus->compare_and_set("key", std::nullopt, {1, "one"});
  ASSERT_FALSE(outcome.has_value());
  EXPECT_EQ(outcome.error().kind, ErrorKind::kDeterminate) << outcome.error().to_string();
  EXPECT_NE(outcome.error().message.find("compare_and_set \"key\""), std::string::npos)
      << outcome.error().message;
  auto head = consensus->head("key");
  ASSERT_FALSE(head.has_value());
  EXPECT_EQ(head.error().kind, ErrorKind::kDeterminate) << head.error().to_string();
}

// Records a backend's change hints for a test to wait on.
class HintRecorder {
 public:
  std::function<void(const ChangeHint&)> callback() {
    return [this](const ChangeHint& hint) {
      std::lock_guard lock(mutex_);
      hints_.push_back(hint);
      arrived_.notify_all();
    };
  }

  // Waits up to 10 s for a hint after the first `from` that `match`es;
  // its index, or -1.
  int await(std::size_t from, const std::function<bool(const ChangeHint&)>& match) {
    std::unique_lock lock(mutex_);
    int found = -1;
    arrived_.wait_for(lock, 10s, [&] {
      for (std::size_t i = from; i < hints_.size(); ++i) {
        if (match(hints_[i])) {
          found = static_cast<int>(i);
          return true;
        }
      }
      return false;
    });
    return found;
  }
  int await_kind(std::size_t from, ChangeHint::Kind kind) {
    return await(from, [kind](const ChangeHint& hint) { return hint.kind == kind; });
  }
  int await_key(std::size_t from, const std::string& key, SeqNo seqno) {
    return await(from, [&](const ChangeHint& hint) {
      return hint.kind == ChangeHint::Kind::kKey && hint.key == key && hint.seqno == seqno;
    });
  }
  std::vector<ChangeHint> hints() {
    std::lock_guard lock(mutex_);
    return hints_;
  }
  std::size_t size() {
    std::lock_guard lock(mutex_);
    return hints_.size();
  }

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::vector<ChangeHint> hints_;  // guarded by mutex_
};

TEST_F(PostgresConsensusTest, CommittedCompareAndSetsHintAnotherInstance) {
  auto writer = open_backend();
  auto watcher = open_backend();
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(watcher, nullptr);
  HintRecorder recorder;
  std::optional<std::uint64_t> id = watcher->subscribe_change_hints(recorder.callback());
  ASSERT_TRUE(id.has_value());
  // The channel is up: the first hint says so (read everything).
  ASSERT_EQ(recorder.await_kind(0, ChangeHint::Kind::kAll), 0);

  auto outcome = writer->compare_and_set("k", std::nullopt, {1, "one"});
  ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
  ASSERT_EQ(*outcome, CasOutcome::kCommitted);
  EXPECT_GE(recorder.await_key(0, "k", 1), 0) << "no hint for k at 1";
  outcome = writer->compare_and_set("k", 1, {2, "two"});
  ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
  EXPECT_GE(recorder.await_key(0, "k", 2), 0) << "no hint for k at 2";

  // A lost race commits nothing and hints nothing. Notifications of one
  // session arrive in commit order, so once a later one is here, one for
  // the mismatch would have been too.
  outcome = writer->compare_and_set("k", 1, {3, "stale"});
  ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
  EXPECT_EQ(*outcome, CasOutcome::kExpectationMismatch);
  outcome = writer->compare_and_set("other", std::nullopt, {1, "x"});
  ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
  ASSERT_GE(recorder.await_key(0, "other", 1), 0);
  for (const ChangeHint& hint : recorder.hints()) {
    EXPECT_FALSE(hint.kind == ChangeHint::Kind::kKey && hint.seqno == 3) << hint.key;
  }

  // A key too long for NOTIFY's payload still commits, and hints kAll.
  const std::size_t before_long = recorder.size();
  const std::string long_key(9000, 'x');
  outcome = writer->compare_and_set(long_key, std::nullopt, {1, "long"});
  ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
  EXPECT_EQ(*outcome, CasOutcome::kCommitted);
  EXPECT_GE(recorder.await_kind(before_long, ChangeHint::Kind::kAll), 0);

  // A second subscriber shares the one LISTEN connection, and is greeted.
  HintRecorder second;
  std::optional<std::uint64_t> second_id = watcher->subscribe_change_hints(second.callback());
  ASSERT_TRUE(second_id.has_value());
  EXPECT_EQ(second.await_kind(0, ChangeHint::Kind::kAll), 0);
  auto admin = connect(schema_->server());
  ASSERT_NE(admin, nullptr);
  EXPECT_EQ(query(*admin, "SELECT count(*) FROM pg_stat_activity WHERE application_name = '" +
                              schema_->name() + "' AND query LIKE 'LISTEN %'"),
            std::vector<std::string>{"1"});

  // Unsubscribed: no more hints.
  watcher->unsubscribe_change_hints(*id);
  const std::size_t ended_at = recorder.size();
  outcome = writer->compare_and_set("k", 2, {3, "three"});
  ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
  ASSERT_GE(second.await_key(0, "k", 3), 0);
  EXPECT_EQ(recorder.size(), ended_at);
  watcher->unsubscribe_change_hints(*second_id);
}

TEST_F(PostgresConsensusTest, ChangeHintsComeBackAfterTheListenConnectionIsKilled) {
  // Notifications sent while the LISTEN connection is down are lost: the
  // subscriber hears kLost, then kAll once it is back (read everything),
  // and hints flow again.
  auto writer = open_backend();
  auto watcher = open_backend();
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(watcher, nullptr);
  HintRecorder recorder;
  ASSERT_TRUE(watcher->subscribe_change_hints(recorder.callback()).has_value());
  ASSERT_EQ(recorder.await_kind(0, ChangeHint::Kind::kAll), 0);

  auto admin = connect(schema_->server());
  ASSERT_NE(admin, nullptr);
  const std::string listeners = "SELECT pid FROM pg_stat_activity WHERE application_name = '" +
                                schema_->name() + "' AND query LIKE 'LISTEN %'";
  std::vector<std::string> pids = query(*admin, listeners);
  ASSERT_EQ(pids.size(), 1u);
  query(*admin, "SELECT pg_terminate_backend(" + pids[0] + ")");
  const int lost = recorder.await_kind(1, ChangeHint::Kind::kLost);
  ASSERT_GE(lost, 1) << "the killed connection was not noticed";

  // Committed while it is down (it waits at least 50 ms to reconnect).
  auto outcome = writer->compare_and_set("k", std::nullopt, {1, "one"});
  ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
  ASSERT_EQ(*outcome, CasOutcome::kCommitted);
  const int back = recorder.await_kind(static_cast<std::size_t>(lost), ChangeHint::Kind::kAll);
  ASSERT_GT(back, lost) << "the LISTEN connection did not come back";
  auto head = watcher->head("k");
  ASSERT_TRUE(head.has_value()) << head.error().to_string();
  ASSERT_TRUE(head->has_value());
  EXPECT_EQ((*head)->seqno, 1u);

  outcome = writer->compare_and_set("k", 1, {2, "two"});
  ASSERT_TRUE(outcome.has_value()) << outcome.error().to_string();
  EXPECT_GE(recorder.await_key(static_cast<std::size_t>(back), "k", 2), 0);
  pids = query(*admin, listeners);
  EXPECT_EQ(pids.size(), 1u);
}

TEST_F(PostgresConsensusTest, ABackendWithoutHintSubscribersOpensNoListenConnection) {
  auto consensus = open_backend();
  ASSERT_NE(consensus, nullptr);
  ASSERT_TRUE(consensus->compare_and_set("k", std::nullopt, {1, "one"}).has_value());
  auto admin = connect(schema_->server());
  ASSERT_NE(admin, nullptr);
  EXPECT_EQ(query(*admin, "SELECT count(*) FROM pg_stat_activity WHERE application_name = '" +
                              schema_->name() + "' AND query LIKE 'LISTEN %'"),
            std::vector<std::string>{"0"});
}

}  // namespace
}  // namespace tidemark
