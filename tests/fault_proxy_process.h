// FaultProxyProcess: runs tidemark-fault-proxy (tools/fault_proxy.cc) as a
// child process, knows its ports, and switches its listeners' modes over
// its control port. Test-only, header-only.
//
//   auto proxy = FaultProxyProcess::start(TIDEMARK_FAULT_PROXY,
//                                         {"127.0.0.1:5432", "127.0.0.1:9000"});
//   (*proxy)->port(0);              // connect here instead of 127.0.0.1:5432
//   (*proxy)->set(0, "blackhole");  // applied when it returns
//   (*proxy)->set_all("pass");
//
// The proxy's stderr is the test's. The destructor stops the proxy
// (SIGTERM, so it prints its counters on stderr; SIGKILL after 2 s) and
// reaps it; the proxy also ends when the thread that started it exits.
//
// Thread-safety: the methods that talk to the proxy open a connection of
// their own per command, so any thread may call them at any time.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "testing/child_process.h"
#include "tidemark/error.h"
#include "util/try.h"

namespace tidemark::testing {

// One listener's counters, as the proxy's `stats` command reports them.
struct FaultProxyStats {
  std::string mode;  // as set, commas for spaces ("delay,100,20")
  std::uint64_t accepted = 0;
  std::uint64_t open = 0;
  std::uint64_t dropped = 0;
  std::uint64_t reset = 0;
  std::uint64_t upstream_failed = 0;
  std::uint64_t bytes_up = 0;
  std::uint64_t bytes_down = 0;
};

class FaultProxyProcess {
 public:
  // Starts `binary` with one listener per target ("host:port"), each on a
  // free port, and waits (up to 10 s) for its "ready" line.
  static Result<std::unique_ptr<FaultProxyProcess>> start(const std::string& binary,
                                                          const std::vector<std::string>& targets,
                                                          std::uint64_t seed = 1) {
    std::vector<std::string> words{binary, "--seed", std::to_string(seed)};
    words.insert(words.end(), targets.begin(), targets.end());
    int out = -1;
    const pid_t pid = spawn_child(std::move(words), ChildOutput::piped(&out));
    if (pid == -1) return determinate("fault proxy: cannot start " + binary);
    auto process = std::unique_ptr<FaultProxyProcess>(new FaultProxyProcess(pid));
    std::string text;
    const bool ready = read_until_ready(out, text);
    ::close(out);
    if (!ready) return determinate("fault proxy: no ready line from " + binary + ": " + text);
    // "control 127.0.0.1:P", "listener I 127.0.0.1:P -> TARGET"..., "ready"
    std::size_t at = 0;
    while (at < text.size()) {
      const std::size_t end = text.find('\n', at);
      const std::string line = text.substr(at, end - at);
      at = end + 1;
      const std::size_t colon = line.find("127.0.0.1:");
      if (colon == std::string::npos) continue;
      const auto port = static_cast<std::uint16_t>(std::stoul(line.substr(colon + 10)));
      if (line.starts_with("control ")) process->control_port_ = port;
      if (line.starts_with("listener ")) process->ports_.push_back(port);
    }
    if (process->control_port_ == 0 || process->ports_.size() != targets.size()) {
      return determinate("fault proxy: unexpected start-up lines: " + text);
    }
    return process;
  }

  FaultProxyProcess(const FaultProxyProcess&) = delete;
  FaultProxyProcess& operator=(const FaultProxyProcess&) = delete;

