#include "util/ids.h"

#include <sys/random.h>

#include <cstdint>
#include <random>

namespace tidemark {

std::string random_id() {
  // getrandom(2) costs one syscall and no file descriptor; a thread-local
  // std::random_device would open /dev/urandom in every short-lived upload
  // thread.
  std::uint8_t bytes[16];
  std::size_t filled = 0;
  while (filled < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + filled, sizeof bytes - filled, 0);
    if (n > 0) filled += static_cast<std::size_t>(n);
    if (n < 0) break;  // only on a kernel without getrandom: fall back below
  }
  if (filled < sizeof bytes) {
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rd());
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = kHex[bytes[i] >> 4];
    out[2 * i + 1] = kHex[bytes[i] & 0xf];
  }
  return out;
}

}  // namespace tidemark
