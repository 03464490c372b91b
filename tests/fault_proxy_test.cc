// tidemark-fault-proxy (tools/fault_proxy.cc), driven through
// FaultProxyProcess: each mode against a real echo server in this process
// (pass, delay, drop, reset, blackhole, flaky, back to pass), then the
// backends the nemesis tests put it in front of: a PostgresConsensus
// through the proxy fails under reset and blackhole and recovers after
// pass (needs TIDEMARK_TEST_POSTGRES), and so does an S3Blob (needs
// TIDEMARK_TEST_S3); both skip without their server.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fault_proxy_process.h"
#include "postgres/postgres_consensus.h"
#include "testing/postgres_test_schema.h"
#include "testing/s3_test_prefix.h"
#include "testing/server_client.h"
#include "server_process.h"

namespace tidemark {
namespace {

using namespace std::chrono_literals;
using tidemark::testing::authority;
using tidemark::testing::FaultProxyProcess;
using tidemark::testing::FaultProxyStats;
using tidemark::testing::postgres_authority;
using tidemark::testing::s3_endpoint_authority;
using tidemark::testing::with_authority;
using Clock = std::chrono::steady_clock;

// A socket descriptor, closed when destroyed.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_;
};

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

// A connection to 127.0.0.1:port; invalid when connect failed.
Socket connect_to(std::uint16_t port) {
  Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const sockaddr_in address = loopback(port);
  if (::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    return Socket();
  }
  return socket;
}

bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(n);
  }
  return true;
}

enum class Outcome { kBytes, kEnd, kReset, kTimeout };

struct Received {
  Outcome outcome;
  std::string bytes;  // what arrived before the outcome
};

// Reads until `size` bytes arrived (kBytes), the stream ended (kEnd) or was
// reset (kReset), or `timeout` passed (kTimeout).
Received receive(int fd, std::size_t size, std::chrono::milliseconds timeout) {
  Received received{Outcome::kTimeout, {}};
  const auto deadline = Clock::now() + timeout;
  while (received.bytes.size() < size) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return received;
    pollfd readable{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&readable, 1, static_cast<int>(left.count())) <= 0) continue;
    char buffer[64 * 1024];
    const ssize_t n = ::recv(fd, buffer, std::min(sizeof buffer, size - received.bytes.size()), 0);
    if (n == 0) {
      received.outcome = Outcome::kEnd;
      return received;
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      received.outcome = Outcome::kReset;
      return received;
    }
    received.bytes.append(buffer, n);
  }
  received.outcome = Outcome::kBytes;
  return received;
}

// Sends `message` and expects it back within `timeout`.
::testing::AssertionResult round_trip(int fd, const std::string& message,
                                      std::chrono::milliseconds timeout = 5s) {
  if (!send_all(fd, message)) return ::testing::AssertionFailure() << "send failed";
  const Received received = receive(fd, message.size(), timeout);
  if (received.outcome != Outcome::kBytes || received.bytes != message) {
    return ::testing::AssertionFailure() << "outcome " << static_cast<int>(received.outcome)
                                         << ", received \"" << received.bytes.substr(0, 64) << "\"";
  }
  return ::testing::AssertionSuccess();
}

// A port on which nothing listens (taken, then released).
std::uint16_t unused_port() {
  Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address = loopback(0);
  ::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&address), &length);
  return ntohs(address.sin_port);
}

