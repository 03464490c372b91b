// `tidemark serve` processes meeting what production does to them: a
// server paused (SIGSTOP) for longer than its leases while another server
// goes on, and a server killed (SIGKILL) in the middle of an idempotent
// producer's request. Both on a location shared by two data directories
// (a file blob and a SQLite consensus), as servers of a deployment share
// PostgreSQL and S3.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "testing/server_client.h"
#include "server_process.h"
#include "util/json.h"

namespace {

namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
namespace fs = std::filesystem;

using tidemark::testing::lines_of;
using tidemark::testing::Reply;
using tidemark::testing::ServerProcess;

class ServerFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tidemark-server-faults-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "shared" / "blob");
  }
  void TearDown() override {
    for (pid_t pid : pids_) {
      kill(pid, SIGCONT);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  // A server with a data directory of its own on the shared location.
  ServerProcess start(const std::string& name, const std::vector<std::string>& flags = {}) {
    ServerProcess server = tidemark::testing::start_server(
        {"--data", (dir_ / name).string(), "--blob", "file://" + (dir_ / "shared" / "blob").string(),
         "--consensus", "sqlite://" + (dir_ / "shared" / "consensus.db").string()},
        dir_ / (name + ".err"), flags, tidemark::testing::ProcessGroup::kOwn);
    if (server.pid > 0) pids_.push_back(server.pid);
    return server;
  }

  static Reply post(std::uint16_t port, const std::string& target, const std::string& body,
                    const std::map<std::string, std::string>& headers = {}) {
    return tidemark::testing::http_call(port, http::verb::post, target, body, headers);
  }
  static Reply get(std::uint16_t port, const std::string& target) {
    return tidemark::testing::http_call(port, http::verb::get, target);
  }
  static std::uint64_t upper_of(std::uint16_t port) {
    auto json = tidemark::parse_json(get(port, "/v1/shards/s").body);
    return json ? json->find("upper")->as_u64().value_or(0) : 0;
  }
  // One explicit append of one record at the shard's upper.
  static Reply explicit_append(std::uint16_t port, const std::string& key) {
    const std::uint64_t at = upper_of(port);
    return post(port,
                "/v1/shards/s/append?lower=" + std::to_string(at) +
                    "&upper=" + std::to_string(at + 1),
                "{\"key\": \"" + key + "\", \"value\": 1, \"time\": " + std::to_string(at) + "}\n");
  }

  fs::path dir_;
  std::vector<pid_t> pids_;
};

// A server paused for three times its lease (another server drops its
// writers meanwhile) appends again once it resumes: its explicit appends
// answer at most once 503 (lease expired: retry), never "unknown writer"
// for good; its managed appends go on. Nothing is lost or doubled.
TEST_F(ServerFaultsTest, AServerPausedPastItsLeaseAppendsAgain) {
  ServerProcess a = start("a", {"--lease", "1000"}), b = start("b", {"--lease", "1000"});
  ASSERT_GT(a.port, 0);
  ASSERT_GT(b.port, 0);
  ASSERT_EQ(post(a.port, "/v1/shards", R"({"name": "s"})").status, 201u);
  int expected = 0;
  ASSERT_EQ(explicit_append(a.port, "a-before").status, 200u);
  ++expected;
  ASSERT_EQ(post(a.port, "/v1/shards/s/append", "{\"key\": \"a-managed-before\", \"value\": 1}\n")
                .status,
            200u);
  ++expected;

  ASSERT_EQ(kill(a.pid, SIGSTOP), 0);
  // Server b goes on for three leases: its transitions drop a's writers.
  for (int i = 0; i < 15; ++i) {
    Reply r = explicit_append(b.port, "b-" + std::to_string(i));
    ASSERT_EQ(r.status, 200u) << r.body;
    ++expected;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(kill(a.pid, SIGCONT), 0);

  int unavailable = 0;
  for (int i = 0; i < 5; ++i) {
    Reply r = explicit_append(a.port, "a-after-" + std::to_string(i));
    if (r.status == 503) {
      ++unavailable;
      EXPECT_NE(r.body.find("lease"), std::string::npos) << r.body;
      continue;
    }
    ASSERT_EQ(r.status, 200u) << r.body;
    ++expected;
  }
  EXPECT_LE(unavailable, 1) << "more than the one append that found the writer gone failed";
  Reply managed = post(a.port, "/v1/shards/s/append", "{\"key\": \"a-managed-after\", \"value\": 1}\n");
  ASSERT_EQ(managed.status, 200u) << managed.body;
  ++expected;
  Reply snapshot = get(b.port, "/v1/shards/s/snapshot");
  auto lines = lines_of(snapshot.body);
  EXPECT_EQ(lines.size(), static_cast<std::size_t>(expected)) << snapshot.body;
  for (const auto& line : lines) EXPECT_NE(line.find("\"diff\":1}"), std::string::npos) << line;
}

// Sends the header of a managed append and `fraction` of its body, slowly,
// then kills the server.
void cut_by_a_kill(const ServerProcess& server, const std::string& body, double fraction,
                   const std::string& extra_headers) {
  net::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server.port));
  const std::string header = "POST /v1/shards/s/append HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\n" + extra_headers + "\r\n";
  net::write(socket, net::buffer(header));
  const std::size_t piece = body.size() / 40;
  const auto end = static_cast<std::size_t>(static_cast<double>(body.size()) * fraction);
  for (std::size_t at = 0; at < end; at += piece) {
    net::write(socket, net::buffer(body.data() + at, std::min(piece, body.size() - at)));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(server.pid, SIGKILL);
  waitpid(server.pid, nullptr, 0);
}

// A server killed in the middle of a producer's request: its committed
// prefix is what the producer's retry (to the other server) finds, and the
// retry appends exactly the rest.
TEST_F(ServerFaultsTest, AProducersRequestCutByASigkillIsRetriedExactlyOnce) {
  ServerProcess a = start("a"), b = start("b");
  ASSERT_GT(a.port, 0);
  ASSERT_GT(b.port, 0);
  ASSERT_EQ(post(a.port, "/v1/shards", R"({"name": "s"})").status, 201u);
  const int records = 60'000;
  std::string body;
  for (int i = 0; i < records; ++i) {
    body += "{\"key\": " + std::to_string(i) + ", \"value\": \"" + std::string(60, 'v') + "\"}\n";
  }
  cut_by_a_kill(a, body, 0.75, "Tidemark-Producer: loader\r\nTidemark-Sequence: 0\r\n");
  auto state = tidemark::parse_json(get(b.port, "/v1/shards/s/producers/loader").body);
  ASSERT_TRUE(state);
  const tidemark::JsonValue* sequence = state->find("sequence");
  const std::uint64_t prefix = sequence->is_null() ? 0 : *sequence->as_u64() + 1;
  EXPECT_GT(prefix, 0u) << "nothing was committed before the kill: the test proves little";
  EXPECT_LT(prefix, static_cast<std::uint64_t>(records));
  // The producer retries the whole request with the other server.
  Reply retry = post(b.port, "/v1/shards/s/append", body,
                     {{"Tidemark-Producer", "loader"}, {"Tidemark-Sequence", "0"}});
  ASSERT_EQ(retry.status, 200u) << retry.body;
  EXPECT_NE(retry.body.find("\"duplicates\":" + std::to_string(prefix)), std::string::npos)
      << retry.body << " (the shard had committed " << prefix << ")";
  Reply snapshot = get(b.port, "/v1/shards/s/snapshot");
  auto lines = lines_of(snapshot.body);
  EXPECT_EQ(lines.size(), static_cast<std::size_t>(records));
  for (const auto& line : lines) ASSERT_NE(line.find("\"diff\":1}"), std::string::npos) << line;
}

// Without a producer, a request cut by a kill appended nothing of itself.
TEST_F(ServerFaultsTest, ARequestWithoutAProducerCutByASigkillAppendsNothing) {
  ServerProcess a = start("a"), b = start("b");
  ASSERT_GT(a.port, 0);
  ASSERT_GT(b.port, 0);
  ASSERT_EQ(post(a.port, "/v1/shards", R"({"name": "s"})").status, 201u);
  std::string body;
  for (int i = 0; i < 20'000; ++i) {
    body += "{\"key\": " + std::to_string(i) + ", \"value\": \"" + std::string(60, 'v') + "\"}\n";
  }
  cut_by_a_kill(a, body, 0.9, "");
  auto json = tidemark::parse_json(get(b.port, "/v1/shards/s").body);
  ASSERT_TRUE(json);
  EXPECT_EQ(json->find("updates")->as_u64(), std::optional<std::uint64_t>(0));
  EXPECT_EQ(json->find("upper")->as_u64(), std::optional<std::uint64_t>(0));
}

}  // namespace
