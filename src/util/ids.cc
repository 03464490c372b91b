#include "util/ids.h"

#include <pthread.h>
#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <random>

namespace tidemark {
namespace {

// Bumped in a forked child, so that no thread of the child hands out the
// bytes its parent's thread still held (and may hand out itself).
std::atomic<std::uint64_t> forks{0};

void count_fork() {
  forks.fetch_add(1, std::memory_order_relaxed);
}

const bool fork_handler_installed = [] {
  return ::pthread_atfork(nullptr, nullptr, &count_fork) == 0;
}();

// Fills `out` from the kernel: getrandom(2), which costs no file
// descriptor; std::random_device (which would open /dev/urandom) only on a
// kernel without it.
void fill_random(std::uint8_t* out, std::size_t size) {
  std::size_t filled = 0;
  while (filled < size) {
    ssize_t n = ::getrandom(out + filled, size - filled, 0);
    if (n > 0) filled += static_cast<std::size_t>(n);
    if (n < 0 && errno != EINTR) break;
  }
  if (filled < size) {
    std::random_device rd;
    for (std::size_t i = filled; i < size; ++i) out[i] = static_cast<std::uint8_t>(rd());
  }
}

struct IdBuffer {
  std::uint8_t bytes[kIdBufferBytes];
  std::size_t used = kIdBufferBytes;  // nothing drawn yet
  std::uint64_t forks_seen = 0;
};

}  // namespace

std::string random_id() {
  static_assert(kIdBufferBytes % 16 == 0);
  thread_local IdBuffer buffer;
  std::uint8_t unbuffered[16];
  const std::uint8_t* bytes = unbuffered;
  if (!fork_handler_installed) {
    // A fork could not be told: draw every id on its own.
    fill_random(unbuffered, sizeof unbuffered);
  } else {
    const std::uint64_t now_forks = forks.load(std::memory_order_relaxed);
    if (buffer.used == kIdBufferBytes || buffer.forks_seen != now_forks) {
      fill_random(buffer.bytes, kIdBufferBytes);
      buffer.used = 0;
      buffer.forks_seen = now_forks;
    }
    bytes = buffer.bytes + buffer.used;
    buffer.used += 16;
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