// Echoes every byte back on each connection, one thread per connection,
// on 127.0.0.1 at a free port. Closes a connection when its client does.
class EchoServer {
 public:
  EchoServer() : listening_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address = loopback(0);
    if (::bind(listening_.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listening_.fd(), 256) != 0) {
      ADD_FAILURE() << "echo server: bind or listen failed";
      return;
    }
    socklen_t length = sizeof address;
    ::getsockname(listening_.fd(), reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  ~EchoServer() {
    stopping_ = true;
    ::shutdown(listening_.fd(), SHUT_RDWR);  // wakes accept()
    if (acceptor_.joinable()) acceptor_.join();
    {
      std::lock_guard lock(mu_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& echo : echoes_) echo.join();
  }

  std::uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return accepted_; }

 private:
  void accept_loop() {
    while (true) {
      const int fd = ::accept4(listening_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (!stopping_ && (errno == EINTR || errno == ECONNABORTED)) continue;
        return;
      }
      ++accepted_;
      std::lock_guard lock(mu_);
      open_.insert(fd);
      echoes_.emplace_back([this, fd] { echo(fd); });
    }
  }

  void echo(int fd) {
    std::vector<char> buffer(64 * 1024);
    for (ssize_t n; (n = ::recv(fd, buffer.data(), buffer.size(), 0)) > 0;) {
      if (!send_all(fd, std::string_view(buffer.data(), n))) break;
    }
    std::lock_guard lock(mu_);
    open_.erase(fd);
    ::close(fd);
  }

  Socket listening_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::set<int> open_;               // guarded by mu_
  std::vector<std::thread> echoes_;  // guarded by mu_; joined once acceptor_ has ended
};

// Two listeners, both in front of one echo server.
class FaultProxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto proxy = FaultProxyProcess::start(TIDEMARK_FAULT_PROXY, {echo_.address(), echo_.address()});
    ASSERT_TRUE(proxy.has_value()) << proxy.error().to_string();
    proxy_ = std::move(*proxy);
  }

  void set(std::size_t listener, std::string_view mode) {
    auto done = proxy_->set(listener, mode);
    ASSERT_TRUE(done.has_value()) << done.error().to_string();
  }

  FaultProxyStats stats(std::size_t listener = 0) {
    auto stats = proxy_->stats(listener);
    EXPECT_TRUE(stats.has_value()) << stats.error().to_string();
    return stats.value_or(FaultProxyStats{});
  }

  // A connection through `listener`, checked with a round trip.
  Socket open_connection(std::size_t listener = 0) {
    Socket socket = connect_to(proxy_->port(listener));
    EXPECT_TRUE(socket.valid());
    EXPECT_TRUE(round_trip(socket.fd(), "hello"));
    return socket;
  }

  EchoServer echo_;
  std::unique_ptr<FaultProxyProcess> proxy_;
};

