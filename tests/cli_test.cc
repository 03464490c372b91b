// The command-line contract (README, "Using it"), run against the real
// `tidemark` binary on the embedded default (files + SQLite); s3:// sinks
// (`sink run`, and `serve`'s POST /v1/sinks) also against the S3 server of
// TIDEMARK_TEST_S3 (s3_test_prefix.h: skipped without it).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "server_process.h"
#include "testing/kafka_mock_process.h"
#include "testing/s3_test_prefix.h"
#include "testing/server_client.h"
#include "testing/silent_listener.h"

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int status = -1;
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tidemark-cli-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `tidemark --data DIR args...` with `input` on stdin.
  Outcome tidemark(const std::string& args, const std::string& input = "") {
    return run("--data " + shell_quote((dir_ / "data").string()) + " " + args, input);
  }

  // Runs `tidemark args...` with `input` on stdin.
  Outcome run(const std::string& args, const std::string& input = "") {
    std::ofstream(dir_ / "stdin", std::ios::binary) << input;
    std::string command = std::string(TIDEMARK_BINARY) + " " + args + " < " +
                          shell_quote((dir_ / "stdin").string()) + " > " +
                          shell_quote((dir_ / "stdout").string()) + " 2> " +
                          shell_quote((dir_ / "stderr").string());
    int raw = std::system(command.c_str());
    Outcome run;
    run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    run.out = slurp(dir_ / "stdout");
    run.err = slurp(dir_ / "stderr");
    return run;
  }

  std::size_t part_files() {
    std::size_t n = 0;
    fs::path blob = dir_ / "data" / "blob";
    if (!fs::exists(blob)) return 0;
    for (const auto& entry : fs::recursive_directory_iterator(blob)) {
      if (entry.is_regular_file() && entry.path().parent_path().filename() == "part") ++n;
    }
    return n;
  }

  fs::path dir_;
};

TEST_F(CliTest, ShardCreateListInspect) {
  EXPECT_EQ(tidemark("shard create orders").status, 0);
  EXPECT_EQ(tidemark("shard create alpha").status, 0);
  Outcome again = tidemark("shard create orders");
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.err.find("already exists"), std::string::npos);
  EXPECT_EQ(tidemark("shard create 'bad/name'").status, 2);
  Outcome list = tidemark("shard list");
  EXPECT_EQ(list.status, 0);
  EXPECT_EQ(list.out, "alpha\norders\n");
  Outcome inspect = tidemark("shard inspect orders --json");
  EXPECT_EQ(inspect.status, 0);
  EXPECT_EQ(inspect.out,
            "{\"name\":\"orders\",\"upper\":0,\"since\":0,\"seqno\":0,\"batches\":0,\"parts\":0,"
            "\"inline_parts\":0,"
            "\"updates\":0,\"bytes\":0,\"readers\":[],\"writers\":[]}\n");
  EXPECT_EQ(tidemark("shard inspect missing").status, 1);
  EXPECT_EQ(tidemark("shard frobnicate").status, 2);
  EXPECT_EQ(tidemark("nonsense").status, 2);
}

// shard delete deletes a shard and its data; a sink's hold refuses it
// (exit 1, naming the hold) unless --force; the name can be created again.
TEST_F(CliTest, ShardsAreDeleted) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  ASSERT_EQ(tidemark("append s --lower 0 --upper 3",
                     "{\"key\":\"a\",\"value\":1,\"time\":0}\n{\"key\":\"b\",\"value\":1,"
                     "\"time\":2}\n")
                .status,
            0);
  ASSERT_EQ(
      tidemark("sink run s --to file://" + (dir_ / "out").string() + " --as-of 0 --until 3").status,
      0);
  Outcome held = tidemark("shard delete s");
  EXPECT_EQ(held.status, 1);
  EXPECT_NE(held.err.find("c-sink-s"), std::string::npos) << held.err;
  EXPECT_EQ(tidemark("shard list").out, "s\n");
  EXPECT_EQ(tidemark("shard delete s --json").status, 2);
  EXPECT_EQ(tidemark("shard list --force").status, 2);
  Outcome deleted = tidemark("shard delete s --force");
  EXPECT_EQ(deleted.status, 0) << deleted.err;
  EXPECT_EQ(deleted.out.rfind("deleted shard s (", 0), 0u) << deleted.out;
  EXPECT_EQ(tidemark("shard list").out, "");
  Outcome gone = tidemark("shard delete s");
  EXPECT_EQ(gone.status, 1);
  EXPECT_NE(gone.err.find("no shard named s"), std::string::npos) << gone.err;
  EXPECT_EQ(tidemark("snapshot s").status, 1);
  ASSERT_EQ(tidemark("shard create s").status, 0);
  Outcome inspect = tidemark("shard inspect s");
  EXPECT_NE(inspect.out.find("upper:   0\n"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("updates: 0\n"), std::string::npos) << inspect.out;
}

// shard inspect names the holds on the since; shard release drops one.
TEST_F(CliTest, HoldsAreListedAndReleased) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  ASSERT_EQ(tidemark("append s --lower 0 --upper 3",
                     "{\"key\":\"a\",\"value\":1,\"time\":0}\n{\"key\":\"a\",\"value\":1,"
                     "\"time\":2,\"diff\":-1}\n")
                .status,
            0);
  Outcome sink =
      tidemark("sink run s --to file://" + (dir_ / "out").string() + " --as-of 0 --until 3");
  ASSERT_EQ(sink.status, 0) << sink.err;
  Outcome inspect = tidemark("shard inspect s");
  EXPECT_EQ(inspect.status, 0);
  EXPECT_NE(inspect.out.find("since:   2\n"), std::string::npos) << inspect.out;
  // The owner: the process that ran the sink (host name and its pid).
  EXPECT_NE(inspect.out.find("reader:  c-sink-s since 2, critical (held until released), owner "),
            std::string::npos)
      << inspect.out;
  Outcome json = tidemark("shard inspect s --json");
  EXPECT_NE(
      json.out.find(
          R"("readers":[{"id":"c-sink-s","since":2,"critical":true,"expires_ms":null,"owner":")"),
      std::string::npos)
      << json.out;
  Outcome released = tidemark("shard release s c-sink-s");
  EXPECT_EQ(released.status, 0) << released.err;
  EXPECT_EQ(released.out, "released reader c-sink-s of shard s\n");
  EXPECT_EQ(tidemark("shard inspect s").out.find("reader:"), std::string::npos);
  Outcome again = tidemark("shard release s c-sink-s");
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.err.find("no reader c-sink-s"), std::string::npos) << again.err;
  EXPECT_EQ(tidemark("shard release s").status, 2);
  // Run again, the sink holds the since anew: it resumes, since nothing
  // moved the since past its progress meanwhile.
  ASSERT_EQ(tidemark("append s --lower 3 --upper 4", "").status, 0);
  Outcome resumed = tidemark("sink run s --to file://" + (dir_ / "out").string() + " --until 4");
  EXPECT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(tidemark("shard inspect s").out.find("reader:  c-sink-s since 3,"), std::string::npos);
}

