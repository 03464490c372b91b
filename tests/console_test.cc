// The live console (GET /), loaded by a real browser: headless Chromium
// runs the page's script against a real `tidemark serve`, and the test
// reads the document it built. Skipped without Chromium (install-deps.sh
// installs it; under `make test` a skip fails).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "server/test_client.h"
#include "server_process.h"

namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;

const char* chromium_binary() {
  for (const char* path : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return nullptr;
}

class ConsoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tidemark-console-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (server_.pid > 0) {
      ::kill(server_.pid, SIGTERM);
      ::waitpid(server_.pid, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  void start(const std::vector<std::string>& flags = {}) {
    server_ = tidemark::testing::start_server({"--data", (dir_ / "data").string()},
                                              dir_ / "serve.err", flags);
    ASSERT_GT(server_.port, 0) << tidemark::testing::slurp(dir_ / "serve.err");
  }

  tidemark::testing::Reply call(http::verb verb, const std::string& target,
                                const std::string& body = "",
                                const std::map<std::string, std::string>& headers = {}) {
    return tidemark::testing::http_call(server_.port, verb, target, body, headers);
  }

  // The document the page has built after its script ran (and refreshed)
  // for a few seconds of the browser's virtual time.
  std::string rendered_page() {
    const fs::path out = dir_ / "dom.html";
    const std::string command =
        std::string(chromium_binary()) +
        " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run"
        " --user-data-dir=" +
        (dir_ / "profile").string() +
        " --virtual-time-budget=5000 --dump-dom http://127.0.0.1:" + std::to_string(server_.port) +
        "/ > " + out.string() + " 2> " + (dir_ / "chromium.err").string();
    const int status = std::system(command.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << tidemark::testing::slurp(dir_ / "chromium.err");
    return tidemark::testing::slurp(out);
  }

  fs::path dir_;
  tidemark::testing::ServerProcess server_;
};

TEST_F(ConsoleTest, ShowsShardsHoldsAndSinksAsTheServerReportsThem) {
  if (!chromium_binary()) GTEST_SKIP() << "no Chromium (scripts/install-deps.sh installs it)";
  ASSERT_NO_FATAL_FAILURE(start());
  tidemark::testing::Reply page = call(http::verb::get, "/");
  ASSERT_EQ(page.status, 200u);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");

  ASSERT_EQ(call(http::verb::post, "/v1/shards", R"({"name": "orders"})").status, 201u);
  ASSERT_EQ(call(http::verb::post, "/v1/shards/orders/append?lower=0&upper=3",
                 "{\"key\":\"a\",\"value\":1,\"time\":0}\n{\"key\":\"b\",\"value\":2,\"time\":2}\n")
                .status,
            200u);
  const std::string to = "file://" + (dir_ / "data" / "sinks" / "files").string();
  ASSERT_EQ(call(http::verb::post, "/v1/sinks",
                 R"({"name": "files", "shard": "orders", "to": ")" + to + "\"}")
                .status,
            201u);
  std::string status;
  for (int i = 0; i < 500 && status.find("\"frontier\":3") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    status = call(http::verb::get, "/v1/sinks/files").body;
  }
  ASSERT_NE(status.find("\"frontier\":3"), std::string::npos) << status;

  const std::string dom = rendered_page();
  // The shard's row: name, upper, since, ..., its sink's hold.
  EXPECT_NE(dom.find("<td>orders</td><td class=\"n\">3</td><td class=\"n\">2</td>"),
            std::string::npos)
      << dom;
  EXPECT_NE(dom.find("c-sink-files at 2 (critical)"), std::string::npos) << dom;
  // The sink's row, caught up.
  EXPECT_NE(dom.find("<td>files</td><td>orders</td><td>" + to +
                     "</td><td class=\"running\">running</td><td class=\"n\">3</td>"
                     "<td class=\"n\">0</td>"),
            std::string::npos)
      << dom;
  EXPECT_NE(dom.find("id=\"shard-count\" class=\"muted\">(1)</span>"), std::string::npos) << dom;
  EXPECT_NE(dom.find("updated "), std::string::npos) << dom;  // not an error
}

// With --token-file the page still loads (it holds no data), its reads
// are refused without the token, and it asks for the token instead.
TEST_F(ConsoleTest, AskForTheTokenWhenTheServerWantsOne) {
  if (!chromium_binary()) GTEST_SKIP() << "no Chromium (scripts/install-deps.sh installs it)";
  std::ofstream(dir_ / "token") << "s3cret\n";
  ASSERT_NO_FATAL_FAILURE(start({"--token-file", (dir_ / "token").string()}));
  EXPECT_EQ(call(http::verb::get, "/").status, 200u);
  EXPECT_EQ(call(http::verb::get, "/v1/shards").status, 401u);
  const std::string dom = rendered_page();
  EXPECT_NE(dom.find("<form id=\"auth\" style=\"display: block;\">"), std::string::npos) << dom;
  EXPECT_NE(dom.find("cannot read the server: the server wants its token"), std::string::npos)
      << dom;
}

}  // namespace