TEST_F(FaultProxyTest, PassForwardsBothWaysAndCounts) {
  Socket socket = open_connection();
  const std::string large(3 * 1024 * 1024 + 17, 'x');
  std::thread writer([&] { EXPECT_TRUE(send_all(socket.fd(), large)); });
  const Received back = receive(socket.fd(), large.size(), 10s);
  writer.join();
  EXPECT_EQ(back.outcome, Outcome::kBytes);
  EXPECT_TRUE(back.bytes == large);

  const FaultProxyStats counted = stats();
  EXPECT_EQ(counted.mode, "pass");
  EXPECT_EQ(counted.accepted, 1u);
  EXPECT_EQ(counted.open, 1u);
  EXPECT_EQ(counted.bytes_up, large.size() + 5);
  EXPECT_EQ(counted.bytes_down, large.size() + 5);
  EXPECT_EQ(counted.reset + counted.dropped + counted.upstream_failed, 0u);

  // A client that closes closes the whole connection.
  socket = Socket();
  for (int i = 0; i < 100 && stats().open != 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(stats().open, 0u);
}

TEST_F(FaultProxyTest, ManyConnectionsAtOnceKeepTheirBytesApart) {
  constexpr int kConnections = 64;
  constexpr std::size_t kBytes = 256 * 1024;
  std::vector<std::thread> clients;
  std::atomic<int> intact{0};
  for (int c = 0; c < kConnections; ++c) {
    clients.emplace_back([&, c] {
      std::string payload(kBytes, '\0');
      for (std::size_t i = 0; i < kBytes; ++i)
        payload[i] = static_cast<char>('a' + (i * 7 + c) % 26);
      Socket socket = connect_to(proxy_->port(0));
      if (!socket.valid()) return;
      std::thread writer([&] { send_all(socket.fd(), payload); });
      const Received back = receive(socket.fd(), kBytes, 20s);
      writer.join();
      if (back.outcome == Outcome::kBytes && back.bytes == payload) ++intact;
    });
  }
  for (auto& client : clients) client.join();
  EXPECT_EQ(intact.load(), kConnections);
  EXPECT_EQ(stats().accepted, static_cast<std::uint64_t>(kConnections));
  EXPECT_EQ(stats().bytes_down, kConnections * kBytes);
}

TEST_F(FaultProxyTest, DelayAddsTheDelayEachWayAndKeepsTheOrder) {
  Socket socket = open_connection();
  set(0, "delay 100");
  EXPECT_EQ(stats().mode, "delay,100,0");
  auto start = Clock::now();
  EXPECT_TRUE(round_trip(socket.fd(), "ping"));
  EXPECT_GE(Clock::now() - start, 200ms);  // 100 ms up, 100 ms down
  // New connections are delayed too.
  Socket fresh = connect_to(proxy_->port(0));
  start = Clock::now();
  EXPECT_TRUE(round_trip(fresh.fd(), "pong"));
  EXPECT_GE(Clock::now() - start, 200ms);

  // With jitter, chunks still arrive in the order they were sent.
  set(0, "delay 5 40");
  std::string sent;
  for (int i = 0; i < 100; ++i) {
    const std::string message = "m" + std::to_string(i) + ";";
    ASSERT_TRUE(send_all(socket.fd(), message));
    sent += message;
    std::this_thread::sleep_for(1ms);  // separate chunks
  }
  const Received back = receive(socket.fd(), sent.size(), 10s);
  EXPECT_EQ(back.outcome, Outcome::kBytes);
  EXPECT_EQ(back.bytes, sent);

  // More than a direction holds (2 MiB) goes through intact, just slower.
  const std::string large(5 * 1024 * 1024, 'y');
  std::thread writer([&] { EXPECT_TRUE(send_all(socket.fd(), large)); });
  const Received large_back = receive(socket.fd(), large.size(), 30s);
  writer.join();
  EXPECT_EQ(large_back.outcome, Outcome::kBytes);
  EXPECT_TRUE(large_back.bytes == large);

  // Back to pass, chunks read from then on go through at once.
  set(0, "delay 1000");
  set(0, "pass");
  start = Clock::now();
  EXPECT_TRUE(round_trip(socket.fd(), "fast"));
  EXPECT_LT(Clock::now() - start, 1000ms);
}

TEST_F(FaultProxyTest, DropClosesOpenConnectionsAndRefusesNewOnes) {
  Socket first = open_connection();
  Socket second = open_connection();
  set(0, "drop");
  EXPECT_EQ(receive(first.fd(), 1, 2s).outcome, Outcome::kEnd);
  EXPECT_EQ(receive(second.fd(), 1, 2s).outcome, Outcome::kEnd);
  Socket refused = connect_to(proxy_->port(0));  // the kernel accepts it; the proxy closes it
  ASSERT_TRUE(refused.valid());
  EXPECT_EQ(receive(refused.fd(), 1, 2s).outcome, Outcome::kEnd);
  const FaultProxyStats counted = stats();
  EXPECT_EQ(counted.dropped, 3u);
  EXPECT_EQ(counted.open, 0u);
  EXPECT_EQ(counted.reset, 0u);

  set(0, "pass");
  open_connection();
}

TEST_F(FaultProxyTest, ResetResetsOpenConnectionsAndNewOnes) {
  Socket first = open_connection();
  set(0, "reset");
  EXPECT_EQ(receive(first.fd(), 1, 2s).outcome, Outcome::kReset);
  Socket refused = connect_to(proxy_->port(0));
  ASSERT_TRUE(refused.valid());
  EXPECT_EQ(receive(refused.fd(), 1, 2s).outcome, Outcome::kReset);
  const FaultProxyStats counted = stats();
  EXPECT_EQ(counted.reset, 2u);
  EXPECT_EQ(counted.open, 0u);

  set(0, "pass");
  open_connection();
}

TEST_F(FaultProxyTest, BlackholeStallsBothWaysAndPassResumesWithNothingLost) {
  Socket open = open_connection();
  set(0, "blackhole");
  ASSERT_TRUE(send_all(open.fd(), "during"));
  EXPECT_EQ(receive(open.fd(), 6, 500ms).outcome, Outcome::kTimeout);
  // A new connection is accepted and held, not connected to the target.
  Socket held = connect_to(proxy_->port(0));
  ASSERT_TRUE(held.valid());
  ASSERT_TRUE(send_all(held.fd(), "held"));
  EXPECT_EQ(receive(held.fd(), 4, 500ms).outcome, Outcome::kTimeout);
  EXPECT_EQ(echo_.accepted(), 1);
  EXPECT_EQ(stats().open, 2u);

  set(0, "pass");
  const Received during = receive(open.fd(), 6, 5s);
  EXPECT_EQ(during.outcome, Outcome::kBytes);
  EXPECT_EQ(during.bytes, "during");
  const Received resumed = receive(held.fd(), 4, 5s);
  EXPECT_EQ(resumed.outcome, Outcome::kBytes);
  EXPECT_EQ(resumed.bytes, "held");
  EXPECT_EQ(echo_.accepted(), 2);

  // Held connections can be reset too.
  set(0, "blackhole");
  Socket held_again = connect_to(proxy_->port(0));
  ASSERT_TRUE(send_all(held_again.fd(), "x"));
  set(0, "reset");
  EXPECT_EQ(receive(held_again.fd(), 1, 2s).outcome, Outcome::kReset);
  EXPECT_EQ(receive(open.fd(), 1, 2s).outcome, Outcome::kReset);
}

TEST_F(FaultProxyTest, FlakyResetsAShareOfNewConnectionsReproduciblyFromItsSeed) {
  Socket before = open_connection();
  // One connection at a time, so accept order is connection order; "r"
  // for a reset, "p" for a round trip.
  const auto pattern = [&](int connections) {
    std::string outcomes;
    for (int i = 0; i < connections; ++i) {
      Socket socket = connect_to(proxy_->port(0));
      const bool sent = socket.valid() && send_all(socket.fd(), "?");
      const Received back = sent ? receive(socket.fd(), 1, 5s) : Received{Outcome::kReset, {}};
      EXPECT_TRUE(back.outcome == Outcome::kBytes || back.outcome == Outcome::kReset);
      outcomes += back.outcome == Outcome::kBytes ? 'p' : 'r';
    }
    return outcomes;
  };
  set(0, "flaky 0.5 42");
  const std::string first = pattern(40);
  set(0, "flaky 0.5 42");
  const std::string second = pattern(40);
  EXPECT_EQ(first, second);
  const auto resets = std::count(first.begin(), first.end(), 'r');
  EXPECT_GE(resets, 5) << first;
  EXPECT_LE(resets, 35) << first;
  EXPECT_EQ(stats().reset, static_cast<std::uint64_t>(2 * resets));
  // Open connections are left alone.
  EXPECT_TRUE(round_trip(before.fd(), "still here"));

  set(0, "flaky 1");
  EXPECT_EQ(pattern(3), "rrr");
  set(0, "flaky 0");
  EXPECT_EQ(pattern(3), "ppp");
}

TEST_F(FaultProxyTest, ListenersAreIndependent) {
  Socket zero = open_connection(0);
  Socket one = open_connection(1);
  set(1, "reset");
  EXPECT_EQ(receive(one.fd(), 1, 2s).outcome, Outcome::kReset);
  EXPECT_TRUE(round_trip(zero.fd(), "unaffected"));
  EXPECT_EQ(stats(0).reset, 0u);
  EXPECT_EQ(stats(1).reset, 1u);

  auto all = proxy_->set_all("blackhole");
  ASSERT_TRUE(all.has_value()) << all.error().to_string();
  EXPECT_EQ(stats(0).mode, "blackhole");
  EXPECT_EQ(stats(1).mode, "blackhole");
  all = proxy_->set_all("pass");
  ASSERT_TRUE(all.has_value()) << all.error().to_string();
  EXPECT_TRUE(round_trip(zero.fd(), "again"));
  open_connection(1);
}

TEST_F(FaultProxyTest, MalformedCommandsAreErrorsAndChangeNothing) {
  for (const char* command :
       {"set 2 pass", "set -1 pass", "set 0", "set 0 delay", "set 0 delay -5", "set 0 delay 1 2 3",
        "set 0 delay ten", "set 0 flaky 1.5", "set 0 flaky", "set 0 flaky 0.5 x", "set 0 pass now",
        "set 0 teleport", "stats 9", "hello", ""}) {
    auto answer = proxy_->command(command);
    ASSERT_FALSE(answer.has_value()) << "\"" << command << "\" was accepted";
    EXPECT_NE(answer.error().message.find("error"), std::string::npos) << answer.error().message;
  }
  EXPECT_EQ(stats(0).mode, "pass");
  auto lines = proxy_->command("stats");
  ASSERT_TRUE(lines.has_value()) << lines.error().to_string();
  EXPECT_EQ(lines->size(), 2u);
  open_connection();
}

TEST(FaultProxyTargetTest, AnUnreachableTargetResetsTheClient) {
  const std::uint16_t nothing = unused_port();
  auto proxy =
      FaultProxyProcess::start(TIDEMARK_FAULT_PROXY, {"127.0.0.1:" + std::to_string(nothing)});
  ASSERT_TRUE(proxy.has_value()) << proxy.error().to_string();
  Socket socket = connect_to((*proxy)->port(0));
  ASSERT_TRUE(socket.valid());
  EXPECT_EQ(receive(socket.fd(), 1, 5s).outcome, Outcome::kReset);
  auto stats = (*proxy)->stats(0);
  ASSERT_TRUE(stats.has_value()) << stats.error().to_string();
  EXPECT_EQ(stats->upstream_failed, 1u);
  EXPECT_EQ(stats->open, 0u);
}

// Backends through the proxy --------------------------------------------

bool is_infrastructure_error(const Error& error) {
  return error.is(ErrorKind::kDeterminate) || error.is(ErrorKind::kIndeterminate);
}

// A PostgresConsensus whose every connection goes through the proxy, in a
// schema of its own.
class FaultProxyPostgresTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::optional<std::string> server = postgres_test_server();
    if (!server) GTEST_SKIP() << no_postgres_server_message();
    auto schema = PostgresTestSchema::create(*server);
    ASSERT_TRUE(schema.has_value()) << schema.error().to_string();
    schema_ = std::move(*schema);
    const std::string url = schema_->url();
    auto proxy =
        FaultProxyProcess::start(TIDEMARK_FAULT_PROXY, {authority(url, postgres_authority(url))});
    ASSERT_TRUE(proxy.has_value()) << proxy.error().to_string();
    proxy_ = std::move(*proxy);
    // Connecting gives up after 2 s (PostgresConsensus's default is 5 s).
    auto consensus = PostgresConsensus::open(
        with_authority(url, postgres_authority(url), proxy_->address(0)) + "&connect_timeout=2");
    ASSERT_TRUE(consensus.has_value()) << consensus.error().to_string();
    consensus_ = std::move(*consensus);
  }

  void TearDown() override {
    if (proxy_) {
      EXPECT_TRUE(proxy_->set(0, "pass").has_value());
    }
    consensus_.reset();  // before the schema is dropped
  }

  void set(std::string_view mode) {
    auto done = proxy_->set(0, mode);
    ASSERT_TRUE(done.has_value()) << done.error().to_string();
  }

  std::optional<SeqNo> head_seqno() {
    auto head = consensus_->head("k");
    EXPECT_TRUE(head.has_value()) << head.error().to_string();
    return head.has_value() && head->has_value() ? std::optional((*head)->seqno) : std::nullopt;
  }

  std::future<Result<CasOutcome>> compare_and_set_in_background(SeqNo expected) {
    return std::async(std::launch::async, [this, expected] {
      return consensus_->compare_and_set("k", expected, {expected + 1, "next"});
    });
  }

  std::unique_ptr<PostgresTestSchema> schema_;
  std::unique_ptr<FaultProxyProcess> proxy_;
  std::unique_ptr<PostgresConsensus> consensus_;
};