TEST_F(CliTest, AppendSnapshotListen) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  Outcome append = tidemark("append s --lower 0 --upper 3",
                            "{\"key\": \"b\", \"value\": {\"x\": [1, 2]}, \"time\": 0}\n"
                            "\n"
                            "{\"key\": \"a\", \"value\": 1, \"time\": 1, \"diff\": 2}\r\n"
                            "{\"time\": 2, \"diff\": -1, \"value\": 1, \"key\": \"a\"}\n");
  ASSERT_EQ(append.status, 0) << append.err;
  EXPECT_EQ(append.out, "{\"count\":3,\"lower\":0,\"upper\":3}\n");

  Outcome at0 = tidemark("snapshot s --as-of 0");
  EXPECT_EQ(at0.status, 0);
  EXPECT_EQ(at0.out, "{\"key\":\"b\",\"value\":{\"x\":[1,2]},\"diff\":1}\n");
  Outcome latest = tidemark("snapshot s");
  EXPECT_EQ(latest.out,
            "{\"key\":\"a\",\"value\":1,\"diff\":1}\n{\"key\":\"b\",\"value\":{\"x\":[1,2]},"
            "\"diff\":1}\n");
  Outcome future = tidemark("snapshot s --as-of 3");
  EXPECT_EQ(future.status, 1);
  EXPECT_NE(future.err.find("not complete"), std::string::npos);

  Outcome listen = tidemark("listen s --from 0 --until 3");
  EXPECT_EQ(listen.status, 0) << listen.err;
  EXPECT_EQ(listen.out,
            "{\"key\":\"a\",\"value\":1,\"time\":1,\"diff\":2}\n"
            "{\"key\":\"a\",\"value\":1,\"time\":2,\"diff\":-1}\n"
            "{\"progress\":3}\n");
  EXPECT_EQ(tidemark("listen s").status, 2);

  // --resume-progress P: times from P on, so 0 is the whole history and
  // the last progress a stream printed goes on with nothing skipped.
  Outcome all = tidemark("listen s --resume-progress 0 --until 3");
  EXPECT_EQ(all.status, 0) << all.err;
  EXPECT_EQ(all.out,
            "{\"key\":\"b\",\"value\":{\"x\":[1,2]},\"time\":0,\"diff\":1}\n"
            "{\"key\":\"a\",\"value\":1,\"time\":1,\"diff\":2}\n"
            "{\"key\":\"a\",\"value\":1,\"time\":2,\"diff\":-1}\n"
            "{\"progress\":3}\n");
  Outcome rest = tidemark("listen s --resume-progress 2 --until 3");
  EXPECT_EQ(rest.out, "{\"key\":\"a\",\"value\":1,\"time\":2,\"diff\":-1}\n{\"progress\":3}\n");
  Outcome none = tidemark("listen s --resume-progress=3 --until 3");
  EXPECT_EQ(none.status, 0) << none.err;
  EXPECT_EQ(none.out, "");
  EXPECT_EQ(tidemark("listen s --from 0 --resume-progress 1").status, 2);
  EXPECT_EQ(tidemark("listen s --resume-progress x").status, 2);

  // --snapshot: the snapshot at --as-of as updates at that time, its
  // progress, then the changes after it.
  Outcome both = tidemark("listen s --snapshot --as-of 1 --until 3");
  EXPECT_EQ(both.status, 0) << both.err;
  EXPECT_EQ(both.out,
            "{\"key\":\"a\",\"value\":1,\"time\":1,\"diff\":2}\n"
            "{\"key\":\"b\",\"value\":{\"x\":[1,2]},\"time\":1,\"diff\":1}\n"
            "{\"progress\":2}\n"
            "{\"key\":\"a\",\"value\":1,\"time\":2,\"diff\":-1}\n"
            "{\"progress\":3}\n");
  Outcome latest_both = tidemark("listen s --snapshot --until 3");
  EXPECT_EQ(latest_both.status, 0) << latest_both.err;
  EXPECT_EQ(latest_both.out,
            "{\"key\":\"a\",\"value\":1,\"time\":2,\"diff\":1}\n"
            "{\"key\":\"b\",\"value\":{\"x\":[1,2]},\"time\":2,\"diff\":1}\n"
            "{\"progress\":3}\n");
  EXPECT_EQ(tidemark("listen s --snapshot --from 0").status, 2);
  EXPECT_EQ(tidemark("listen s --snapshot --resume-progress 0").status, 2);
  EXPECT_EQ(tidemark("listen s --from 0 --as-of 1").status, 2);
  Outcome early = tidemark("listen s --snapshot --as-of 3");
  EXPECT_EQ(early.status, 1);
  EXPECT_NE(early.err.find("not complete"), std::string::npos) << early.err;
}

// The issue's poison update: two diffs of i64::MAX for one (key, value) in
// separate appends once made every later snapshot fail ("diff overflow")
// for all keys. Now the total is carried (two rows that add up to it) and
// the other keys read as before, before and after compaction.
TEST_F(CliTest, HugeDiffsInSeparateAppendsLeaveTheShardReadable) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  const std::string max = "9223372036854775807";
  ASSERT_EQ(tidemark("append s --lower 0 --upper 1",
                     "{\"key\":\"p\",\"value\":1,\"time\":0,\"diff\":" + max +
                         "}\n{\"key\":\"a\",\"value\":1,\"time\":0}\n")
                .status,
            0);
  ASSERT_EQ(tidemark("append s --lower 1 --upper 2",
                     "{\"key\":\"p\",\"value\":1,\"time\":1,\"diff\":" + max +
                         "}\n{\"key\":\"z\",\"value\":1,\"time\":1}\n")
                .status,
            0);
  const std::string expected =
      "{\"key\":\"a\",\"value\":1,\"diff\":1}\n"
      "{\"key\":\"p\",\"value\":1,\"diff\":" +
      max +
      "}\n"
      "{\"key\":\"p\",\"value\":1,\"diff\":" +
      max +
      "}\n"
      "{\"key\":\"z\",\"value\":1,\"diff\":1}\n";
  Outcome snapshot = tidemark("snapshot s --as-of 1");
  EXPECT_EQ(snapshot.status, 0) << snapshot.err;
  EXPECT_EQ(snapshot.out, expected);
  Outcome compact = tidemark("compact s");
  EXPECT_EQ(compact.status, 0) << compact.err;
  snapshot = tidemark("snapshot s --as-of 1");
  EXPECT_EQ(snapshot.status, 0) << snapshot.err;
  EXPECT_EQ(snapshot.out, expected);
  // Retracting one of them brings the key back to a single row.
  ASSERT_EQ(tidemark("append s --lower 2 --upper 3",
                     "{\"key\":\"p\",\"value\":1,\"time\":2,\"diff\":-" + max + "}\n")
                .status,
            0);
  snapshot = tidemark("snapshot s --as-of 2");
  EXPECT_EQ(snapshot.out,
            "{\"key\":\"a\",\"value\":1,\"diff\":1}\n"
            "{\"key\":\"p\",\"value\":1,\"diff\":" +
                max +
                "}\n"
                "{\"key\":\"z\",\"value\":1,\"diff\":1}\n");
}

TEST_F(CliTest, MismatchExitsThreeNamingTheCurrentUpper) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  ASSERT_EQ(tidemark("append s --lower 0 --upper 5", "").status, 0);
  Outcome stale = tidemark("append s --lower 2 --upper 6", "{\"key\":1,\"value\":2,\"time\":3}\n");
  EXPECT_EQ(stale.status, 3);
  EXPECT_NE(stale.err.find("upper is 5"), std::string::npos) << stale.err;
  EXPECT_EQ(part_files(), 0u) << "the failed append's part was not deleted";
}

