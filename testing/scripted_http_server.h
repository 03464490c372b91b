// ScriptedHttpServer: an HTTP/1.1 server on 127.0.0.1 that answers each
// request with what the test's script returns, and records every request.
// It gives a client the answers a real server will not give on demand
// (503 SlowDown, 200 with an error inside, garbage, silence). Test-only.
//
// Each connection is served by a thread of its own, its requests in order
// (keep-alive). Bodies are read by Content-Length; "Expect: 100-continue"
// is answered. The script returns the raw answer (see answer()), or
// kCloseConnection (close without answering), or kNoAnswer (keep the
// connection open and silent until the server is destroyed).
//
// Thread-safety: the script is called from the connection threads, one
// request at a time per connection but concurrently across connections.
// requests() and connections() may be called from any thread.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace tidemark {

struct RecordedRequest {
  std::string method;
  std::string target;  // path and query
  std::string path;
  std::string query;                           // after '?', or ""
  std::map<std::string, std::string> headers;  // lowercase names, trimmed values
  std::string body;

  // The header's value, or "" without it.
  std::string header(const std::string& name) const {
    auto found = headers.find(name);
    return found == headers.end() ? std::string() : found->second;
  }
};

class ScriptedHttpServer {
 public:
  using Script = std::function<std::string(const RecordedRequest&)>;

  static constexpr std::string_view kCloseConnection = "\x01 close";
  static constexpr std::string_view kNoAnswer = "\x01 no answer";

  explicit ScriptedHttpServer(Script script) : script_(std::move(script)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t size = sizeof address;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
        ::listen(listener_, 64) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
      ADD_FAILURE() << "scripted server: cannot listen on 127.0.0.1: errno " << errno;
      return;
    }
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { accept_connections(); });
  }

  ScriptedHttpServer(const ScriptedHttpServer&) = delete;
  ScriptedHttpServer& operator=(const ScriptedHttpServer&) = delete;

  ~ScriptedHttpServer() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      for (int fd : connection_fds_) ::shutdown(fd, SHUT_RDWR);
    }
    stopped_.notify_all();
    if (listener_ >= 0) ::shutdown(listener_, SHUT_RDWR);  // wakes accept()
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& thread : connection_threads_) thread.join();
    for (int fd : connection_fds_) ::close(fd);
    if (listener_ >= 0) ::close(listener_);
  }

  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::vector<RecordedRequest> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }
  int connections() const {
    std::lock_guard lock(mutex_);
    return static_cast<int>(connection_fds_.size());
  }

  // A whole answer with a Content-Length.
  static std::string answer(int status, std::string_view body = {},
                            const std::vector<std::string>& headers = {}) {
    std::string out = "HTTP/1.1 " + std::to_string(status) + " Scripted\r\n";
    out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    for (const std::string& header : headers) out += header + "\r\n";
    out += "\r\n";
    out += body;
    return out;
  }

  // An S3 error answer: <Error><Code>...</Code><Message>...</Message></Error>.
  static std::string s3_error(int status, std::string_view code, std::string_view message) {
    return answer(status,
                  "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>" + std::string(code) +
                      "</Code><Message>" + std::string(message) + "</Message></Error>",
                  {"Content-Type: application/xml"});
  }

 private:
  void accept_connections() {
    while (true) {
      int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // shut down
      }
      std::lock_guard lock(mutex_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      connection_fds_.push_back(fd);
      connection_threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  static bool read_more(int fd, std::string* buffer) {
    char chunk[64 << 10];
    while (true) {
      ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buffer->append(chunk, static_cast<std::size_t>(n));
      return true;
    }
  }

  static bool send_all(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  void serve(int fd) {
    std::string buffer;
    while (true) {
      std::size_t end;
      while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
        if (!read_more(fd, &buffer)) return;
      }
      RecordedRequest request;
      std::string_view head(buffer.data(), end);
      std::size_t line_end = head.find("\r\n");
      std::string_view request_line = head.substr(0, line_end);
      std::size_t first_space = request_line.find(' ');
      std::size_t second_space = request_line.find(' ', first_space + 1);
      request.method = request_line.substr(0, first_space);
      request.target = request_line.substr(first_space + 1, second_space - first_space - 1);
      std::size_t mark = request.target.find('?');
      request.path = request.target.substr(0, mark);
      request.query = mark == std::string::npos ? "" : request.target.substr(mark + 1);
      while (line_end != std::string_view::npos) {
        std::size_t next = head.find("\r\n", line_end + 2);
        std::string_view line = head.substr(line_end + 2, next - line_end - 2);
        line_end = next;
        std::size_t colon = line.find(':');
        if (colon == std::string_view::npos) continue;
        std::string name(line.substr(0, colon));
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        std::string_view value = line.substr(colon + 1);
        while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
        while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
        request.headers[name] = value;
      }
      buffer.erase(0, end + 4);
      if (request.header("expect") == "100-continue" &&
          !send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n")) {
        return;
      }
      std::size_t length = 0;
      if (std::string declared = request.header("content-length"); !declared.empty()) {
        length = std::stoull(declared);
      }
      while (buffer.size() < length) {
        if (!read_more(fd, &buffer)) return;
      }
      request.body = buffer.substr(0, length);
      buffer.erase(0, length);
      {
        std::lock_guard lock(mutex_);
        requests_.push_back(request);
      }
      std::string reply = script_(request);
      if (reply == kCloseConnection) {
        ::shutdown(fd, SHUT_RDWR);
        return;
      }
      if (reply == kNoAnswer) {
        std::unique_lock lock(mutex_);
        stopped_.wait(lock, [&] { return stopping_; });
        return;
      }
      if (!send_all(fd, reply)) return;
    }
  }

  const Script script_;
  int listener_ = -1;
  int port_ = 0;
  std::thread acceptor_;

  mutable std::mutex mutex_;
  std::condition_variable stopped_;
  bool stopping_ = false;                        // guarded by mutex_
  std::vector<int> connection_fds_;              // guarded by mutex_
  std::vector<std::thread> connection_threads_;  // guarded by mutex_; joined after stopping
  std::vector<RecordedRequest> requests_;        // guarded by mutex_
};

}  // namespace tidemark