TEST_F(FaultProxyPostgresTest, ConsensusFailsUnderResetAndBlackholeAndRecoversAfterPass) {
  auto first = consensus_->compare_and_set("k", std::nullopt, {1, "one"});
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  ASSERT_EQ(*first, CasOutcome::kCommitted);

  // Reset: the pooled connection is cut and fresh ones are refused.
  set("reset");
  auto head = consensus_->head("k");
  ASSERT_FALSE(head.has_value());
  EXPECT_TRUE(is_infrastructure_error(head.error())) << head.error().to_string();
  auto refused = consensus_->compare_and_set("k", 1, {2, "two"});
  ASSERT_FALSE(refused.has_value());
  EXPECT_TRUE(is_infrastructure_error(refused.error())) << refused.error().to_string();
  set("pass");
  EXPECT_EQ(head_seqno(), 1u);

  // A statement in flight when its connection is reset may have applied:
  // Indeterminate. (Here it had not: the proxy still held it.)
  set("delay 500");
  auto in_flight = compare_and_set_in_background(1);
  std::this_thread::sleep_for(200ms);
  set("reset");
  auto outcome = in_flight.get();
  ASSERT_FALSE(outcome.has_value());
  EXPECT_EQ(outcome.error().kind, ErrorKind::kIndeterminate) << outcome.error().to_string();
  set("pass");
  EXPECT_EQ(head_seqno(), 1u);

  // Blackhole: a statement on an open connection waits (no timeout of the
  // client's fires) and completes once the partition heals.
  set("blackhole");
  auto waiting = std::async(std::launch::async, [this] { return consensus_->head("k"); });
  EXPECT_EQ(waiting.wait_for(1s), std::future_status::timeout);
  set("pass");
  ASSERT_EQ(waiting.wait_for(10s), std::future_status::ready);
  auto healed = waiting.get();
  ASSERT_TRUE(healed.has_value()) << healed.error().to_string();
  EXPECT_EQ((*healed)->seqno, 1u);

  // Blackhole, then the connection reset: Indeterminate again.
  set("blackhole");
  auto stuck = compare_and_set_in_background(1);
  EXPECT_EQ(stuck.wait_for(500ms), std::future_status::timeout);
  set("reset");
  auto cut = stuck.get();
  ASSERT_FALSE(cut.has_value());
  EXPECT_EQ(cut.error().kind, ErrorKind::kIndeterminate) << cut.error().to_string();

  // A new connection under blackhole: connecting times out, Determinate.
  set("blackhole");
  const auto start = Clock::now();
  auto unreachable = consensus_->head("k");
  ASSERT_FALSE(unreachable.has_value());
  EXPECT_EQ(unreachable.error().kind, ErrorKind::kDeterminate) << unreachable.error().to_string();
  EXPECT_GE(Clock::now() - start, 1500ms);

  set("pass");
  auto second = consensus_->compare_and_set("k", 1, {2, "two"});
  ASSERT_TRUE(second.has_value()) << second.error().to_string();
  EXPECT_EQ(*second, CasOutcome::kCommitted);
  EXPECT_EQ(head_seqno(), 2u);
  auto counted = proxy_->stats(0);
  ASSERT_TRUE(counted.has_value()) << counted.error().to_string();
  EXPECT_GE(counted->reset, 3u);
}