// A record line longer than --max-record-bytes (default 32 MiB, as a
// server's) is refused by number as soon as it passes the limit, in both
// kinds of append, and nothing is appended; a line at the limit is taken.
TEST_F(CliTest, ALineOverTheRecordLimitIsRefusedByNumber) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  const std::string at_limit = "{\"key\":\"k\",\"value\":\"" + std::string(1000, 'x') + "\"}";
  const std::string over = "{\"key\":\"k\",\"value\":\"" + std::string(1001, 'x') + "\"}";
  const std::string limit = " --max-record-bytes " + std::to_string(at_limit.size());
  for (const bool explicit_times : {false, true}) {
    SCOPED_TRACE(explicit_times ? "explicit" : "managed");
    auto with_time = [&](std::string line) {
      if (explicit_times) line.insert(line.size() - 1, ",\"time\":0");
      return line;
    };
    // An explicit line carries 9 more bytes (the time): so does its limit.
    const std::string command = explicit_times
                                    ? "append s --lower 0 --upper 1 --max-record-bytes " +
                                          std::to_string(at_limit.size() + 9)
                                    : "append s" + limit;
    Outcome refused = tidemark(command, with_time(at_limit) + "\n\n" + with_time(over) + "\n");
    EXPECT_EQ(refused.status, 1) << refused.err;
    EXPECT_NE(refused.err.find("line 3 is longer than"), std::string::npos) << refused.err;
    EXPECT_NE(refused.err.find("--max-record-bytes"), std::string::npos) << refused.err;
    EXPECT_NE(refused.err.find("nothing was appended"), std::string::npos) << refused.err;
    // The last line, without a newline, is bounded too.
    refused = tidemark(command, with_time(over));
    EXPECT_EQ(refused.status, 1) << refused.err;
    EXPECT_NE(refused.err.find("line 1 is longer than"), std::string::npos) << refused.err;
  }
  EXPECT_EQ(tidemark("snapshot s").out, "");
  EXPECT_EQ(part_files(), 0u);
  // At the limit it is taken.
  Outcome taken = tidemark("append s" + limit, at_limit + "\n");
  EXPECT_EQ(taken.status, 0) << taken.err;
  // The default limit is 32 MiB.
  const std::string huge = "{\"key\":\"k\",\"value\":\"" + std::string(32 << 20, 'x') + "\"}\n";
  Outcome refused = tidemark("append s", huge);
  EXPECT_EQ(refused.status, 1);
  EXPECT_NE(refused.err.find("line 1 is longer than 32.0 MiB"), std::string::npos) << refused.err;
  EXPECT_EQ(tidemark("append s --max-record-bytes 0", "").status, 2);
  EXPECT_EQ(tidemark("append s --max-record-bytes 1GiB", "").status, 2);
}

TEST_F(CliTest, MalformedLineIsReportedAndNothingIsAppended) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  // Enough good lines first that parts are already uploaded when line 5001
  // turns out to be malformed.
  std::string input;
  for (int i = 0; i < 5000; ++i) {
    input += "{\"key\":\"k" + std::to_string(i) + "\",\"value\":\"" + std::string(3000, 'x') +
             "\",\"time\":1}\n";
  }
  input += "{\"key\": \"oops\", \"value\": 1, \"time\": 1,}\n";
  Outcome bad = tidemark("append s --lower 0 --upper 2", input);
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("line 5001"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("nothing was appended"), std::string::npos);
  EXPECT_EQ(part_files(), 0u);
  Outcome inspect = tidemark("shard inspect s --json");
  EXPECT_NE(inspect.out.find("\"upper\":0"), std::string::npos);
  EXPECT_NE(inspect.out.find("\"updates\":0"), std::string::npos);

  Outcome outside = tidemark("append s --lower 0 --upper 2",
                             "{\"key\":1,\"value\":1,\"time\":0}\n"
                             "{\"key\":1,\"value\":1,\"time\":2}\n");
  EXPECT_EQ(outside.status, 1);
  EXPECT_NE(outside.err.find("line 2: time 2 is outside [0, 2)"), std::string::npos) << outside.err;
  Outcome missing_time = tidemark("append s --lower 0 --upper 2", "{\"key\":1,\"value\":1}\n");
  EXPECT_EQ(missing_time.status, 1);
  EXPECT_NE(missing_time.err.find("line 1"), std::string::npos);
}

TEST_F(CliTest, AnInputThatIsADirectoryIsAnErrorNotAnEmptyAppend) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  const std::string dir = shell_quote(dir_.string());
  for (const std::string& append :
       {"append s --input " + dir, "append s --lower 0 --upper 2 --input " + dir,
        "append s --producer p --input " + dir}) {
    Outcome refused = tidemark(append);
    EXPECT_EQ(refused.status, 1) << append << ": " << refused.out;
    EXPECT_NE(refused.err.find("is a directory"), std::string::npos)
        << append << ": " << refused.err;
    EXPECT_EQ(refused.out, "") << append;
  }
  Outcome inspect = tidemark("shard inspect s --json");
  EXPECT_NE(inspect.out.find("\"upper\":0"), std::string::npos) << inspect.out;
}

TEST_F(CliTest, ManagedAppendGoesThroughTheAppender) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  std::string input;
  for (int i = 0; i < 3000; ++i) {
    input += "{\"key\": \"k" + std::to_string(i) + "\", \"value\": " + std::to_string(i) + "}\n";
  }
  Outcome append = tidemark("append s", input);
  ASSERT_EQ(append.status, 0) << append.err;
  // {"count":3000,"time":T,"upper":U} with T a wall-clock millisecond time.
  EXPECT_EQ(append.out.rfind("{\"count\":3000,\"time\":", 0), 0u) << append.out;
  auto time_at = append.out.find("\"time\":") + 7;
  unsigned long long time = std::stoull(append.out.substr(time_at));
  EXPECT_GT(time, 1'600'000'000'000ull);
  Outcome snapshot = tidemark("snapshot s");
  EXPECT_EQ(std::count(snapshot.out.begin(), snapshot.out.end(), '\n'), 3000);

  // A malformed line, or a time given to a managed append: nothing appended.
  Outcome bad =
      tidemark("append s", "{\"key\": 1, \"value\": 2}\n{\"key\": 1, \"value\": 2, \"time\": 5}\n");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("line 2"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("nothing was appended"), std::string::npos);
  Outcome after = tidemark("snapshot s");
  EXPECT_EQ(after.out, snapshot.out);
}

