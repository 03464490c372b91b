#include "cli/line_reader.h"

#include <cerrno>
#include <cstring>

#include "util/size.h"

namespace tidemark::cli {

LineReader::LineReader(std::FILE* in, std::string name, std::uint64_t max_bytes,
                       std::string limit_flag)
    : in_(in),
      name_(std::move(name)),
      max_bytes_(max_bytes),
      limit_flag_(std::move(limit_flag)),
      buffer_(std::size_t{64} << 10, '\0') {}

bool LineReader::refill() {
  begin_ = 0;
  end_ = std::fread(buffer_.data(), 1, buffer_.size(), in_);
  return end_ > 0;
}

Result<std::optional<std::string_view>> LineReader::next() {
  line_.clear();
  bool started = false;  // a byte or a newline of this line was read
  for (;;) {
    if (begin_ == end_ && !refill()) {
      if (std::ferror(in_)) {
        return invalid_usage("cannot read " + name_ + " after line " + std::to_string(number_) +
                             ": " + std::strerror(errno));
      }
      if (!started) return std::optional<std::string_view>{};
      ++number_;
      return std::optional<std::string_view>{line_};  // the last line, without a newline
    }
    started = true;
    const char* at = buffer_.data() + begin_;
    const auto* newline = static_cast<const char*>(std::memchr(at, '\n', end_ - begin_));
    const std::size_t take = newline ? static_cast<std::size_t>(newline - at) : end_ - begin_;
    if (line_.size() + take > max_bytes_) {
      return invalid_usage("line " + std::to_string(number_ + 1) + " is longer than " +
                           format_size(max_bytes_) + " (" + limit_flag_ + " raises the limit)");
    }
    line_.append(at, take);
    begin_ += take;
    if (newline) {
      ++begin_;
      ++number_;
      return std::optional<std::string_view>{line_};
    }
  }
}

}  // namespace tidemark::cli