// With call_timeout=1, a call into a blackhole (the proxy's kernel still
// acknowledges every byte, as a stalled server's would) gives up after
// about a second instead of waiting for the partition to heal: a read is
// Determinate, a compare_and_set Indeterminate (its statement was sent),
// and each closes its connection, so the calls after `pass` work at once.
TEST_F(FaultProxyPostgresTest, CallsIntoABlackholeTimeOutAndCloseTheirConnection) {
  const std::string url = schema_->url();
  auto opened =
      PostgresConsensus::open(with_authority(url, postgres_authority(url), proxy_->address(0)) +
                              "&connect_timeout=2&call_timeout=1");
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  std::unique_ptr<PostgresConsensus> consensus = std::move(*opened);
  EXPECT_EQ(consensus->call_timeout(), 1s);
  auto first = consensus->compare_and_set("k", std::nullopt, {1, "one"});
  ASSERT_TRUE(first.has_value()) << first.error().to_string();

  set("blackhole");
  auto start = Clock::now();
  auto head = consensus->head("k");
  auto took = Clock::now() - start;
  ASSERT_FALSE(head.has_value());
  EXPECT_EQ(head.error().kind, ErrorKind::kDeterminate) << head.error().to_string();
  EXPECT_NE(head.error().message.find("call timeout (1 s)"), std::string::npos)
      << head.error().message;
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 5s);

  // The pooled connection went with the read; this one is new, and its
  // set-up statements meet the blackhole: connecting (connect_timeout=2)
  // or setting up (the call timeout) gives up, Determinate.
  start = Clock::now();
  auto unreachable = consensus->compare_and_set("k", 1, {2, "two"});
  took = Clock::now() - start;
  ASSERT_FALSE(unreachable.has_value());
  EXPECT_EQ(unreachable.error().kind, ErrorKind::kDeterminate) << unreachable.error().to_string();
  EXPECT_LT(took, 5s);

  // A compare_and_set sent on a live connection that then stops answering:
  // Indeterminate, after about the call timeout.
  set("pass");
  ASSERT_TRUE(consensus->head("k").has_value());
  set("delay 3000");
  start = Clock::now();
  auto unknown = consensus->compare_and_set("k", 1, {2, "two"});
  took = Clock::now() - start;
  ASSERT_FALSE(unknown.has_value());
  EXPECT_EQ(unknown.error().kind, ErrorKind::kIndeterminate) << unknown.error().to_string();
  EXPECT_NE(unknown.error().message.find("call timeout (1 s)"), std::string::npos)
      << unknown.error().message;
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 2500ms);

  // Healed: a fresh connection serves the next calls at once. The delayed
  // statement may still have reached the server: "maybe" means maybe.
  set("pass");
  start = Clock::now();
  auto after = consensus->head("k");
  ASSERT_TRUE(after.has_value()) << after.error().to_string();
  EXPECT_LT(Clock::now() - start, 1s);
  std::this_thread::sleep_for(3500ms);  // the delayed bytes arrive, or not
  after = consensus->head("k");
  ASSERT_TRUE(after.has_value()) << after.error().to_string();
  const SeqNo seqno = (*after)->seqno;
  EXPECT_TRUE(seqno == 1 || seqno == 2) << seqno;
  auto next = consensus->compare_and_set("k", seqno, {seqno + 1, "next"});
  ASSERT_TRUE(next.has_value()) << next.error().to_string();
  EXPECT_EQ(*next, CasOutcome::kCommitted);
}