// Interrupted managed appends: without a producer, all or nothing; with
// one, running it again appends exactly the rest.
TEST_F(CliTest, InterruptedManagedAppendsAreAllOrNothingOrResumable) {
  ASSERT_EQ(tidemark("shard create plain").status, 0);
  ASSERT_EQ(tidemark("shard create produced").status, 0);
  const int records = 400'000;
  {
    std::ofstream input(dir_ / "input.ndjson", std::ios::binary);
    for (int i = 0; i < records; ++i) {
      input << "{\"key\": \"k" << i << "\", \"value\": \"" << std::string(30, 'v') << "\"}\n";
    }
  }
  const std::string data = (dir_ / "data").string(), input = (dir_ / "input.ndjson").string();
  auto updates = [&](const std::string& shard) {
    Outcome inspect = tidemark("shard inspect " + shard + " --json");
    auto at = inspect.out.find("\"updates\":");
    return at == std::string::npos ? -1 : std::stoll(inspect.out.substr(at + 10));
  };
  // Killed at a few points: never a part of it.
  for (int delay_ms : {150, 400, 700}) {
    pid_t pid = tidemark::testing::spawn_tidemark(
        {"--data", data, "append", "plain", "--input", input}, dir_ / "err");
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    const long long seen = updates("plain");
    EXPECT_TRUE(seen == 0 || seen % records == 0) << seen << " of " << records << " appended";
  }

  // With a producer: kill it once part is committed, then run it again.
  pid_t pid = tidemark::testing::spawn_tidemark(
      {"--data", data, "append", "produced", "--producer", "loader-1", "--input", input},
      dir_ / "err");
  ASSERT_GT(pid, 0);
  long long prefix = 0;
  for (int i = 0; i < 600 && prefix <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    prefix = updates("produced");
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  prefix = updates("produced");
  ASSERT_GT(prefix, 0) << "nothing was committed before the kill";
  EXPECT_LT(prefix, records) << "all was committed before the kill: the test proves little";
  Outcome rerun = tidemark("append produced --producer loader-1 --input " + shell_quote(input));
  ASSERT_EQ(rerun.status, 0) << rerun.err;
  EXPECT_NE(rerun.out.find("\"duplicates\":" + std::to_string(prefix)), std::string::npos)
      << rerun.out << " (" << prefix << " committed before)";
  EXPECT_EQ(updates("produced"), records);
  Outcome snapshot = tidemark("snapshot produced");
  EXPECT_EQ(std::count(snapshot.out.begin(), snapshot.out.end(), '\n'), records);
  EXPECT_EQ(snapshot.out.find("\"diff\":2"), std::string::npos) << "a record twice";
  // A third run appends nothing.
  Outcome again = tidemark("append produced --producer loader-1 --input " + shell_quote(input));
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_NE(again.out.find("\"duplicates\":" + std::to_string(records)), std::string::npos)
      << again.out;
  EXPECT_EQ(updates("produced"), records);
  EXPECT_EQ(tidemark("append produced --producer a/b", "").status, 2);
}

// Each append compacts in the foreground: the shard stays O(log n) batches
// and its blob holds only the parts the state references.
TEST_F(CliTest, AppendsCompactAndCompactReports) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  std::string expected;
  const int appends = 40;
  for (int t = 0; t < appends; ++t) {
    std::string line = "{\"key\":\"k" + std::to_string(t) +
                       "\",\"value\":\"v\",\"time\":" + std::to_string(t) + ",\"diff\":1}\n";
    Outcome append = tidemark(
        "append s --lower " + std::to_string(t) + " --upper " + std::to_string(t + 1), line);
    ASSERT_EQ(append.status, 0) << append.err;
    EXPECT_EQ(append.err, "");
  }
  Outcome before = tidemark("snapshot s");
  ASSERT_EQ(before.status, 0);
  EXPECT_EQ(std::count(before.out.begin(), before.out.end(), '\n'), appends);

  Outcome inspect = tidemark("shard inspect s --json");
  auto field = [](const std::string& json, const std::string& name) {
    auto at = json.find("\"" + name + "\":");
    EXPECT_NE(at, std::string::npos) << name << " in " << json;
    return std::stoull(json.substr(at + name.size() + 3));
  };
  EXPECT_LE(field(inspect.out, "batches"), 6u) << inspect.out;  // 40 appends: log3(40) + 2
  EXPECT_EQ(field(inspect.out, "updates"), static_cast<unsigned long long>(appends));
  // Every part object is referenced, and every referenced part not held
  // inline in the state is an object.
  EXPECT_EQ(part_files(), field(inspect.out, "parts") - field(inspect.out, "inline_parts"))
      << "unreferenced parts were left";

  Outcome compact = tidemark("compact s");
  ASSERT_EQ(compact.status, 0) << compact.err;
  EXPECT_EQ(compact.out.rfind("{\"merges\":", 0), 0u) << compact.out;
  EXPECT_EQ(field(compact.out, "parts") - field(compact.out, "inline_parts"), part_files());
  EXPECT_EQ(tidemark("snapshot s").out, before.out);

  EXPECT_EQ(tidemark("compact").status, 2);
  EXPECT_EQ(tidemark("compact a b").status, 2);
  Outcome missing = tidemark("compact nope");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("no shard named nope"), std::string::npos) << missing.err;
}

// --flag=value means --flag value, for the global flags too; a switch
// given a value, an unknown flag or an empty value is still exit 2.
TEST_F(CliTest, FlagsTakeTheirValueAfterAnEqualsSign) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  Outcome append = tidemark("append s --lower=0 --upper=2",
                            "{\"key\": \"a\", \"value\": 1, \"time\": 0}\n"
                            "{\"key\": \"b\", \"value\": 2, \"time\": 1}\n");
  ASSERT_EQ(append.status, 0) << append.err;
  EXPECT_EQ(append.out, "{\"count\":2,\"lower\":0,\"upper\":2}\n");
  Outcome at0 = tidemark("snapshot s --as-of=0");
  EXPECT_EQ(at0.status, 0) << at0.err;
  EXPECT_EQ(at0.out, "{\"key\":\"a\",\"value\":1,\"diff\":1}\n");
  Outcome listen = tidemark("listen s --from=0 --until=2");
  EXPECT_EQ(listen.status, 0) << listen.err;
  EXPECT_EQ(listen.out, "{\"key\":\"b\",\"value\":2,\"time\":1,\"diff\":1}\n{\"progress\":2}\n");
  const std::string other = shell_quote((dir_ / "other").string());
  ASSERT_EQ(tidemark("--data=" + other + " shard create t").status, 0);
  Outcome list = tidemark("shard list --data=" + other);
  EXPECT_EQ(list.out, "t\n") << list.err;

  EXPECT_EQ(tidemark("snapshot s --as-of=").status, 2);
  Outcome unknown = tidemark("snapshot s --bogus=1");
  EXPECT_EQ(unknown.status, 2);
  EXPECT_NE(unknown.err.find("unknown option --bogus"), std::string::npos) << unknown.err;
  Outcome valued_switch = tidemark("shard inspect s --json=yes");
  EXPECT_EQ(valued_switch.status, 2);
  EXPECT_NE(valued_switch.err.find("--json takes no value"), std::string::npos)
      << valued_switch.err;
}

// Commands that only read never create a data directory: they fail
// naming it. Creating a shard makes it.
TEST_F(CliTest, ReadingCommandsNeverCreateTheDataDirectory) {
  const fs::path missing = dir_ / "missing";
  const std::string data = "--data " + shell_quote(missing.string()) + " ";
  for (const char* command :
       {"shard list", "shard inspect s", "snapshot s", "listen s --from 0 --until 1"}) {
    Outcome read = tidemark(data + command);
    EXPECT_EQ(read.status, 1) << command;
    EXPECT_NE(read.err.find("does not exist"), std::string::npos) << command << ": " << read.err;
    EXPECT_FALSE(fs::exists(missing)) << command << " created it";
  }
  ASSERT_EQ(tidemark(data + "shard create s").status, 0);
  EXPECT_TRUE(fs::is_directory(missing));
  EXPECT_EQ(tidemark(data + "shard list").out, "s\n");
}

// --version names the binary's allocator as the allocator itself reports
// it. With jemalloc, its pages must go back to the kernel when freed (no
// decay): the memory caps of the bounded-memory scenarios depend on it,
// and a malloc_conf that did not take would leave jemalloc's 10 s default.
TEST_F(CliTest, VersionNamesTheAllocator) {
  Outcome version = tidemark("--version");
  ASSERT_EQ(version.status, 0);
#ifdef TIDEMARK_JEMALLOC
  EXPECT_NE(version.out.find("\nallocator: jemalloc 5."), std::string::npos) << version.out;
  EXPECT_NE(version.out.find("(dirty_decay_ms 0, muzzy_decay_ms 0)"), std::string::npos)
      << version.out;
#else
  EXPECT_NE(version.out.find("\nallocator: glibc malloc"), std::string::npos) << version.out;
#endif
}

