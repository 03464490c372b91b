// One owner at a time, with real processes: a data directory has one
// `tidemark serve`. A second server on it exits at once naming the first,
// and a SIGKILLed server's successor starts at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "server/test_client.h"
#include "server_process.h"

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
  fs::path err(const std::string& tag) const { return scratch_ / (tag + ".err"); }

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

}  // namespace
