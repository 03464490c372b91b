// The nemesis test's checker (nemesis_checker.h) on made-up observations: a
// consistent run passes, and each kind of anomaly the nemesis hunts for is
// reported. A checker that cannot fail proves nothing.
#include "nemesis_checker.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tidemark::testing::nemesis {
namespace {

std::string quoted(const std::string& key) {
  return "\"" + key + "\"";
}

Update record(Time time, const std::string& key, const std::string& value) {
  return Update{.time = time, .key = quoted(key), .value = value, .diff = 1};
}

std::string row_line(const Update& u, bool with_time) {
  std::string line = "{\"key\":" + u.key + ",\"value\":" + u.value;
  if (with_time) line += ",\"time\":" + std::to_string(u.time);
  return line + ",\"diff\":" + std::to_string(u.diff) + "}";
}

// A small consistent run: producer p0 sent 0..3 (0..2 acknowledged, 3
// committed without an answer), an explicit winner at 20, a loser and an
// unknown at 20, an acknowledged group at 30.
struct MadeUpRun {
  Observations seen;
  std::vector<Update> history;

  MadeUpRun() {
    ProducerLog producer;
    producer.id = "p0";
    producer.key_prefix = "p0-";
    producer.sent = 4;
    producer.acked = 3;
    producer.committed_sequence = 3;
    seen.producers.push_back(producer);
    seen.explicits.push_back({.key = "x0-0", .at = 20, .outcome = ExplicitAttempt::Outcome::kWon});
    seen.explicits.push_back({.key = "x1-0", .at = 20, .outcome = ExplicitAttempt::Outcome::kLost});
    seen.explicits.push_back(
        {.key = "x1-1", .at = 20, .outcome = ExplicitAttempt::Outcome::kUnknown});
    seen.groups.push_back({.keys = {"g0-0-0", "g0-0-1"}, .acked = true});
    seen.groups.push_back({.keys = {"g0-1-0", "g0-1-1"}, .acked = false});
    seen.other_sent.insert("genesis");
    history = {record(5, "genesis", "0"), record(10, "p0-0", "0"),  record(10, "p0-1", "1"),
               record(15, "p0-2", "2"),   record(20, "x0-0", "0"),  record(25, "p0-3", "3"),
               record(30, "g0-0-0", "0"), record(30, "g0-0-1", "0")};
  }

  Digest at(Time time) const {
    Digest d;
    for (const Update& u : history) {
      if (u.time <= time) d.add(u.key, u.value, u.diff);
    }
    return d;
  }

  // A snapshot observation at `time` as a follower builds it from lines.
  SnapshotObservation snapshot(Time time) const {
    std::vector<Update> rows;
    for (const Update& u : history) {
      if (u.time <= time) rows.push_back(u);
    }
    std::sort(rows.begin(), rows.end(),
              [](const Update& a, const Update& b) { return a.key < b.key; });
    SnapshotFollower follower(time);
    for (const Update& u : rows) EXPECT_EQ(follower.feed(row_line(u, false)), LineKind::kRow);
    return follower.observation();
  }

  // A listen from `from` with a progress after each time, as lines.
  std::vector<std::string> listen_lines(Time from, Time until) const {
    std::vector<std::string> lines;
    Time last = 0;
    for (const Update& u : history) {
      if (u.time <= from || u.time >= until) continue;
      if (last != 0 && u.time != last)
        lines.push_back("{\"progress\":" + std::to_string(last + 1) + "}");
      lines.push_back(row_line(u, true));
      last = u.time;
    }
    lines.push_back("{\"progress\":" + std::to_string(until) + "}");
    return lines;
  }

  ListenObservation listen(Time from, Time until, const std::vector<std::string>& lines) const {
    ListenFollower follower(from, until);
    for (const std::string& line : lines) follower.feed(line);
    return follower.observation();
  }

