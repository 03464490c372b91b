// `tidemark serve` killed with SIGKILL under load, then restarted, twice:
// every acknowledged append is present exactly once, nothing appears that
// no client sent, and the server's file sink resumes from its progress (its
// committed files hold each record of the shard exactly once).
//
// Clients: 16 threads, each sending managed appends of 1-4 records with
// distinct keys over its own connections; a 200 answer acknowledges the
// request's records. Requests in flight at a kill may or may not have been
// committed: they are checked to be at most once.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "testing/server_client.h"
#include "server_process.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
namespace fs = std::filesystem;

using tidemark::testing::lines_of;
using tidemark::testing::Reply;
using tidemark::testing::ServerProcess;
using tidemark::testing::slurp;

ServerProcess start_server(const fs::path& data, const fs::path& err) {
  return tidemark::testing::start_server({"--data", data.string()}, err);
}

Reply call(std::uint16_t port, http::verb method, const std::string& target,
           const std::string& body = "") {
  return tidemark::testing::http_call(port, method, target, body);
}

// The "key" text of a line {"key":K,...} (keys here are strings w/o quotes).
std::string key_of(const std::string& line) {
  const auto at = line.find("\"key\":\"");
  if (at == std::string::npos) return "";
  const auto end = line.find('"', at + 7);
  return line.substr(at + 7, end - at - 7);
}

TEST(ServerCrashTest, SigkillUnderLoadThenRestartLosesNothingAcknowledged) {
  const fs::path scratch =
      fs::temp_directory_path() / ("tidemark-servercrash-" + std::to_string(getpid()));
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const fs::path data = scratch / "data", out = data / "sinks" / "files";

  ServerProcess server = start_server(data, scratch / "serve-0.err");
  ASSERT_GT(server.port, 0) << slurp(scratch / "serve-0.err");
  ASSERT_EQ(call(server.port, http::verb::post, "/v1/shards", R"({"name":"s"})").status, 201u);
  // A first record so the sink has a snapshot to start from.
  ASSERT_EQ(
      call(server.port, http::verb::post, "/v1/shards/s/append", "{\"key\":\"seed\",\"value\":0}\n")
          .status,
      200u);
  ASSERT_EQ(call(server.port, http::verb::post, "/v1/sinks",
                 "{\"name\":\"files\",\"shard\":\"s\",\"to\":\"file://" + out.string() + "\"}")
                .status,
            201u);

  std::mutex mutex;
  std::set<std::string> acked = {"seed"}, sent = {"seed"};
  std::atomic<std::uint16_t> port{server.port};
  constexpr int kRounds = 2;
  for (int round = 0; round <= kRounds; ++round) {
    std::atomic<bool> go{true};
    std::vector<std::thread> clients;
    for (int c = 0; c < 16; ++c) {
      clients.emplace_back([&, c, round] {
        for (int n = 0; go; ++n) {
          std::string body;
          std::vector<std::string> keys;
          for (int k = 0; k < 1 + (n % 4); ++k) {
            keys.push_back("r" + std::to_string(round) + "c" + std::to_string(c) + "n" +
                           std::to_string(n) + "k" + std::to_string(k));
            body += "{\"key\":\"" + keys.back() + "\",\"value\":" + std::to_string(n) + "}\n";
          }
          {
            std::lock_guard lock(mutex);
            sent.insert(keys.begin(), keys.end());
          }
          Reply reply = call(port, http::verb::post, "/v1/shards/s/append", body);
          if (reply.status == 200) {
            std::lock_guard lock(mutex);
            acked.insert(keys.begin(), keys.end());
          } else if (reply.status == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the server is down
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    if (round < kRounds) {
      // Kill it mid-load, and start it again while clients keep trying.
      ASSERT_EQ(kill(server.pid, SIGKILL), 0);
      int status = 0;
      waitpid(server.pid, &status, 0);
      server = start_server(data, scratch / ("serve-" + std::to_string(round + 1) + ".err"));
      ASSERT_GT(server.port, 0) << slurp(scratch / ("serve-" + std::to_string(round + 1) + ".err"));
      port = server.port;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    go = false;
    for (auto& t : clients) t.join();
  }

  // The shard: every acknowledged record, each once; nothing unsent.
  Reply snapshot = call(server.port, http::verb::get, "/v1/shards/s/snapshot");
  ASSERT_EQ(snapshot.status, 200u);
  std::set<std::string> present;
  for (const auto& line : lines_of(snapshot.body)) {
    const std::string key = key_of(line);
    ASSERT_NE(line.find("\"diff\":1}"), std::string::npos) << "not once: " << line;
    ASSERT_TRUE(sent.contains(key)) << "never sent: " << line;
    ASSERT_TRUE(present.insert(key).second) << "twice: " << key;
  }
  std::size_t missing = 0;
  for (const auto& key : acked) missing += present.contains(key) ? 0 : 1;
  EXPECT_EQ(missing, 0u) << "acknowledged appends lost";
  EXPECT_GT(acked.size(), 100u);

  // The sink resumed and holds each record once: wait for it to catch up.
  auto upper_of = [&]() -> std::string {
    Reply inspect = call(server.port, http::verb::get, "/v1/shards/s");
    const auto at = inspect.body.find("\"upper\":");
    return inspect.body.substr(at + 8, inspect.body.find(',', at) - at - 8);
  };
  const std::string upper = upper_of();
  bool caught_up = false;
  for (int i = 0; i < 600 && !caught_up; ++i) {
    Reply status = call(server.port, http::verb::get, "/v1/sinks/files");
    caught_up = status.body.find("\"frontier\":" + upper) != std::string::npos;
    if (!caught_up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(caught_up) << call(server.port, http::verb::get, "/v1/sinks/files").body;
  std::multiset<std::string> emitted;
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(".")) continue;  // a killed run's temporary
    for (const auto& line : lines_of(slurp(entry.path()))) emitted.insert(key_of(line));
  }
  for (const auto& key : present) {
    ASSERT_EQ(emitted.count(key), 1u) << key;
  }
  EXPECT_EQ(emitted.size(), present.size());
  std::printf("%zu records sent, %zu acknowledged, %zu present, %zu in the sink's files\n",
              sent.size(), acked.size(), present.size(), emitted.size());

  kill(server.pid, SIGTERM);
  int status = 0;
  waitpid(server.pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(scratch / "serve-2.err");
  if (!::testing::Test::HasFailure()) fs::remove_all(scratch);
}

}  // namespace