// help, --help on every command and --version answer on stdout with exit
// 0, run nothing and create nothing; an unknown command's help is exit 2.
TEST_F(CliTest, EveryCommandExplainsItself) {
  Outcome version = tidemark("--version");
  EXPECT_EQ(version.status, 0);
  EXPECT_TRUE(version.out.starts_with("tidemark ")) << version.out;
  Outcome help = tidemark("help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("help [COMMAND]"), std::string::npos) << help.out;
  EXPECT_EQ(tidemark("--help").out, help.out);
  for (const std::string command :
       {"shard", "append", "snapshot", "listen", "compact", "sink", "serve", "bench"}) {
    Outcome own = tidemark(command + " --help");
    EXPECT_EQ(own.status, 0) << command << ": " << own.err;
    EXPECT_TRUE(own.out.starts_with("usage: tidemark " + command)) << own.out;
    EXPECT_NE(own.out.find("Example:"), std::string::npos) << command;
    EXPECT_EQ(tidemark("help " + command).out, own.out) << command;
  }
  // Not run: serve --help starts no server, snapshot --help opens nothing.
  EXPECT_EQ(tidemark("snapshot missing --help").status, 0);
  EXPECT_FALSE(fs::exists(dir_ / "data"));
  EXPECT_EQ(tidemark("help nonsense").status, 2);
}

TEST_F(CliTest, UsageErrors) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  EXPECT_EQ(tidemark("append s --lower 3").status, 2);
  EXPECT_EQ(tidemark("append s --lower 3 --upper 1").status, 2);
  EXPECT_EQ(tidemark("append s --lower x --upper 1").status, 2);
  EXPECT_EQ(tidemark("snapshot s --as-of -1").status, 2);
  EXPECT_EQ(tidemark("snapshot s --bogus").status, 2);
  EXPECT_EQ(tidemark("append missing --lower 0 --upper 1", "").status, 1);
  // A count is the whole text: trailing junk and signs are errors, not
  // 12 and a wrapped 2^64 - 1 (the server never starts).
  for (const char* queue : {"records:12x", "records:-1", "records:0", "records:", "records"}) {
    const auto serve =
        tidemark(std::string("serve --listen 127.0.0.1:0 --appender-queue ") + queue);
    EXPECT_EQ(serve.status, 2) << queue;
    EXPECT_NE(serve.err.find("--appender-queue"), std::string::npos) << serve.err;
  }
  for (const char* flags :
       {"--listen 127.0.0.1:+80", "--listen '127.0.0.1: 80'", "--listen 127.0.0.1:65536",
        "--listen 127.0.0.1:80x", "--listen 127.0.0.1:0 --lease 100ms",
        "--listen 127.0.0.1:0 --lease -1", "--listen 127.0.0.1:0 --max-connections 10k"}) {
    EXPECT_EQ(tidemark(std::string("serve ") + flags).status, 2) << flags;
  }
  EXPECT_EQ(tidemark("listen s --from 1x").status, 2);
  EXPECT_EQ(tidemark("snapshot s --as-of 18446744073709551616").status, 2);
}

TEST_F(CliTest, SinkDestinationErrors) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  for (const char* to :
       {"ftp://x/y", "file://relative/dir", "kafka://h:1", "kafka://h/t", "kafka://h:1/bad topic",
        "kafka://h:9092x/t", "kafka://h:-1/t", "s3://bucket/p", "s3://bucket/p?endpoint=x"}) {
    Outcome run = tidemark(std::string("sink run s --to '") + to + "'");
    EXPECT_EQ(run.status, 2) << to << ": " << run.err;
    EXPECT_NE(run.err.find(to), std::string::npos) << run.err;
  }
  Outcome csv = tidemark("sink run s --to kafka://127.0.0.1:9/t --format csv");
  EXPECT_EQ(csv.status, 2);
  EXPECT_NE(csv.err.find("json"), std::string::npos) << csv.err;
  EXPECT_EQ(tidemark("sink run s --to kafka://127.0.0.1:9/t --envelope nope").status, 2);
}

// `bench ... --dir DIR` works in a fresh directory of its own under DIR,
// keeps it and says where; whatever DIR held before is left as it was.
TEST_F(CliTest, BenchDirKeepsWhatWasThere) {
  const fs::path dir = dir_ / "bench";
  fs::create_directories(dir / "mine");
  std::ofstream(dir / "precious.txt") << "keep me\n";
  std::ofstream(dir / "mine" / "nested.txt") << "me too\n";
  std::set<std::string> expected = {"mine", "precious.txt"};
  for (const std::string bench :
       {"engine --updates 1000 --appends 2", "compaction --appends 20", "sink --diff 100",
        "listen --updates 1000 --times 10 --rounds 1 --appends 5 --idle 20 --window 1"}) {
    Outcome run = tidemark("bench " + bench + " --json --dir " + shell_quote(dir.string()));
    ASSERT_EQ(run.status, 0) << bench << ": " << run.err;
    if (bench.starts_with("listen")) {
      // Over HTTP too: five appends seen on a stream, twenty idle streams
      // all woken by one more.
      EXPECT_NE(run.out.find("\"idle_streams\":20,"), std::string::npos) << run.out;
      EXPECT_NE(run.out.find("\"not_woken\":0}"), std::string::npos) << run.out;
    }
    EXPECT_EQ(slurp(dir / "precious.txt"), "keep me\n") << bench;
    EXPECT_EQ(slurp(dir / "mine" / "nested.txt"), "me too\n") << bench;
    // The run's own directory, named on stderr.
    const std::string mode = bench.substr(0, bench.find(' '));
    const std::regex kept("this run's data is in (" + dir.string() + "/(tidemark-bench-" + mode +
                          "-[A-Za-z0-9]{6})) \\(kept\\)");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(run.err, match, kept)) << bench << ": " << run.err;
    EXPECT_TRUE(fs::is_directory(match[1].str())) << bench;
    expected.insert(match[2].str());
  }
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    names.insert(entry.path().filename().string());
  EXPECT_EQ(names, expected);

  // A --dir that cannot hold a directory is an error that changes nothing.
  Outcome refused = tidemark("bench compaction --appends 5 --dir " +
                             shell_quote((dir / "precious.txt").string()));
  EXPECT_EQ(refused.status, 1) << refused.err;
  EXPECT_NE(refused.err.find((dir / "precious.txt").string()), std::string::npos) << refused.err;
  EXPECT_EQ(slurp(dir / "precious.txt"), "keep me\n");
}

// `sink run --to s3://...`: the snapshot, then a restart that resumes at
// the committed progress, read back as objects. Each object holds the
// lines of its interval, and the objects' ranges are contiguous from 0.
TEST_F(CliTest, SinkRunToS3WritesObjectsAndResumes) {
  std::optional<std::string> server = tidemark::s3_test_server();
  if (!server) GTEST_SKIP() << tidemark::no_s3_server_message();
  auto prefix = tidemark::open_fresh_s3_blob(*server);
  ASSERT_TRUE(prefix.has_value()) << prefix.error().to_string();
  const std::string to = shell_quote((*prefix)->url().to_string());
  auto objects = [&] { return s3_objects(**prefix); };
  const std::string names_0_3 = "00000000000000000000-00000000000000000003.json";

  ASSERT_EQ(tidemark("shard create s").status, 0);
  ASSERT_EQ(tidemark("append s --lower 0 --upper 3",
                     "{\"key\": \"a\", \"value\": 1, \"time\": 0}\n"
                     "{\"key\": \"b\", \"value\": 2, \"time\": 1}\n"
                     "{\"key\": \"a\", \"value\": 1, \"time\": 2, \"diff\": -1}\n"
                     "{\"key\": \"a\", \"value\": 3, \"time\": 2}\n")
                .status,
            0);
  Outcome first = tidemark("sink run s --to " + to + " --until 3");
  ASSERT_EQ(first.status, 0) << first.err;
  const std::map<std::string, std::string> snapshot = {
      {names_0_3,
       "{\"time\":2,\"key\":\"a\",\"value\":3}\n"
       "{\"time\":2,\"key\":\"b\",\"value\":2}\n"}};
  EXPECT_EQ(objects(), snapshot);

  // More changes; the restarted sink starts at 3: the snapshot is not
  // written again.
  ASSERT_EQ(tidemark("append s --lower 3 --upper 6",
                     "{\"key\": \"b\", \"value\": 2, \"time\": 3, \"diff\": -1}\n"
                     "{\"key\": \"c\", \"value\": \"x\", \"time\": 4}\n")
                .status,
            0);
  Outcome second = tidemark("sink run s --to " + to + " --until 6");
  ASSERT_EQ(second.status, 0) << second.err;
  std::map<std::string, std::string> after = objects();
  ASSERT_EQ(after.count(names_0_3), 1u);
  EXPECT_EQ(after[names_0_3], snapshot.at(names_0_3)) << "the first object changed";
  std::string lines;
  std::string expected_lower = "00000000000000000003";
  for (const auto& [name, bytes] : after) {
    if (name == names_0_3) continue;
    ASSERT_EQ(name.size(), names_0_3.size()) << name;
    EXPECT_EQ(name.substr(0, 20), expected_lower) << "not contiguous: " << name;
    expected_lower = name.substr(21, 20);
    lines += bytes;
  }
  EXPECT_EQ(expected_lower, "00000000000000000006");
  EXPECT_EQ(lines,
            "{\"time\":3,\"key\":\"b\",\"value\":null}\n"
            "{\"time\":4,\"key\":\"c\",\"value\":\"x\"}\n");

  // Already there: a third run writes nothing.
  Outcome third = tidemark("sink run s --to " + to + " --until 6");
  ASSERT_EQ(third.status, 0) << third.err;
  EXPECT_EQ(objects(), after);
}

