// LineReader: the lines of an input file, each bounded.
//
// Reads through a 64 KiB buffer and gives each line without its newline.
// A line longer than `max_bytes` is refused as soon as it passes the
// limit, naming its number; the rest of it is never read into memory.
// Memory: the buffer plus the longest line accepted (at most max_bytes).
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "tidemark/error.h"

namespace tidemark::cli {

class LineReader {
 public:
  // `name` names the input in errors; `limit_flag` the option that raises
  // the limit. `in` stays the caller's.
  LineReader(std::FILE* in, std::string name, std::uint64_t max_bytes, std::string limit_flag);

  // The next line (valid until the next call), or nullopt at the end. An
  // error names the line: too long, or a read that failed (so that a
  // failed read never passes for a shorter input).
  [[nodiscard]] Result<std::optional<std::string_view>> next();

  // The number of the line last returned (1 for the first).
  std::uint64_t number() const { return number_; }

 private:
  bool refill();

  std::FILE* in_;
  const std::string name_;
  const std::uint64_t max_bytes_;
  const std::string limit_flag_;
  std::string buffer_;
  std::size_t begin_ = 0, end_ = 0;
  std::string line_;
  std::uint64_t number_ = 0;
};

}  // namespace tidemark::cli
