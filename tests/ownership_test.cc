// One owner at a time, with real processes: a data directory has one
// `tidemark serve`, a sink one runner, a destination one sink. Each test
// starts the real binaries and checks what the second comer gets (exit 1 or
// a 409 naming the holder, nothing of the holder's touched) and that a
// SIGKILLed holder's successor starts at once (no wait for a lease to run
// out). Kafka through tidemark-kafka-mock; S3 and PostgreSQL through the
// servers of TIDEMARK_TEST_S3 and TIDEMARK_TEST_POSTGRES (skipped without).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/postgres_test_schema.h"
#include "testing/s3_test_prefix.h"
#include "testing/server_client.h"
#include "server_process.h"
#include "sink/file_destination.h"
#include "testing/kafka_mock_process.h"

namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;
using tidemark::testing::CommandOutcome;
using tidemark::testing::ServerProcess;
using tidemark::testing::slurp;

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

// A process this test started, killed (SIGKILL) and reaped when it goes.
class Child {
 public:
  Child() = default;
  explicit Child(pid_t pid) : pid_(pid) {}
  Child(Child&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}
  Child& operator=(Child&& other) noexcept {
    std::swap(pid_, other.pid_);
    return *this;
  }
  ~Child() { kill(); }
  pid_t pid() const { return pid_; }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // SIGTERM, then the exit status (-1 unless it exited).
  int stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
};

class OwnershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_ = fs::temp_directory_path() /
               ("tidemark-ownership-" + std::to_string(getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(scratch_);
    fs::create_directories(scratch_);
    location_ = {"--data", (scratch_ / "data").string()};
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(scratch_);
  }

  std::vector<std::string> with_location(const std::vector<std::string>& words) const {
    std::vector<std::string> all = location_;
    all.insert(all.end(), words.begin(), words.end());
    return all;
  }

  CommandOutcome run(const std::vector<std::string>& words, const std::string& tag = "cmd") {
    return tidemark::testing::run_tidemark(with_location(words), scratch_, tag);
  }

  // `tidemark LOCATION words...` in the background, stderr to <tag>.err.
  Child spawn(const std::vector<std::string>& words, const std::string& tag) {
    return Child(tidemark::testing::spawn_tidemark(with_location(words), err(tag)));
  }
  fs::path err(const std::string& tag) const { return scratch_ / (tag + ".err"); }

  // Waits until <tag>.err holds `text`.
  bool wait_for(const std::string& tag, const std::string& text,
                std::chrono::seconds timeout = std::chrono::seconds(30)) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (slurp(err(tag)).find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // A shard `name` whose times [0, upper) hold one record each.
  void make_shard(const std::string& name, int upper) {
    ASSERT_EQ(run({"shard", "create", name}).status, 0);
    append(name, 0, upper);
  }
  void append(const std::string& name, int lower, int upper) {
    std::string records;
    for (int t = lower; t < upper; ++t) {
      records +=
          "{\"key\":" + std::to_string(t) + ",\"value\":1,\"time\":" + std::to_string(t) + "}\n";
    }
    std::ofstream(scratch_ / "records.ndjson") << records;
    auto appended = run({"append", name, "--lower", std::to_string(lower), "--upper",
                         std::to_string(upper), "--input", (scratch_ / "records.ndjson").string()});
    ASSERT_EQ(appended.status, 0) << appended.err;
  }

  // Runs a sink `name` of shard s into `to` until it is killed; returns once
  // it has committed (its first progress line).
  Child start_sink(const std::string& name, const std::string& to, const std::string& shard = "s") {
    Child sink = spawn({"sink", "run", shard, "--to", to, "--sink-name", name}, "sink-" + name);
    EXPECT_TRUE(wait_for("sink-" + name, "sink " + name + ": frontier"))
        << slurp(err("sink-" + name));
    return sink;
  }

  // The second runner of a destination, or a sink's second runner: exits 1
  // at once, naming the holder.
  void expect_refused(const std::vector<std::string>& words,
                      const std::vector<std::string>& named) {
    const auto started = Clock::now();
    CommandOutcome outcome = run(words, "refused");
    EXPECT_EQ(outcome.status, 1) << outcome.err;
    EXPECT_LT(Clock::now() - started, std::chrono::seconds(10)) << "not at once";
    for (const std::string& text : named) {
      EXPECT_NE(outcome.err.find(text), std::string::npos) << outcome.err << "\nnames no " << text;
    }
  }

  // A SIGKILLed sink's restart takes over at once: with the shard moved
  // on to `until`, the restarted run reaches it and exits 0 well within the
  // lease's 30 s.
  void expect_restart_takes_over(const std::string& name, const std::string& to, int until,
                                 const std::string& shard = "s") {
    const auto started = Clock::now();
    CommandOutcome outcome = run(
        {"sink", "run", shard, "--to", to, "--sink-name", name, "--until", std::to_string(until)},
        "restart-" + name);
    EXPECT_EQ(outcome.status, 0) << outcome.err;
    EXPECT_LT(Clock::now() - started, std::chrono::seconds(20)) << outcome.err;
  }

  fs::path scratch_;
  std::vector<std::string> location_;
};

TEST_F(OwnershipTest, ASecondServerOnOneDataDirectoryExitsAtOnceNamingTheFirst) {
  ServerProcess first = tidemark::testing::start_server(location_, err("serve-1"));
  Child first_child(first.pid);
  ASSERT_GT(first.port, 0) << slurp(err("serve-1"));
  const std::string server_id = slurp(scratch_ / "data" / "server-id");

  const auto started = Clock::now();
  CommandOutcome second = run({"serve", "--listen", "127.0.0.1:0"}, "serve-2");
  EXPECT_EQ(second.status, 1) << second.err;
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(5));
  for (const std::string& named :
       {"data directory " + fs::absolute(scratch_ / "data").string() + " is used by tidemark serve",
        "pid " + std::to_string(first.pid) + " on host " + host_name(), std::string("started 20"),
        "listening on 127.0.0.1:" + std::to_string(first.port)}) {
    EXPECT_NE(second.err.find(named), std::string::npos) << second.err << "\nnames no " << named;
  }
  EXPECT_EQ(second.err.find("serving on"), std::string::npos) << second.err;
  EXPECT_EQ(slurp(scratch_ / "data" / "server-id"), server_id);
  // The first one is untouched.
  EXPECT_EQ(tidemark::testing::http_call(first.port, http::verb::get, "/healthz").status, 200u);

  // Killed, its lock goes with it: the next one starts at once.
  first_child.kill();
  const auto restarted = Clock::now();
  ServerProcess third = tidemark::testing::start_server(location_, err("serve-3"));
  Child third_child(third.pid);
  ASSERT_GT(third.port, 0) << slurp(err("serve-3"));
  EXPECT_LT(Clock::now() - restarted, std::chrono::seconds(3));
  EXPECT_EQ(third_child.stop(), 0);
}