// `tidemark serve` takes s3:// sinks (POST /v1/sinks) to the endpoints
// its --allow-s3-endpoints lists (file:// sinks are confined to
// <data>/sinks/), and writes their objects.
TEST_F(CliTest, ServeRunsS3Sinks) {
  std::optional<std::string> server = tidemark::s3_test_server();
  if (!server) GTEST_SKIP() << tidemark::no_s3_server_message();
  auto prefix = tidemark::open_fresh_s3_blob(*server);
  ASSERT_TRUE(prefix.has_value()) << prefix.error().to_string();
  Outcome bad_list = tidemark("serve --allow-s3-endpoints minio:9000");
  EXPECT_EQ(bad_list.status, 2);
  EXPECT_NE(bad_list.err.find("is not http[s]://host[:port]"), std::string::npos) << bad_list.err;
  auto serving =
      tidemark::testing::start_server({"--data", (dir_ / "data").string()}, dir_ / "serve.err",
                                      {"--allow-s3-endpoints", (*prefix)->url().endpoint});
  ASSERT_GT(serving.port, 0) << tidemark::testing::slurp(dir_ / "serve.err");
  tidemark::testing::StopOnExit stop{serving.pid};
  namespace http = boost::beast::http;
  auto call = [&](http::verb verb, const std::string& target, const std::string& body = "") {
    return tidemark::testing::http_call(serving.port, verb, target, body);
  };
  ASSERT_EQ(call(http::verb::post, "/v1/shards", R"({"name": "s"})").status, 201u);
  ASSERT_EQ(call(http::verb::post, "/v1/shards/s/append?lower=0&upper=2",
                 "{\"key\": \"a\", \"value\": 1, \"time\": 0}\n"
                 "{\"key\": \"b\", \"value\": [2], \"time\": 1}\n")
                .status,
            200u);
  const std::string spec = "{\"name\": \"objects\", \"shard\": \"s\", \"to\": \"" +
                           (*prefix)->url().to_string() + "\", \"format\": \"csv\"}";
  auto created = call(http::verb::post, "/v1/sinks", spec);
  ASSERT_EQ(created.status, 201u) << created.body;
  const std::string name = "00000000000000000000-00000000000000000002.csv";
  // Committed once the sink's frontier is 2 (s3rver's PUTs are not atomic:
  // read only then).
  std::string status;
  for (int i = 0; i < 500 && status.find("\"frontier\":2") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    status = call(http::verb::get, "/v1/sinks/objects").body;
  }
  ASSERT_NE(status.find("\"frontier\":2"), std::string::npos) << status;
  const std::map<std::string, std::string> objects = s3_objects(**prefix);
  EXPECT_EQ(objects, (std::map<std::string, std::string>{
                         {name, "time,key,value\n1,\"\"\"a\"\"\",1\n1,\"\"\"b\"\"\",[2]\n"}}))
      << status;
  EXPECT_EQ(call(http::verb::delete_, "/v1/sinks/objects").status, 200u);
}

// sink audit reads back what a Kafka sink committed: each message inside
// its progress records' ranges, and a summary; another sink's name finds
// no progress and counts every message as outside.
TEST_F(CliTest, ASinkIntoKafkaIsReadBackByAudit) {
  auto broker = tidemark::KafkaMockProcess::start(
      TIDEMARK_KAFKA_MOCK, {"--topic", "out:2", "--topic", "out-progress:1"});
  ASSERT_TRUE(broker) << broker.error().message;
  const std::string to = "kafka://" + (*broker)->brokers() + "/out";
  ASSERT_EQ(tidemark("shard create s").status, 0);
  ASSERT_EQ(tidemark("append s --lower 0 --upper 3",
                     "{\"key\":\"a\",\"value\":1,\"time\":0}\n"
                     "{\"key\":\"b\",\"value\":[2],\"time\":0}\n"
                     "{\"key\":\"a\",\"value\":1,\"time\":2,\"diff\":-1}\n")
                .status,
            0);
  Outcome run = tidemark("sink run s --to " + to + " --as-of 0 --until 3");
  ASSERT_EQ(run.status, 0) << run.err;
  Outcome audit = tidemark("sink audit s --to " + to + " --messages");
  ASSERT_EQ(audit.status, 0) << audit.err;
  std::vector<std::string> lines = tidemark::testing::lines_of(audit.out);
  ASSERT_EQ(lines.size(), 4u) << audit.out;
  EXPECT_EQ(lines.back(),
            "{\"sink\":\"s\",\"frontier\":3,\"transactions\":2,\"committed\":3,\"outside\":0}");
  std::set<std::string> messages;
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) {
    // Partition and offset depend on the key's hash: compared without them.
    const auto at = lines[i].find(",\"time\":");
    ASSERT_NE(at, std::string::npos) << lines[i];
    EXPECT_TRUE(lines[i].starts_with("{\"partition\":")) << lines[i];
    messages.insert(lines[i].substr(at + 1));
  }
  EXPECT_EQ(messages, (std::set<std::string>{"\"time\":0,\"key\":\"a\",\"value\":1}",
                                             "\"time\":0,\"key\":\"b\",\"value\":[2]}",
                                             "\"time\":2,\"key\":\"a\",\"value\":null}"}))
      << audit.out;
  Outcome other = tidemark("sink audit s --to " + to + " --sink-name nobody");
  EXPECT_EQ(other.status, 0) << other.err;
  EXPECT_EQ(other.out,
            "{\"sink\":\"nobody\",\"frontier\":null,\"transactions\":0,\"committed\":0,"
            "\"outside\":3}\n");
  EXPECT_EQ(tidemark("sink audit s --to s3://bucket/p?endpoint=http://127.0.0.1:1").status, 2);
  Outcome no_directory = tidemark("sink audit s --to file://" + (dir_ / "none").string());
  EXPECT_EQ(no_directory.status, 1);
  EXPECT_NE(no_directory.err.find("cannot list sink directory"), std::string::npos)
      << no_directory.err;
  EXPECT_EQ(tidemark("sink audit s").status, 2);
  EXPECT_EQ(tidemark("sink audit s --to " + to + " --timeout-ms 12x").status, 2);
}

