// `tidemark serve` under a real pids limit (the cgroup pids controller, as
// a container's): once no thread can be started, the server goes on
// serving on the threads of its shared pools (new shards included), and a
// request that needs a thread none can give fails with 503 and a message
// that says so. Before, the unguarded std::thread constructor threw and the
// server aborted ("terminate called after throwing std::system_error").
//
// Needs root and a pids controller (cgroup v1 at /sys/fs/cgroup/pids, or
// v2 with "pids" enabled for children); skipped otherwise.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "testing/server_client.h"
#include "server_process.h"

namespace {

namespace http = boost::beast::http;
namespace fs = std::filesystem;

using tidemark::testing::Reply;
using tidemark::testing::slurp;

bool write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  return static_cast<bool>(out);
}

// A cgroup of its own with the pids controller; removed when dropped (once
// its processes are gone).
class PidsCgroup {
 public:
  static std::optional<PidsCgroup> create(const std::string& name) {
    std::error_code ec;
    fs::path parent = "/sys/fs/cgroup/pids";
    if (!fs::exists(parent / "pids.max", ec) && !fs::exists(parent / "cgroup.procs", ec)) {
      // cgroup v2: the root must hand "pids" to its children.
      parent = "/sys/fs/cgroup";
      if (slurp(parent / "cgroup.controllers").find("pids") == std::string::npos) {
        return std::nullopt;
      }
      (void)write_file(parent / "cgroup.subtree_control", "+pids");
    }
    const fs::path dir = parent / name;
    fs::create_directory(dir, ec);
    if (ec || !fs::exists(dir / "pids.max")) return std::nullopt;
    return PidsCgroup(dir);
  }
  PidsCgroup(PidsCgroup&& other) noexcept : dir_(std::move(other.dir_)) { other.dir_.clear(); }
  ~PidsCgroup() {
    if (dir_.empty()) return;
    std::error_code ec;
    for (int i = 0; i < 100 && !fs::remove(dir_, ec); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  bool add(pid_t pid) const { return write_file(dir_ / "cgroup.procs", std::to_string(pid)); }
  long current() const { return std::stol("0" + slurp(dir_ / "pids.current")); }
  bool limit(long n) const { return write_file(dir_ / "pids.max", std::to_string(n)); }
  // How often a fork or clone was refused at the limit.
  long refusals() const {
    const std::string events = slurp(dir_ / "pids.events");
    const auto at = events.find("max ");
    return at == std::string::npos ? 0 : std::stol(events.substr(at + 4));
  }

 private:
  explicit PidsCgroup(fs::path dir) : dir_(std::move(dir)) {}
  fs::path dir_;
};

TEST(ThreadLimitTest, AServerOutOfThreadsFailsTheRequestsThatNeedOneAndGoesOn) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a cgroup";
  auto cgroup = PidsCgroup::create("tidemark-thread-limit-" + std::to_string(::getpid()));
  if (!cgroup) GTEST_SKIP() << "no cgroup pids controller here";
  const fs::path dir =
      fs::temp_directory_path() / ("tidemark-thread-limit-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto server =
      tidemark::testing::start_server({"--data", (dir / "data").string()}, dir / "serve.err");
  ASSERT_GT(server.port, 0) << slurp(dir / "serve.err");
  struct Reap {
    pid_t pid;
    ~Reap() {
      if (pid > 0 && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  } reap{server.pid};
  ASSERT_TRUE(cgroup->add(server.pid));
  auto call = [&](http::verb verb, const std::string& target, const std::string& body = "") {
    return tidemark::testing::http_call(server.port, verb, target, body);
  };
  // One shard with data while threads are still to be had.
  ASSERT_EQ(call(http::verb::post, "/v1/shards", R"({"name": "first"})").status, 201u);
  ASSERT_EQ(
      call(http::verb::post, "/v1/shards/first/append", "{\"key\":\"a\",\"value\":1}\n").status,
      200u);
  // No thread to spare. Shards, appenders, writers' heartbeats, sinks
  // and compaction run on the process's shared pools, whose threads exist
  // already, so new shards are still created and appended to: a request
  // that needs a thread the pools cannot give waits for one of theirs. (Up
  // to issue 18 each shard's first append needed three threads of its
  // own, and the first refused once the limit was reached.)
  ASSERT_TRUE(cgroup->limit(cgroup->current()));
  int served = 0;
  for (int i = 0; i < 20; ++i) {
    const std::string name = "s" + std::to_string(i);
    Reply created = call(http::verb::post, "/v1/shards", R"({"name": ")" + name + "\"}");
    Reply appended = call(http::verb::post, "/v1/shards/" + name + "/append",
                          "{\"key\":\"k\",\"value\":" + std::to_string(i) + "}\n");
    EXPECT_EQ(created.status, 201u) << created.body << "\n" << slurp(dir / "serve.err");
    EXPECT_EQ(appended.status, 200u) << appended.body << "\n" << slurp(dir / "serve.err");
    if (appended.status == 200) ++served;
  }
  EXPECT_EQ(served, 20);

  // Alive, and still serving: an open shard's appender takes appends (an
  // upload that gets no thread of its own runs on the appender's). A
  // snapshot takes a leased reader, whose heartbeat runs on the shared
  // timers: it is served, or refused with 503 saying why.
  int status = 0;
  ASSERT_EQ(::waitpid(server.pid, &status, WNOHANG), 0) << slurp(dir / "serve.err");
  EXPECT_EQ(call(http::verb::get, "/healthz").status, 200u);
  EXPECT_EQ(call(http::verb::get, "/v1/shards/first").status, 200u);
  for (int i = 0; i < 5; ++i) {
    Reply appended = call(http::verb::post, "/v1/shards/first/append",
                          "{\"key\":\"b" + std::to_string(i) + "\",\"value\":2}\n");
    EXPECT_EQ(appended.status, 200u) << appended.body;
  }
  Reply snapshot = call(http::verb::get, "/v1/shards/first/snapshot");
  if (snapshot.status == 200u) {
    EXPECT_NE(snapshot.body.find("\"key\":\"b4\""), std::string::npos) << snapshot.body;
  } else {
    EXPECT_EQ(snapshot.status, 503u) << snapshot.body;
    EXPECT_NE(snapshot.body.find("cannot start a thread"), std::string::npos) << snapshot.body;
  }

  // The first sink starts its manager's timer thread: refused (503, saying
  // it cannot start a thread) with nothing left behind, or running.
  Reply sink = call(http::verb::post, "/v1/sinks",
                    R"({"name": "f", "shard": "first", "to": "file://)" +
                        (dir / "data" / "sinks" / "f").string() + "\"}");
  if (sink.status == 503) {
    EXPECT_NE(sink.body.find("cannot start a thread"), std::string::npos) << sink.body;
    EXPECT_GT(cgroup->refusals(), 0);  // the kernel did refuse one
    EXPECT_EQ(call(http::verb::get, "/v1/sinks").body, "[]\n");
  } else {
    EXPECT_EQ(sink.status, 201u) << sink.body;
  }

  // Room again: shards open as before, then a clean stop.
  ASSERT_TRUE(cgroup->limit(cgroup->current() + 64));
  Reply later = call(http::verb::post, "/v1/shards/first/append", "{\"key\":\"c\",\"value\":3}\n");
  EXPECT_EQ(later.status, 200u) << later.body;
  snapshot = call(http::verb::get, "/v1/shards/first/snapshot");
  EXPECT_EQ(snapshot.status, 200u) << snapshot.body;
  for (const char* key : {"\"a\"", "\"b0\"", "\"b4\"", "\"c\""}) {
    EXPECT_NE(snapshot.body.find(std::string("\"key\":") + key), std::string::npos)
        << key << " missing from " << snapshot.body;
  }
  ASSERT_EQ(call(http::verb::post, "/v1/shards", R"({"name": "after"})").status, 201u);
  Reply after = call(http::verb::post, "/v1/shards/after/append", "{\"key\":\"z\",\"value\":1}\n");
  EXPECT_EQ(after.status, 200u) << after.body;
  ASSERT_EQ(::kill(server.pid, SIGTERM), 0);
  ASSERT_EQ(::waitpid(server.pid, &status, 0), server.pid);
  reap.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n"
                                                             << slurp(dir / "serve.err");
  EXPECT_EQ(slurp(dir / "serve.err").find("terminate called"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
