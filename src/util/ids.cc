#include "util/ids.h"

#include <random>

namespace tidemark {

std::string random_id() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int half = 0; half < 2; ++half) {
    std::uint64_t v = rng();
    for (int i = 0; i < 16; ++i) out[half * 16 + i] = kHex[(v >> (4 * i)) & 0xf];
  }
  return out;
}

}  // namespace tidemark
