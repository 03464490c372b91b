// Fuzz target: the part format (header, blocks, footer, trailer), as a
// reader decodes an object fetched from the blob store. Any input must give
// updates or a Corruption error, never a crash, a sanitizer report or an
// allocation beyond the format's bounds (libFuzzer's -rss_limit_mb).
#include <cstddef>
#include <cstdint>
#include <string>

#include "part/part.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto updates = tidemark::decode_part("fuzz", std::move(bytes));
  if (!updates && updates.error().kind != tidemark::ErrorKind::kCorruption) __builtin_trap();
  return 0;
}
