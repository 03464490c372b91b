#include "location/sqlite_consensus.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include "testing/scratch_directory.h"

namespace tidemark {
namespace {

struct IncrementReport {
  int committed = 0;
  int mismatches = 0;
  std::string error;  // empty unless a call failed
};

// Opens its own connection to `path` and commits `count` increments of
// "shared" by looping head, then compare_and_set(head, head + 1).
IncrementReport increment(const std::string& path, const std::string& writer, int count) {
  IncrementReport report;
  auto opened = SqliteConsensus::open(path);
  if (!opened) {
    report.error = opened.error().to_string();
    return report;
  }
  Consensus& consensus = **opened;
  while (report.committed < count) {
    auto head = consensus.head("shared");
    if (!head) {
      report.error = head.error().to_string();
      return report;
    }
    std::optional<SeqNo> expected;
    if (*head) expected = (*head)->seqno;
    auto outcome =
        consensus.compare_and_set("shared", expected, {expected.value_or(0) + 1, writer});
    if (!outcome) {
      report.error = outcome.error().to_string();
      return report;
    }
    if (*outcome == CasOutcome::kCommitted) {
      ++report.committed;
    } else {
      ++report.mismatches;
    }
  }
  return report;
}

// Checks that "shared" holds versions 1..total, `each` by every writer.
void expect_log(const std::string& path, int total, const std::map<std::string, int>& by_writer) {
  auto opened = SqliteConsensus::open(path);
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  auto head = (*opened)->head("shared");
  ASSERT_TRUE(head.has_value() && head->has_value());
  EXPECT_EQ((*head)->seqno, static_cast<SeqNo>(total));
  auto log = (*opened)->scan("shared", 0, SIZE_MAX);
  ASSERT_TRUE(log.has_value());
  ASSERT_EQ(log->size(), static_cast<std::size_t>(total));
  std::map<std::string, int> counted;
  for (std::size_t i = 0; i < log->size(); ++i) {
    EXPECT_EQ((*log)[i].seqno, i + 1);
    ++counted[(*log)[i].data];
  }
  EXPECT_EQ(counted, by_writer);
}

// The child does not start threads, so this also runs under ThreadSanitizer.
TEST(SqliteConsensusTest, SharedByTwoProcesses) {
  constexpr int kEach = 200;
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/shared.db";
  std::fflush(nullptr);  // the child must not flush the parent's buffered output again
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Child: its own connection, opened after fork(); report by exit status
    // and stderr (no gtest assertions in a forked child).
    IncrementReport report = increment(path, "child", kEach);
    if (!report.error.empty()) std::fprintf(stderr, "child: %s\n", report.error.c_str());
    ::_exit(report.error.empty() && report.committed == kEach ? 0 : 1);
  }
  IncrementReport report = increment(path, "parent", kEach);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(report.error.empty()) << report.error;
  EXPECT_EQ(report.committed, kEach);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  expect_log(path, 2 * kEach, {{"child", kEach}, {"parent", kEach}});
}

TEST(SqliteConsensusTest, SharedByTwoConnectionsInOneProcess) {
  constexpr int kEach = 50;
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/shared.db";
  IncrementReport first;
  IncrementReport second;
  std::thread other([&] { second = increment(path, "second", kEach); });
  first = increment(path, "first", kEach);
  other.join();
  EXPECT_TRUE(first.error.empty()) << first.error;
  EXPECT_TRUE(second.error.empty()) << second.error;
  expect_log(path, 2 * kEach, {{"first", kEach}, {"second", kEach}});
}

// head_seqnos keeps what it read while no other connection commits: what
// it answers must still follow this connection's own commits (single and
// batched, including a lost comparison), another instance's on the same
// file, and another process's.
TEST(SqliteConsensusTest, HeadSeqnosFollowEveryWriter) {
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/heads.db";
  auto mine = SqliteConsensus::open(path);
  auto other = SqliteConsensus::open(path);
  ASSERT_TRUE(mine.has_value() && other.has_value());
  auto heads = [&] {
    auto seqnos = (*mine)->head_seqnos({"a", "b", "c"});
    EXPECT_TRUE(seqnos.has_value()) << seqnos.error().to_string();
    return seqnos ? *seqnos : std::vector<std::optional<SeqNo>>{};
  };
  using Heads = std::vector<std::optional<SeqNo>>;
  EXPECT_EQ(heads(), (Heads{std::nullopt, std::nullopt, std::nullopt}));
  ASSERT_EQ((*mine)->compare_and_set("a", std::nullopt, {1, "a1"}), CasOutcome::kCommitted);
  EXPECT_EQ(heads(), (Heads{1, std::nullopt, std::nullopt}));
  ASSERT_EQ((*other)->compare_and_set("b", std::nullopt, {1, "b1"}), CasOutcome::kCommitted);
  EXPECT_EQ(heads(), (Heads{1, 1, std::nullopt}));
  auto batch = (*mine)->compare_and_set_many({{"a", 1, {2, "a2"}}, {"c", 4, {5, "c5"}}});
  ASSERT_TRUE(batch[0].has_value() && batch[1].has_value());
  EXPECT_EQ(*batch[1], CasOutcome::kExpectationMismatch);
  EXPECT_EQ(heads(), (Heads{2, 1, std::nullopt}));
  std::fflush(nullptr);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto own = SqliteConsensus::open(path);
    bool ok = own.has_value() &&
              (*own)->compare_and_set("c", std::nullopt, {7, "c7"}) == CasOutcome::kCommitted;
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(heads(), (Heads{2, 1, 7}));
  ASSERT_EQ((*mine)->compare_and_set("c", 7, {8, "c8"}), CasOutcome::kCommitted);
  ASSERT_EQ((*other)->compare_and_set("a", 2, {3, "a3"}), CasOutcome::kCommitted);
  EXPECT_EQ(heads(), (Heads{3, 1, 8}));
}

TEST(SqliteConsensusTest, VersionsSurviveReopening) {
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/consensus.db";
  {
    auto opened = SqliteConsensus::open(path);
    ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
    auto outcome = (*opened)->compare_and_set("key", std::nullopt, {1, "state"});
    ASSERT_TRUE(outcome.has_value());
    EXPECT_EQ(*outcome, CasOutcome::kCommitted);
  }
  auto reopened = SqliteConsensus::open(path);
  ASSERT_TRUE(reopened.has_value()) << reopened.error().to_string();
  auto head = (*reopened)->head("key");
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(*head, (VersionedData{1, "state"}));
}

TEST(SqliteConsensusTest, CreatesTheParentDirectory) {
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/a/b/consensus.db";
  auto opened = SqliteConsensus::open(path);
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  EXPECT_EQ((*opened)->path(), path);
  EXPECT_TRUE(std::filesystem::is_regular_file(path));
}

TEST(SqliteConsensusTest, UsesWalAndTheDocumentedTable) {
  ScratchDirectory scratch;
  const std::string path = scratch.path() + "/consensus.db";
  auto opened = SqliteConsensus::open(path);
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();

  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> reader(raw, &sqlite3_close);
  auto first_text = [&](const char* sql) {
    sqlite3_stmt* statement = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(reader.get(), sql, -1, &statement, nullptr), SQLITE_OK) << sql;
    std::string out;
    if (sqlite3_step(statement) == SQLITE_ROW) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(statement, 0));
    }
    sqlite3_finalize(statement);
    return out;
  };
  EXPECT_EQ(first_text("PRAGMA journal_mode"), "wal");
  std::string schema = first_text("SELECT sql FROM sqlite_master WHERE name = 'consensus'");
  EXPECT_NE(schema.find("PRIMARY KEY(shard_key, seqno)"), std::string::npos) << schema;
}

TEST(SqliteConsensusTest, OpeningADirectoryFailsDeterminately) {
  ScratchDirectory scratch;
  auto opened = SqliteConsensus::open(scratch.path());
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(opened.error().message.find(scratch.path()), std::string::npos)
      << opened.error().to_string();
}

}  // namespace
}  // namespace tidemark
