// The live console (GET /), loaded by a real browser: headless Chromium
// runs the page's script against a real `tidemark serve`, and the test
// reads the document it built. Skipped without Chromium (install-deps.sh
// installs it; under `make test` a skip fails).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/beast/websocket.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "server_process.h"
#include "testing/server_client.h"
#include "util/json.h"

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

// A page kept open in headless Chromium, driven over the DevTools
// protocol (a WebSocket): the test reads the live document while it
// changes the server under it.
class LivePage {
 public:
  LivePage(const fs::path& profile, std::uint16_t server_port) {
    const std::string url = "http://127.0.0.1:" + std::to_string(server_port) + "/";
    pid_ = tidemark::testing::spawn_process(
        {chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-dev-shm-usage", "--no-first-run", "--user-data-dir=" + profile.string(),
         "--remote-debugging-port=0", url},
        profile.string() + ".err");
    // Chromium writes the port it took into its profile.
    for (int i = 0; i < 400 && pid_ > 0 && devtools_port_ == 0; ++i) {
      std::istringstream in(tidemark::testing::slurp(profile / "DevToolsActivePort"));
      unsigned port = 0;
      if (in >> port) devtools_port_ = static_cast<std::uint16_t>(port);
      if (devtools_port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    // The page's target, once it is listed.
    for (int i = 0; i < 400 && devtools_port_ != 0 && page_path_.empty(); ++i) {
      auto list = tidemark::testing::http_call(devtools_port_, http::verb::get, "/json/list");
      auto targets = tidemark::parse_json(list.body);
      if (targets && targets->is_array()) {
        for (const auto& t : targets->as_array()) {
          const auto* type = t.find("type");
          const auto* at = t.find("url");
          const auto* ws = t.find("webSocketDebuggerUrl");
          if (type && type->is_string() && type->as_string() == "page" && at && at->is_string() &&
              at->as_string() == url && ws && ws->is_string()) {
            const std::string& full = ws->as_string();  // ws://127.0.0.1:PORT/devtools/page/ID
            page_path_ = full.substr(full.find("/devtools/"));
          }
        }
      }
      if (page_path_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    if (page_path_.empty()) return;
    boost::asio::ip::tcp::resolver resolver(ioc_);
    boost::beast::error_code ec;
    boost::asio::connect(socket_.next_layer(),
                         resolver.resolve("127.0.0.1", std::to_string(devtools_port_)), ec);
    if (!ec) socket_.handshake("127.0.0.1:" + std::to_string(devtools_port_), page_path_, ec);
    connected_ = !ec;
  }

  ~LivePage() { tidemark::testing::StopOnExit stop{pid_}; }

  bool connected() const { return connected_; }

  // The value of a JavaScript expression that gives a string, in the page.
  std::string evaluate(const std::string& expression) {
    std::string request = "{\"id\":" + std::to_string(++id_) +
                          ",\"method\":\"Runtime.evaluate\",\"params\":{\"expression\":";
    tidemark::append_json_string(&request, expression);
    request += ",\"returnByValue\":true}}";
    boost::beast::error_code ec;
    socket_.text(true);
    socket_.write(boost::asio::buffer(request), ec);
    if (ec) return "";
    for (;;) {
      boost::beast::flat_buffer buffer;
      socket_.read(buffer, ec);
      if (ec) return "";
      auto message = tidemark::parse_json(boost::beast::buffers_to_string(buffer.data()));
      if (!message || !message->find("id") || message->find("id")->as_u64() != id_) continue;
      const auto* result = message->find("result");
      const auto* inner = result ? result->find("result") : nullptr;
      const auto* value = inner ? inner->find("value") : nullptr;
      return value && value->is_string() ? value->as_string() : "";
    }
  }

  // Waits up to `seconds` for the expression to give a string containing
  // `wanted`; returns the last value.
  std::string wait_for(const std::string& expression, const std::string& wanted, int seconds = 15) {
    std::string value;
    for (int i = 0; i < seconds * 10; ++i) {
      value = evaluate(expression);
      if (value.find(wanted) != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return value;
  }

 private:
  pid_t pid_ = -1;
  std::uint16_t devtools_port_ = 0;
  std::string page_path_;
  boost::asio::io_context ioc_;
  boost::beast::websocket::stream<boost::asio::ip::tcp::socket> socket_{ioc_};
  bool connected_ = false;
  std::uint64_t id_ = 0;
};

const std::string kShardsText = "document.querySelector('#shards tbody').innerText";
const std::string kAppendersText = "document.querySelector('#appenders tbody').innerText";
const std::string kPoolsText = "document.querySelector('#pools tbody').innerText";

// The page follows the server: a shard created after it opened appears,
// and managed appends show in the shard's size, its appender's counts and
// own commit latency, the append rate and the commit latency, with the
// memory pools beside them.
TEST_F(ConsoleTest, FollowsShardsAndAppendsAsTheyHappen) {
  if (!chromium_binary()) GTEST_SKIP() << "no Chromium (scripts/install-deps.sh installs it)";
  ASSERT_NO_FATAL_FAILURE(start());
  LivePage page(dir_ / "live-profile", server_.port);
  ASSERT_TRUE(page.connected()) << tidemark::testing::slurp(dir_ / "live-profile.err");
  EXPECT_EQ(page.wait_for(kShardsText, "orders", 3).find("orders"), std::string::npos);

  ASSERT_EQ(call(http::verb::post, "/v1/shards", R"({"name": "orders"})").status, 201u);
  std::string shards = page.wait_for(kShardsText, "orders");
  EXPECT_NE(shards.find("orders"), std::string::npos) << shards;

  // Managed appends, a record each, for a few refreshes.
  for (int i = 0; i < 30; ++i) {
    ASSERT_EQ(call(http::verb::post, "/v1/shards/orders/append",
                   "{\"key\":\"k" + std::to_string(i) + "\",\"value\":1}\n")
                  .status,
              200u);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // The shard's row counts 30 updates (its 6th column).
  shards = page.wait_for(
      "[...document.querySelectorAll('#shards tbody tr')].map(r => "
      "r.cells[0].innerText + '=' + r.cells[5].innerText).join()",
      "orders=30");
  EXPECT_EQ(shards, "orders=30");
  const std::string appenders = page.wait_for(
      "[...document.querySelectorAll('#appenders tbody tr')].map(r => "
      "r.cells[0].innerText + '=' + r.cells[2].innerText).join()",
      "orders=30");
  EXPECT_EQ(appenders, "orders=30");
  // Its appender's own commit latency, enqueue to durable and the commit
  // call (the 6th and 7th columns): "p50 / p99 ms", the median above 0
  // and not above the 99th percentile.
  EXPECT_NE(page.evaluate("document.querySelector('#appenders thead').innerText")
                .find("commit latency p50 / p99"),
            std::string::npos);
  const std::string latencies = page.wait_for(
      R"js([...document.querySelectorAll('#appenders tbody tr')].map((r) => {
        const shown = [r.cells[5].innerText, r.cells[6].innerText];
        const plausible = shown.every((text) => {
          const m = /^(\d+\.\d\d) \/ (\d+\.\d\d) ms$/.exec(text);
          return m && Number(m[1]) > 0 && Number(m[1]) <= Number(m[2]);
        });
        return r.cells[0].innerText + '=' + (plausible ? 'plausible' : shown.join(' | '));
      }).join())js",
      "orders=plausible");
  EXPECT_EQ(latencies, "orders=plausible");
  // The charts drew a rate and a latency from those commits.
  const std::string rate = page.evaluate("document.getElementById('rate-now').innerText");
  EXPECT_NE(rate, "–");
  const std::string latency = page.evaluate("document.getElementById('latency-now').innerText");
  EXPECT_TRUE(latency.ends_with(" ms") || latency == "no commits") << latency;
  EXPECT_NE(page.evaluate("document.querySelector('#rate-chart polyline').getAttribute('points')"),
            "");
  const std::string pools = page.evaluate(kPoolsText);
  for (const char* pool : {"server", "requests", "appenders", "reads", "sinks"}) {
    EXPECT_NE(pools.find(pool), std::string::npos) << pools;
  }
}

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
  // The sink's row, caught up, with where it runs.
  EXPECT_NE(dom.find("<td>files</td><td>orders</td><td>" + to +
                     "</td><td class=\"running\">running</td><td>tidemark serve on 127.0.0.1:" +
                     std::to_string(server_.port) +
                     "</td><td class=\"n\">3</td>"
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