// An S3Blob whose requests go through the proxy: two tries a request, and a
// transfer abandoned after 1 s without progress.
TEST(FaultProxyS3Test, BlobFailsUnderResetAndBlackholeAndRecoversAfterPass) {
  std::optional<std::string> server = s3_test_server();
  if (!server) GTEST_SKIP() << no_s3_server_message();
  auto proxy = FaultProxyProcess::start(TIDEMARK_FAULT_PROXY,
                                        {authority(*server, s3_endpoint_authority(*server))});
  ASSERT_TRUE(proxy.has_value()) << proxy.error().to_string();
  const std::string through =
      with_authority(*server, s3_endpoint_authority(*server), (*proxy)->address(0));
  auto blob = open_fresh_s3_blob(through, "&max_attempts=2&stall_timeout=1");
  ASSERT_TRUE(blob.has_value()) << blob.error().to_string();
  ASSERT_TRUE((*blob)->set("a", "alpha").has_value());

  ASSERT_TRUE((*proxy)->set(0, "reset").has_value());
  auto got = (*blob)->get("a");
  ASSERT_FALSE(got.has_value());
  EXPECT_EQ(got.error().kind, ErrorKind::kDeterminate) << got.error().to_string();
  auto put = (*blob)->set("b", "beta");
  ASSERT_FALSE(put.has_value());
  EXPECT_TRUE(is_infrastructure_error(put.error())) << put.error().to_string();

  ASSERT_TRUE((*proxy)->set(0, "pass").has_value());
  got = (*blob)->get("a");
  ASSERT_TRUE(got.has_value()) << got.error().to_string();
  EXPECT_EQ(*got, "alpha");

  // Blackhole: each try stalls until stall_timeout, then the call fails.
  ASSERT_TRUE((*proxy)->set(0, "blackhole").has_value());
  const auto start = Clock::now();
  got = (*blob)->get("a");
  ASSERT_FALSE(got.has_value());
  EXPECT_EQ(got.error().kind, ErrorKind::kDeterminate) << got.error().to_string();
  EXPECT_GE(Clock::now() - start, 2s);

  ASSERT_TRUE((*proxy)->set(0, "pass").has_value());
  got = (*blob)->get("a");
  ASSERT_TRUE(got.has_value()) << got.error().to_string();
  EXPECT_EQ(*got, "alpha");
  blob->reset();  // empties its prefix, through the proxy, while it passes
}