  ~FaultProxyProcess() {
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  // The port listener `listener` (the index of its target) listens on.
  std::uint16_t port(std::size_t listener) const { return ports_.at(listener); }
  // "127.0.0.1:PORT" of that listener.
  std::string address(std::size_t listener) const {
    return "127.0.0.1:" + std::to_string(port(listener));
  }
  std::uint16_t control_port() const { return control_port_; }
  pid_t pid() const { return pid_; }

  // Sends one command line; returns the lines the proxy answered before
  // "ok", or its "error ..." line as a Determinate error.
  Result<std::vector<std::string>> command(std::string_view line) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return determinate("fault proxy: socket failed");
    const timeval timeout{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(control_port_);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string request = std::string(line) + "\nquit\n";
    std::string answer;
    bool sent = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0 &&
                ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
                    static_cast<ssize_t>(request.size());
    // The proxy closes the connection after answering "quit".
    char buffer[4096];
    for (ssize_t n; sent && (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;)
      answer.append(buffer, n);
    ::close(fd);
    std::vector<std::string> lines;
    for (std::size_t at = 0; at < answer.size();) {
      const std::size_t end = answer.find('\n', at);
      if (end == std::string::npos) break;
      lines.push_back(answer.substr(at, end - at));
      at = end + 1;
    }
    // The last two lines answer the command and the quit.
    if (lines.size() < 2 || lines.back() != "ok") {
      return determinate("fault proxy: no answer to \"" + std::string(line) + "\": " + answer);
    }
    lines.pop_back();
    const std::string verdict = lines.back();
    lines.pop_back();
    if (verdict != "ok") return determinate("fault proxy: " + std::string(line) + ": " + verdict);
    return lines;
  }

  // "set LISTENER MODE": mode is "pass", "delay 100 20", "drop", "reset",
  // "blackhole" or "flaky 0.3 [SEED]".
  Status set(std::size_t listener, std::string_view mode) const {
    TM_TRY(command("set " + std::to_string(listener) + " " + std::string(mode)));
    return {};
  }
  Status set_all(std::string_view mode) const {
    TM_TRY(command("set all " + std::string(mode)));
    return {};
  }

  Result<FaultProxyStats> stats(std::size_t listener) const {
    TM_ASSIGN(std::vector<std::string> lines, command("stats " + std::to_string(listener)));
    if (lines.size() != 1)
      return determinate("fault proxy: stats: " + std::to_string(lines.size()));
    FaultProxyStats stats;
    const std::string& line = lines.front();
    const auto field = [&](const std::string& name) -> std::string {
      const auto at = line.find(" " + name + "=");
      if (at == std::string::npos) return "";
      const auto begin = at + name.size() + 2;
      return line.substr(begin, line.find(' ', begin) - begin);
    };
    const auto number = [&](const std::string& name) -> std::uint64_t {
      const std::string text = field(name);
      return text.empty() ? 0 : std::stoull(text);
    };
    stats.mode = field("mode");
    stats.accepted = number("accepted");
    stats.open = number("open");
    stats.dropped = number("dropped");
    stats.reset = number("reset");
    stats.upstream_failed = number("upstream_failed");
    stats.bytes_up = number("bytes_up");
    stats.bytes_down = number("bytes_down");
    return stats;
  }

 private:
  explicit FaultProxyProcess(pid_t pid) : pid_(pid) {}

  // Reads `fd` into `text` until a line "ready", end of file, or 10 s.
  static bool read_until_ready(int fd, std::string& text) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (text.find("\nready\n") == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd readable{.fd = fd, .events = POLLIN, .revents = 0};
      if (::poll(&readable, 1, static_cast<int>(left.count())) <= 0) continue;
      char buffer[1024];
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n <= 0) return false;
      text.append(buffer, n);
    }
    return true;
  }

  const pid_t pid_;
  std::uint16_t control_port_ = 0;
  std::vector<std::uint16_t> ports_;
};

// Where a backend URL names its server, to point it through a proxy:
// [begin, end) of "host:port" in the URL.
using UrlSpan = std::pair<std::size_t, std::size_t>;

// A postgres:// URL's "host:port": between "//" (or the '@' after the
// user) and the next '/'.
inline UrlSpan postgres_authority(const std::string& url) {
  std::size_t begin = url.find("//") + 2;
  const std::size_t end = url.find('/', begin);
  const std::size_t at = url.rfind('@', end);
  if (at != std::string::npos && at >= begin) begin = at + 1;
  return {begin, end};
}

// "host:port" of an s3:// URL's endpoint parameter.
inline UrlSpan s3_endpoint_authority(const std::string& url) {
  const std::size_t begin = url.find("://", url.find("endpoint=")) + 3;
  return {begin, url.find_first_of("/&", begin)};
}

inline std::string authority(const std::string& url, UrlSpan span) {
  return url.substr(span.first, span.second - span.first);
}

inline std::string with_authority(std::string url, UrlSpan span, const std::string& replacement) {
  return url.replace(span.first, span.second - span.first, replacement);
}

}  // namespace tidemark::testing
