// SilentListener: a TCP listener on 127.0.0.1 that takes connections and
// never answers them (nor closes them): an S3 endpoint or Kafka broker that
// hangs, for the tests of cancellation. Header-only; tests only.
//
// Thread-safety: one thread uses a listener.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace tidemark::testing {

class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(fd_, 64) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      throw std::system_error(errno, std::generic_category(), "silent listener");
    }
    port_ = ntohs(address.sin_port);
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  ~SilentListener() {
    for (int fd : held_) ::close(fd);
    ::close(fd_);
  }

  std::uint16_t port() const { return port_; }

  // Connections made so far (accepted and held open, unanswered).
  int connections() {
    for (int fd; (fd = ::accept(fd_, nullptr, nullptr)) >= 0;) held_.push_back(fd);
    return static_cast<int>(held_.size());
  }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::vector<int> held_;
};

}  // namespace tidemark::testing