  Verdict check() const { return check_history(seen, History(history)); }
};

::testing::AssertionResult reports(const Verdict& verdict, const std::string& words) {
  for (const std::string& v : verdict.violations) {
    if (v.find(words) != std::string::npos) return ::testing::AssertionSuccess();
  }
  auto failure = ::testing::AssertionFailure() << "no violation mentions \"" << words << "\"; got:";
  for (const std::string& v : verdict.violations) failure << "\n  " << v;
  return failure;
}

TEST(NemesisCheckerTest, AConsistentRunPasses) {
  MadeUpRun run;
  run.seen.snapshots.push_back(run.snapshot(12));
  run.seen.snapshots.push_back(run.snapshot(29));
  run.seen.snapshots.push_back(run.snapshot(0));
  ListenObservation listen = run.listen(12, 31, run.listen_lines(12, 31));
  EXPECT_TRUE(listen.problems.empty()) << listen.problems.front();
  listen.snapshot_at_from = 0;
  listen.snapshots_at_progress.emplace_back(31, run.seen.snapshots.size());
  run.seen.snapshots.push_back(run.snapshot(30));
  run.seen.listens.push_back(listen);
  const Verdict verdict = run.check();
  EXPECT_TRUE(verdict.violations.empty()) << verdict.violations.front();
  EXPECT_EQ(verdict.records, 8u);
  EXPECT_EQ(verdict.producer_unacked_present, 1u);
  EXPECT_EQ(verdict.snapshot_pairs_checked, 1u);
  EXPECT_GT(verdict.listen_frontiers_checked, 2u);
}

TEST(NemesisCheckerTest, RecordsTwiceMissingOrNeverSentAreReported) {
  MadeUpRun twice;
  twice.history.push_back(record(40, "p0-1", "1"));
  EXPECT_TRUE(reports(twice.check(), "p0-1 is present twice"));

  MadeUpRun missing;
  missing.history.erase(missing.history.begin() + 3);  // p0-2, acknowledged
  missing.seen.producers[0].committed_sequence = 2;
  EXPECT_TRUE(reports(missing.check(), "not a prefix"));
  missing.history.pop_back();  // g0-0-1
  EXPECT_TRUE(reports(missing.check(), "1 of 2 records present"));

  MadeUpRun unsent;
  unsent.history.push_back(record(40, "p0-9", "9"));  // beyond what p0 sent
  EXPECT_TRUE(reports(unsent.check(), "p0-9 was never sent"));
  unsent.history.push_back(record(41, "stranger", "1"));
  EXPECT_TRUE(reports(unsent.check(), "stranger was never sent"));

  MadeUpRun lost_ack;
  lost_ack.history.erase(lost_ack.history.begin() + 5);  // p0-3 (unacknowledged): fine
  lost_ack.history.erase(lost_ack.history.begin() + 3);  // p0-2 (acknowledged): not
  lost_ack.seen.producers[0].committed_sequence = 1;
  EXPECT_TRUE(reports(lost_ack.check(), "3 records acknowledged, 2 present"));

  MadeUpRun sequence;
  sequence.seen.producers[0].committed_sequence = 7;
  EXPECT_TRUE(reports(sequence.check(), "the shard's sequence is 7"));
}

TEST(NemesisCheckerTest, ExplicitAndAllOrNothingAnomaliesAreReported) {
  MadeUpRun two_winners;
  two_winners.seen.explicits[2].outcome = ExplicitAttempt::Outcome::kWon;
  two_winners.history.push_back(record(20, "x1-1", "1"));
  const Verdict verdict = two_winners.check();
  EXPECT_TRUE(reports(verdict, "two explicit appends won from the upper 20"));
  EXPECT_TRUE(reports(verdict, "shares its time"));

  MadeUpRun loser;
  loser.history.push_back(record(21, "x1-0", "0"));
  EXPECT_TRUE(reports(loser.check(), "x1-0 lost (409)"));
  EXPECT_TRUE(reports(loser.check(), "is at time 21"));

  MadeUpRun gone;
  gone.history.erase(gone.history.begin() + 4);
  EXPECT_TRUE(reports(gone.check(), "x0-0 won at 20 but is missing"));

  MadeUpRun crowded;
  crowded.history.push_back(record(20, "g0-1-0", "1"));
  crowded.history.push_back(record(20, "g0-1-1", "1"));
  EXPECT_TRUE(reports(crowded.check(), "shares its time with 2 other records"));

  MadeUpRun partial;
  partial.history.push_back(record(40, "g0-1-0", "1"));
  EXPECT_TRUE(reports(partial.check(), "partly present"));
  partial.history.push_back(record(41, "g0-1-1", "1"));
  EXPECT_TRUE(reports(partial.check(), "committed at 2 times"));
}

TEST(NemesisCheckerTest, SnapshotsThatDisagreeWithTheHistoryAreReported) {
  MadeUpRun run;
  SnapshotObservation snapshot = run.snapshot(20);
  snapshot.digest.add("\"p0-3\"", "3", 1);  // a record from the future
  run.seen.snapshots.push_back(snapshot);
  EXPECT_TRUE(reports(run.check(), "snapshot at 20 has 6 rows"));

  SnapshotFollower follower(20);
  follower.feed(row_line(record(10, "p0-1", "1"), false));
  follower.feed(row_line(record(10, "p0-0", "0"), false));  // out of order
  Update doubled = record(10, "p0-2", "2");
  doubled.diff = 2;
  follower.feed(row_line(doubled, false));
  EXPECT_EQ(follower.feed("{\"key\":\"p0-3\",\"value\":3"), LineKind::kMalformed);
  run.seen.snapshots = {follower.observation()};
  const Verdict verdict = run.check();
  EXPECT_TRUE(reports(verdict, "out of order"));
  EXPECT_TRUE(reports(verdict, "diff 2"));
  EXPECT_TRUE(reports(verdict, "malformed"));
}

TEST(NemesisCheckerTest, ListensWithGapsDisorderOrWrongProgressAreReported) {
  MadeUpRun gap;
  std::vector<std::string> lines = gap.listen_lines(0, 31);
  lines.erase(lines.begin() + 3);  // an update
  gap.seen.listens.push_back(gap.listen(0, 31, lines));
  EXPECT_TRUE(reports(gap.check(), "listen from 0 up to progress"));

  MadeUpRun disorder;
  ListenFollower follower(0, 31);
  follower.feed(row_line(record(10, "p0-1", "1"), true));
  follower.feed(row_line(record(10, "p0-0", "0"), true));
  follower.feed("{\"progress\":11}");
  follower.feed(row_line(record(10, "p0-9", "9"), true));  // below the progress
  follower.feed("{\"progress\":11}");                      // not increasing
  follower.feed(row_line(record(40, "p0-8", "8"), true));  // past until
  disorder.seen.listens.push_back(follower.observation());
  const Verdict verdict = disorder.check();
  EXPECT_TRUE(reports(verdict, "out of (time, key, value) order"));
  EXPECT_TRUE(reports(verdict, "below the last progress 11"));
  EXPECT_TRUE(reports(verdict, "progress 11 after 11"));
  EXPECT_TRUE(reports(verdict, "at or after until"));

  // The listen agrees with the history, but not with the snapshots taken.
  MadeUpRun pair;
  ListenObservation listen = pair.listen(12, 31, pair.listen_lines(12, 31));
  SnapshotObservation at_from = pair.snapshot(12);
  at_from.digest.add("\"p0-0\"", "0", -1);
  pair.seen.snapshots = {at_from, pair.snapshot(30)};
  listen.snapshot_at_from = 0;
  listen.snapshots_at_progress.emplace_back(31, 1);
  pair.seen.listens.push_back(listen);
  EXPECT_TRUE(reports(pair.check(), "but snapshot(30) - snapshot(12)"));
}

TEST(NemesisCheckerTest, FollowersResumeWhereTheyStopped) {
  ListenFollower listen(5, 100);
  EXPECT_EQ(listen.query(), "from=5&until=100");
  listen.feed(row_line(record(10, "a", "1"), true));
  listen.feed("{\"progress\":11}");
  listen.feed(row_line(record(12, "b", "1"), true));
  // Broken: from the last progress, what came after it is dropped.
  EXPECT_EQ(listen.resume_after_break(), "from=10&until=100");
  EXPECT_EQ(listen.observation().updates.size(), 1u);
  listen.feed("{\"progress\":11}");  // a new request may repeat it
  listen.feed(row_line(record(12, "b", "1"), true));
  EXPECT_EQ(listen.feed("{\"error\":\"blob \\\"x\\\" failed\",\"resume\":\"from=10&until=100&"
                        "after_time=12&after_key=%22b%22&after_value=1\"}"),
            LineKind::kError);
  EXPECT_EQ(listen.last_error(), "blob \"x\" failed");
  EXPECT_EQ(listen.resume_after_error(),
            "from=10&until=100&after_time=12&after_key=%22b%22&after_value=1");
  listen.feed("{\"progress\":100}");
  EXPECT_TRUE(listen.done());
  EXPECT_TRUE(listen.observation().problems.empty()) << listen.observation().problems.front();
  EXPECT_EQ(listen.observation().updates.size(), 2u);

  SnapshotFollower snapshot(7);
  EXPECT_EQ(snapshot.resume_after_break(), "as_of=7");
  snapshot.feed("{\"key\":\"k 1/\",\"value\":12,\"diff\":1}");
  EXPECT_EQ(snapshot.resume_after_break(), "as_of=7&after_key=%22k%201%2F%22&after_value=12");
  EXPECT_EQ(snapshot.observation().resumes, 2);
}

}  // namespace
}  // namespace tidemark::testing::nemesis