// sink audit on a file sink: its files' names must tile its progress and
// every line's time lie in its file's range; a gap or a stray line is an
// error (exit 1) saying where.
TEST_F(CliTest, AFileSinkIsReadBackByAudit) {
  ASSERT_EQ(tidemark("shard create s").status, 0);
  ASSERT_EQ(tidemark("append s --lower 0 --upper 2",
                     "{\"key\":\"a\",\"value\":1,\"time\":0}\n{\"key\":\"b\",\"value\":2,"
                     "\"time\":1}\n")
                .status,
            0);
  const fs::path out = dir_ / "out";
  const std::string to = "file://" + out.string();
  ASSERT_EQ(tidemark("sink run s --to " + to + " --as-of 0 --until 2").status, 0);
  ASSERT_EQ(tidemark("append s --lower 2 --upper 4",
                     "{\"key\":\"a\",\"value\":1,\"time\":3,\"diff\":-1}\n")
                .status,
            0);
  ASSERT_EQ(tidemark("sink run s --to " + to + " --until 4").status, 0);
  Outcome audit = tidemark("sink audit s --to " + to + " --messages");
  EXPECT_EQ(audit.status, 0) << audit.err;
  EXPECT_EQ(audit.out,
            "{\"time\":0,\"key\":\"a\",\"value\":1}\n"
            "{\"time\":1,\"key\":\"b\",\"value\":2}\n"
            "{\"time\":3,\"key\":\"a\",\"value\":null}\n"
            "{\"sink\":\"s\",\"frontier\":4,\"files\":3,\"committed\":3,\"outside\":0}\n");
  // A line whose time is outside its file's range.
  const fs::path last = out / "00000000000000000002-00000000000000000004.json";
  ASSERT_TRUE(fs::exists(last));
  std::ofstream(last, std::ios::app) << "{\"time\":9,\"key\":\"z\",\"value\":1}\n";
  Outcome stray = tidemark("sink audit s --to " + to);
  EXPECT_EQ(stray.status, 1);
  EXPECT_EQ(stray.out,
            "{\"sink\":\"s\",\"frontier\":4,\"files\":3,\"committed\":4,\"outside\":1}\n");
  // A committed file gone: the times it held are a gap.
  fs::remove(out / "00000000000000000001-00000000000000000002.json");
  Outcome gap = tidemark("sink audit s --to " + to);
  EXPECT_EQ(gap.status, 1);
  EXPECT_NE(gap.err.find("nothing is committed for the times [1, 2)"), std::string::npos)
      << gap.err << gap.out;
}

// tidemark --server URL drives a running server: the same commands and
// outputs as on a data directory, bodies streamed both ways, the server's
// errors on stderr with the local exit statuses.
TEST_F(CliTest, TheCommandsDriveARunningServer) {
  std::ofstream(dir_ / "token") << "s3cret\n";
  auto serving =
      tidemark::testing::start_server({"--data", (dir_ / "data").string()}, dir_ / "serve.err",
                                      {"--token-file", (dir_ / "token").string()});
  ASSERT_GT(serving.port, 0) << tidemark::testing::slurp(dir_ / "serve.err");
  tidemark::testing::StopOnExit stop{serving.pid};
  const std::string server = "--server http://127.0.0.1:" + std::to_string(serving.port) +
                             " --server-token-file " + (dir_ / "token").string() + " ";
  auto remote = [&](const std::string& args, const std::string& input = "") {
    return run(server + args, input);
  };
  EXPECT_EQ(remote("shard create orders").out, "created shard orders\n");
  Outcome again = remote("shard create orders");
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.err.find("already exists (HTTP 409)"), std::string::npos) << again.err;
  EXPECT_EQ(remote("shard list").out, "orders\n");

  // An explicit append streamed up as a chunked body: 3,000 lines.
  std::string lines;
  for (int i = 0; i < 3000; ++i) {
    lines += "{\"key\":\"k" + std::to_string(i) + "\",\"value\":" + std::to_string(i) +
             ",\"time\":" + std::to_string(i % 3) + "}\n";
  }
  Outcome append = remote("append orders --lower 0 --upper 3", lines);
  EXPECT_EQ(append.status, 0) << append.err;
  EXPECT_EQ(append.out, "{\"time\":2,\"count\":3000,\"lower\":0,\"upper\":3}\n");  // the server's
  Outcome stale = remote("append orders --lower 0 --upper 4", "");
  EXPECT_EQ(stale.status, 3) << stale.err;
  Outcome bad = remote("append orders --lower 3 --upper 4", "{\"key\":1}\n");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("line 1"), std::string::npos) << bad.err;

  Outcome snapshot = remote("snapshot orders --as-of 0");
  EXPECT_EQ(snapshot.status, 0) << snapshot.err;
  EXPECT_EQ(tidemark::testing::lines_of(snapshot.out).size(), 1000u);
  Outcome listen = remote("listen orders --resume-progress 2 --until 3");
  EXPECT_EQ(listen.status, 0) << listen.err;
  auto listened = tidemark::testing::lines_of(listen.out);
  ASSERT_EQ(listened.size(), 1001u);
  EXPECT_EQ(listened.back(), "{\"progress\":3}");
  EXPECT_EQ(remote("listen orders --from 0 --resume-progress 2").status, 2);
  Outcome with_snapshot = remote("listen orders --snapshot --as-of 1 --until 3");
  EXPECT_EQ(with_snapshot.status, 0) << with_snapshot.err;
  auto both_lines = tidemark::testing::lines_of(with_snapshot.out);
  ASSERT_EQ(both_lines.size(), 3002u);  // 2,000 rows, progress 2, 1,000 rows, progress 3
  EXPECT_EQ(both_lines[2000], "{\"progress\":2}");
  EXPECT_EQ(both_lines.back(), "{\"progress\":3}");
  EXPECT_EQ(remote("listen orders --snapshot --from 0").status, 2);

  Outcome inspect = remote("shard inspect orders");
  EXPECT_NE(inspect.out.find("upper:   3\n"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("updates: 3000\n"), std::string::npos) << inspect.out;
  EXPECT_NE(remote("shard inspect orders --json").out.find("\"updates\":3000,"), std::string::npos);

  // Managed appends by a producer: a rerun appends nothing twice.
  const std::string records = "{\"key\":\"p1\",\"value\":1}\n{\"key\":\"p2\",\"value\":2}\n";
  EXPECT_EQ(remote("append orders --producer importer", records).status, 0);
  Outcome rerun = remote("append orders --producer importer", records);
  EXPECT_EQ(rerun.status, 0) << rerun.err;
  EXPECT_NE(rerun.out.find("\"duplicates\":2"), std::string::npos) << rerun.out;

  // Sinks: listed, shown and deleted through the server.
  namespace http = boost::beast::http;
  const std::string to = "file://" + (dir_ / "data" / "sinks" / "f").string();
  ASSERT_EQ(tidemark::testing::http_call(serving.port, http::verb::post, "/v1/sinks",
                                         R"({"name": "f", "shard": "orders", "to": ")" + to + "\"}",
                                         {{"Authorization", "Bearer s3cret"}})
                .status,
            201u);
  EXPECT_NE(remote("sink list").out.find("\"name\":\"f\""), std::string::npos);
  EXPECT_NE(remote("sink status f").out.find("\"shard\":\"orders\""), std::string::npos);
  Outcome updated = remote("sink update f --shard orders --to " + to + " --format csv");
  EXPECT_EQ(updated.status, 0) << updated.err;
  EXPECT_NE(updated.out.find("\"format\":\"csv\""), std::string::npos) << updated.out;
  EXPECT_NE(updated.out.find("\"revision\":1"), std::string::npos) << updated.out;
  EXPECT_EQ(remote("sink update f --to " + to).status, 2);
  EXPECT_EQ(remote("sink status f --format csv").status, 2);
  EXPECT_EQ(remote("sink delete f").status, 0);
  EXPECT_EQ(remote("sink status f").status, 1);

  // Shards deleted through the server.
  EXPECT_EQ(remote("shard create scratch").status, 0);
  EXPECT_EQ(
      remote("append scratch --lower 0 --upper 1", "{\"key\":1,\"value\":1,\"time\":0}\n").status,
      0);
  Outcome deleted = remote("shard delete scratch");
  EXPECT_EQ(deleted.status, 0) << deleted.err;
  EXPECT_EQ(deleted.out.rfind("deleted shard scratch (", 0), 0u) << deleted.out;
  EXPECT_EQ(remote("shard list").out, "orders\n");
  Outcome missing = remote("shard delete scratch");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("no shard named scratch (HTTP 404)"), std::string::npos)
      << missing.err;
  EXPECT_EQ(remote("shard delete scratch --json").status, 2);

  // Mistakes: a wrong token, a command that needs a data directory, a
  // malformed URL, a server that is not there.
  std::ofstream(dir_ / "wrong") << "nope\n";
  Outcome refused = run("--server http://127.0.0.1:" + std::to_string(serving.port) +
                        " --server-token-file " + (dir_ / "wrong").string() + " shard list");
  EXPECT_EQ(refused.status, 1);
  EXPECT_NE(refused.err.find("(HTTP 401)"), std::string::npos) << refused.err;
  EXPECT_EQ(remote("compact orders").status, 2);
  EXPECT_EQ(run("--server 127.0.0.1:1 shard list").status, 2);
  Outcome both = tidemark("--server http://127.0.0.1:1 shard list");  // and --data
  EXPECT_EQ(both.status, 2);
  EXPECT_NE(both.err.find("one or the other"), std::string::npos) << both.err;
  Outcome gone = run("--server http://127.0.0.1:1 shard list");
  EXPECT_EQ(gone.status, 1);
  EXPECT_NE(gone.err.find("cannot reach the server"), std::string::npos) << gone.err;
}