TEST_F(OwnershipTest, ServerFileSinkDirectoryIsRefusedToSinkRunAndItsTemporariesKept) {
  ServerProcess server = tidemark::testing::start_server(location_, err("serve"));
  Child server_child(server.pid);
  ASSERT_GT(server.port, 0) << slurp(err("serve"));
  auto call = [&](http::verb verb, const std::string& target, const std::string& body = "") {
    return tidemark::testing::http_call(server.port, verb, target, body);
  };
  ASSERT_EQ(call(http::verb::post, "/v1/shards", R"({"name":"s"})").status, 201u);
  ASSERT_EQ(call(http::verb::post, "/v1/shards/s/append", "{\"key\":1,\"value\":1}\n").status,
            200u);
  const fs::path dir = scratch_ / "data" / "sinks" / "files";
  const std::string to = "file://" + dir.string();
  auto created = call(http::verb::post, "/v1/sinks",
                      "{\"name\":\"files\",\"shard\":\"s\",\"to\":\"" + to + "\"}");
  ASSERT_EQ(created.status, 201u) << created.body;
  bool running = false;
  for (int i = 0; i < 500 && !running; ++i) {
    running = call(http::verb::get, "/v1/sinks/files").body.find("\"frontier\":null") ==
              std::string::npos;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(running) << call(http::verb::get, "/v1/sinks/files").body;
  // A temporary the server's sink could be writing.
  const fs::path temporary = dir / ".00000000000000000042-being-written.tmp";
  std::ofstream(temporary) << "half a line";

  const std::string holder = "tidemark serve on 127.0.0.1:" + std::to_string(server.port);
  const std::string pid = "pid " + std::to_string(server.pid);
  // Another sink name into its directory: refused before anything is deleted.
  expect_refused(
      {"sink", "run", "s", "--to", to, "--sink-name", "other"},
      {"file destination " + dir.string() + " is written by sink files of shard s", holder, pid});
  EXPECT_TRUE(fs::exists(temporary)) << "sink run deleted the server sink's temporary";
  // The same sink name elsewhere: the sink has its runner already.
  expect_refused({"sink", "run", "s", "--to", "file://" + (scratch_ / "elsewhere").string(),
                  "--sink-name", "files"},
                 {"sink files of shard s is held by " + holder, pid});
  // A second server sink into the directory: 409 naming the holder.
  auto taken = call(http::verb::post, "/v1/sinks",
                    "{\"name\":\"copy\",\"shard\":\"s\",\"to\":\"" + to + "\"}");
  EXPECT_EQ(taken.status, 409u) << taken.body;
  EXPECT_NE(taken.body.find("is written by sink files of shard s"), std::string::npos)
      << taken.body;
  EXPECT_EQ(call(http::verb::get, "/v1/sinks/copy").status, 404u);
  EXPECT_TRUE(fs::exists(temporary));

  // Deleted from the server, the sink is free for a `sink run` at once
  // (whose open deletes the leftover temporary: the directory is its now).
  ASSERT_EQ(call(http::verb::delete_, "/v1/sinks/files").status, 200u);
  CommandOutcome freed =
      run({"sink", "run", "s", "--to", to, "--sink-name", "files", "--until", "1"}, "freed");
  EXPECT_EQ(freed.status, 0) << freed.err;
  EXPECT_FALSE(fs::exists(temporary));
  EXPECT_EQ(server_child.stop(), 0);
}

TEST_F(OwnershipTest, TwoSinkNamesOnOneDirectoryAndAKilledHoldersRestart) {
  ASSERT_NO_FATAL_FAILURE(make_shard("s", 2));
  const std::string to = "file://" + (scratch_ / "out").string();
  Child a = start_sink("a", to);
  expect_refused({"sink", "run", "s", "--to", to, "--sink-name", "b"},
                 {"is written by sink a of shard s, run by tidemark sink run",
                  "pid " + std::to_string(a.pid())});
  expect_refused(
      {"sink", "run", "s", "--to", "file://" + (scratch_ / "other").string(), "--sink-name", "a"},
      {"sink a of shard s is held by tidemark sink run", "pid " + std::to_string(a.pid())});
  a.kill();
  ASSERT_NO_FATAL_FAILURE(append("s", 2, 3));
  expect_restart_takes_over("a", to, 3);
}

TEST_F(OwnershipTest, TwoSinkNamesOnOneKafkaTopicAndAKilledHoldersRestart) {
  if (tidemark::kUnderTsan) GTEST_SKIP() << tidemark::kKafkaUnderTsan;
  auto broker = tidemark::KafkaMockProcess::start(
      TIDEMARK_KAFKA_MOCK, {"--topic", "out:2", "--topic", "out-progress:1"});
  ASSERT_TRUE(broker) << broker.error().message;
  ASSERT_NO_FATAL_FAILURE(make_shard("s", 2));
  const std::string to = "kafka://" + (*broker)->brokers() + "/out";
  Child a = start_sink("a", to);
  expect_refused({"sink", "run", "s", "--to", to, "--sink-name", "b"},
                 {"destination kafka://" + (*broker)->brokers() +
                      "/out (written by sink a of shard s) is held by tidemark sink run",
                  "pid " + std::to_string(a.pid())});
  a.kill();
  ASSERT_NO_FATAL_FAILURE(append("s", 2, 3));
  expect_restart_takes_over("a", to, 3);
}

TEST_F(OwnershipTest, TwoSinkNamesOnOneS3PrefixAndAKilledHoldersRestart) {
  auto server = tidemark::s3_test_server();
  if (!server) GTEST_SKIP() << tidemark::no_s3_server_message();
  auto url = tidemark::parse_s3_url(*server);
  ASSERT_TRUE(url) << url.error().message;
  url->prefix =
      (url->prefix.empty() ? "" : url->prefix + "/") + "ownership-" + std::to_string(getpid());
  ASSERT_NO_FATAL_FAILURE(make_shard("s", 2));
  const std::string to = url->to_string();
  Child a = start_sink("a", to);
  expect_refused({"sink", "run", "s", "--to", to, "--sink-name", "b"},
                 {"(written by sink a of shard s) is held by tidemark sink run",
                  "pid " + std::to_string(a.pid())});
  a.kill();
  ASSERT_NO_FATAL_FAILURE(append("s", 2, 3));
  expect_restart_takes_over("a", to, 3);
}

TEST_F(OwnershipTest, ALeaseIsHonouredAcrossProcessesSharingPostgres) {
  auto postgres = tidemark::postgres_test_server();
  if (!postgres) GTEST_SKIP() << tidemark::no_postgres_server_message();
  location_.insert(location_.end(), {"--consensus", *postgres});
  // The database outlives the test: names of this run's own.
  const std::string shard = "own" + std::to_string(getpid()) + "-" +
                            std::to_string(std::chrono::system_clock::now().time_since_epoch() /
                                           std::chrono::milliseconds(1));
  ASSERT_NO_FATAL_FAILURE(make_shard(shard, 2));
  Child a = start_sink("a", "file://" + (scratch_ / "a").string(), shard);
  // Its lease lives in PostgreSQL: a process whose directory differs still
  // finds the sink held.
  expect_refused(
      {"sink", "run", shard, "--to", "file://" + (scratch_ / "b").string(), "--sink-name", "a"},
      {"sink a of shard " + shard + " is held by tidemark sink run",
       "pid " + std::to_string(a.pid())});
  a.kill();
  ASSERT_NO_FATAL_FAILURE(append(shard, 2, 3));
  expect_restart_takes_over("a", "file://" + (scratch_ / "a").string(), 3, shard);
}

}  // namespace