// SIGTERM when the server's own blob store stops answering (a blackhole, and
// an S3 client told to wait an hour): the grace (1 s) passes, the flush of
// the appenders cannot finish, and `tidemark serve` exits anyway, status 1,
// 10 s after the grace.
TEST(FaultProxyS3Test, ServeExitsSoonAfterTheGraceWhenItsBlobStoreNeverAnswers) {
  std::optional<std::string> server = s3_test_server();
  if (!server) GTEST_SKIP() << no_s3_server_message();
  auto proxy = FaultProxyProcess::start(TIDEMARK_FAULT_PROXY,
                                        {authority(*server, s3_endpoint_authority(*server))});
  ASSERT_TRUE(proxy.has_value()) << proxy.error().to_string();
  const std::string through =
      with_authority(*server, s3_endpoint_authority(*server), (*proxy)->address(0));
  auto blob = open_fresh_s3_blob(through, "&stall_timeout=3600&call_timeout=3600");
  ASSERT_TRUE(blob.has_value()) << blob.error().to_string();
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("tidemark-watchdog-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto serving = testing::start_server(
      {"--data", (dir / "data").string(), "--blob", (*blob)->url().to_string(), "--consensus",
       "sqlite://" + (dir / "consensus.db").string()},
      dir / "serve.err", {"--shutdown-grace", "1"});
  ASSERT_GT(serving.port, 0) << testing::slurp(dir / "serve.err");
  namespace http = boost::beast::http;
  ASSERT_EQ(
      testing::http_call(serving.port, http::verb::post, "/v1/shards", R"({"name": "s"})").status,
      201u);
  ASSERT_TRUE((*proxy)->set(0, "blackhole").has_value());
  // A managed append whose part upload never finishes: a value that does
  // not compress, too large for the part to travel inline in the state.
  std::string value;
  for (std::uint64_t x = 1; value.size() < 16384;) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    value += std::to_string(x >> 20);
  }
  auto append = std::async(std::launch::async, [&] {
    return testing::http_call(serving.port, http::verb::post, "/v1/shards/s/append",
                              "{\"key\": \"a\", \"value\": \"" + value + "\"}\n");
  });
  std::this_thread::sleep_for(1s);
  const auto began = Clock::now();
  ASSERT_EQ(::kill(serving.pid, SIGTERM), 0);
  int status = 0;
  pid_t waited = 0;
  while ((waited = ::waitpid(serving.pid, &status, WNOHANG)) == 0 && Clock::now() - began < 60s) {
    std::this_thread::sleep_for(10ms);
  }
  if (waited == 0) {
    ::kill(serving.pid, SIGKILL);
    ::waitpid(serving.pid, nullptr, 0);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - began).count();
  const std::string err = testing::slurp(dir / "serve.err");
  ASSERT_NE(waited, 0) << "serve did not exit within 60 s of SIGTERM\n" << err;
  std::fprintf(stderr, "SIGTERM to exit with a blob store that never answers: %.2f s\n", seconds);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << "\n" << err;
  EXPECT_NE(err.find("still stopping 11 s after the signal"), std::string::npos) << err;
  EXPECT_GE(seconds, 10.0);
  EXPECT_LT(seconds, 30.0);
  // The append was never acknowledged.
  EXPECT_NE(append.get().status, 200u);
  ASSERT_TRUE((*proxy)->set(0, "pass").has_value());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tidemark