// The server's log: a line per sink change and per request answered
// (every one at debug; at the default info, only the 4xx and 5xx ones),
// each with its time and level; a bad --log-level is a usage error.
TEST_F(CliTest, ServeLogsRequestsAndSinksByLevel) {
  EXPECT_EQ(tidemark("serve --log-level loud").status, 2);
  namespace http = boost::beast::http;
  const std::regex stamped(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (debug|info|warn|error) )");
  for (const std::string level : {"info", "debug"}) {
    SCOPED_TRACE(level);
    const fs::path err = dir_ / ("serve-" + level + ".err");
    auto serving = tidemark::testing::start_server({"--data", (dir_ / "data").string()}, err,
                                                   {"--log-level", level});
    ASSERT_GT(serving.port, 0) << tidemark::testing::slurp(err);
    auto call = [&](http::verb verb, const std::string& target, const std::string& body = "") {
      return tidemark::testing::http_call(serving.port, verb, target, body);
    };
    const std::string shard = "s" + level;
    ASSERT_EQ(call(http::verb::post, "/v1/shards", R"({"name": ")" + shard + R"("})").status, 201u);
    EXPECT_EQ(call(http::verb::get, "/v1/shards/" + shard + "/snapshot?asof=0").status, 400u);
    const std::string to = "file://" + (dir_ / "data" / "sinks" / level).string();
    ASSERT_EQ(
        call(http::verb::post, "/v1/sinks",
             R"({"name": "f)" + level + R"(", "shard": ")" + shard + R"(", "to": ")" + to + "\"}")
            .status,
        201u);
    // This sink's line: the data directory is shared, so the first round's
    // sink resumes in the second and says "running" too.
    const std::string running = "sink f" + level + " of shard " + shard + ": running";
    std::string log;
    for (int i = 0; i < 400 && log.find(running) == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      log = tidemark::testing::slurp(err);
    }
    ::kill(serving.pid, SIGTERM);
    ::waitpid(serving.pid, nullptr, 0);
    log = tidemark::testing::slurp(err);
    std::vector<std::string> events;
    for (const std::string& line : tidemark::testing::lines_of(log)) {
      if (!line.starts_with("tidemark: ")) events.push_back(line);
    }
    for (const std::string& line : events) EXPECT_TRUE(std::regex_search(line, stamped)) << line;
    auto has = [&](const std::string& text) {
      return std::any_of(events.begin(), events.end(),
                         [&](const std::string& line) { return line.find(text) != line.npos; });
    };
    EXPECT_TRUE(has("info request 127.0.0.1:")) << log;
    EXPECT_TRUE(has(" GET /v1/shards/" + shard + "/snapshot?asof=0 400 ")) << log;
    EXPECT_TRUE(has("info sink f" + level + " of shard " + shard + ": running")) << log;
    EXPECT_TRUE(has("info sink f" + level + " of shard " + shard + ": stopped")) << log;
    EXPECT_EQ(has("debug request 127.0.0.1:") && has(" POST /v1/shards 201 "), level == "debug")
        << log;
  }
}

// Issue 18: SIGTERM with sinks whose S3 endpoint or Kafka broker accepts
// connections and never answers did not exit within 45 s (S3: a 30 s stall
// times 8 attempts). Their calls are cancelled now: the process exits
// cleanly well within the shutdown grace (10 s).
TEST_F(CliTest, ServeStopsPromptlyOnSigtermWhileSinkDestinationsNeverAnswer) {
  ::setenv("AWS_ACCESS_KEY_ID", "tidemark-test", 0);
  ::setenv("AWS_SECRET_ACCESS_KEY", "tidemark-test-secret", 0);
  tidemark::testing::SilentListener silent;
  const std::string port = std::to_string(silent.port());
  auto serving = tidemark::testing::start_server(
      {"--data", (dir_ / "data").string()}, dir_ / "serve.err",
      {"--allow-s3-endpoints", "http://127.0.0.1", "--allow-kafka-brokers", "127.0.0.1"});
  ASSERT_GT(serving.port, 0) << tidemark::testing::slurp(dir_ / "serve.err");
  namespace http = boost::beast::http;
  auto call = [&](http::verb verb, const std::string& target, const std::string& body = "") {
    return tidemark::testing::http_call(serving.port, verb, target, body);
  };
  ASSERT_EQ(call(http::verb::post, "/v1/shards", R"({"name": "s"})").status, 201u);
  for (const std::string& to :
       {"s3://bucket/p?endpoint=http://127.0.0.1:" + port, "kafka://127.0.0.1:" + port + "/t"}) {
    auto created = call(http::verb::post, "/v1/sinks",
                        R"({"name": ")" + std::string(to.starts_with("s3") ? "objects" : "topic") +
                            R"(", "shard": "s", "to": ")" + to + "\"}");
    ASSERT_EQ(created.status, 201u) << created.body;
  }
  for (int i = 0; i < 1000 && silent.connections() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(silent.connections(), 2);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // well inside their calls
  const auto began = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(serving.pid, SIGTERM), 0);
  int status = 0;
  pid_t waited = 0;
  while ((waited = ::waitpid(serving.pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - began < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (waited == 0) {
    ::kill(serving.pid, SIGKILL);
    ::waitpid(serving.pid, nullptr, 0);
    FAIL() << "serve did not exit within 60 s of SIGTERM";
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::fprintf(stderr, "SIGTERM to exit with two stuck sinks: %.2f s\n", seconds);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << status << "\n"
      << tidemark::testing::slurp(dir_ / "serve.err");
  EXPECT_LT(seconds, 8.0) << tidemark::testing::slurp(dir_ / "serve.err");
}

}  // namespace
