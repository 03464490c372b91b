#include <algorithm>
#include <memory>

#include "part/part.h"
#include "util/try.h"

namespace tidemark {

Result<PartReader> PartReader::open(std::string name, std::uint64_t size, FetchRange fetch) {
  PartReader reader;
  reader.name_ = std::move(name);
  reader.size_ = size;
  reader.fetch_ = std::move(fetch);
  TM_TRY(reader.read_footer());
  return reader;
}

Result<PartReader> PartReader::open_blob(Blob& blob, std::string key, std::uint64_t size) {
  FetchRange fetch = [&blob, key](std::uint64_t offset, std::uint64_t length) {
    return blob.get_range(key, offset, length);
  };
  return open(std::move(key), size, std::move(fetch));
}

Result<PartReader> PartReader::from_bytes(std::string name, std::string bytes) {
  return from_shared(std::move(name), std::make_shared<const std::string>(std::move(bytes)));
}

Result<PartReader> PartReader::from_shared(std::string name,
                                           std::shared_ptr<const std::string> object) {
  const std::uint64_t size = object->size();
  FetchRange fetch = [object](std::uint64_t offset, std::uint64_t length) -> Result<std::string> {
    // Like Blob::get_range: shorter when the object ends first.
    if (offset >= object->size()) return std::string();
    return object->substr(offset, length);
  };
  return open(std::move(name), size, std::move(fetch));
}

Result<std::string> PartReader::fetch_exact(std::uint64_t offset, std::uint64_t length) {
  TM_ASSIGN(std::string bytes, fetch_(offset, length));
  if (bytes.size() != length) {
    return part_corruption(name_, "fetched " + std::to_string(bytes.size()) + " bytes at offset " +
                                      std::to_string(offset) + ", expected " +
                                      std::to_string(length) + " (is the object shorter than " +
                                      std::to_string(size_) + " bytes?)");
  }
  return bytes;
}

Status PartReader::read_footer() {
  if (size_ < kPartHeaderBytes + kPartTrailerBytes) {
    return part_corruption(
        name_, "object of " + std::to_string(size_) + " bytes is smaller than the smallest part (" +
                   std::to_string(kPartHeaderBytes + kPartTrailerBytes) + " bytes)");
  }
  const std::uint64_t tail_length = std::min(size_, kOpenFetchBytes);
  tail_offset_ = size_ - tail_length;
  TM_ASSIGN(tail_, fetch_exact(tail_offset_, tail_length));

  const std::uint64_t trailer_offset = size_ - kPartTrailerBytes;
  TM_ASSIGN(
      const PartTrailer trailer,
      decode_part_trailer(name_, std::string_view(tail_).substr(trailer_offset - tail_offset_)));
  // The footer lies exactly between the header and the trailer (blocks in
  // between are checked against footer_offset below).
  if (trailer.footer_length > trailer_offset - kPartHeaderBytes ||
      trailer.footer_offset != trailer_offset - trailer.footer_length) {
    return part_corruption(name_, "footer [" + std::to_string(trailer.footer_offset) + ", +" +
                                      std::to_string(trailer.footer_length) +
                                      ") does not end where the trailer starts in an object of " +
                                      std::to_string(size_) + " bytes");
  }

  std::string fetched_footer;
  std::string_view footer_bytes;
  if (trailer.footer_offset >= tail_offset_) {
    footer_bytes =
        std::string_view(tail_).substr(trailer.footer_offset - tail_offset_, trailer.footer_length);
  } else {
    TM_ASSIGN(fetched_footer, fetch_exact(trailer.footer_offset, trailer.footer_length));
    footer_bytes = fetched_footer;
  }
  if (part_checksum(footer_bytes) != trailer.footer_checksum) {
    return part_corruption(name_, "footer checksum mismatch");
  }
  TM_ASSIGN(footer_, decode_part_footer(name_, footer_bytes));
  TM_TRY(check_part_footer(name_, footer_, trailer.footer_offset));

  // Keep only the block bytes of the tail; they spare a fetch later.
  if (tail_offset_ < trailer.footer_offset) {
    tail_.resize(trailer.footer_offset - tail_offset_);
  } else {
    std::string().swap(tail_);
  }
  if (tail_offset_ == 0) {
    TM_TRY(check_part_header(name_, tail_));
    header_checked_ = true;
  } else if (footer_.blocks.empty()) {
    TM_ASSIGN(const std::string header, fetch_exact(0, kPartHeaderBytes));
    TM_TRY(check_part_header(name_, header));
    header_checked_ = true;
  }
  // Otherwise the header is fetched and checked with block 0.
  return {};
}

std::uint64_t PartReader::largest_decoded_block_bytes() const {
  std::uint64_t largest = 0;
  for (const BlockHandle& block : footer_.blocks) {
    largest = std::max(largest, decoded_block_bytes(block.uncompressed_length, block.count));
  }
  return largest;
}

std::uint64_t PartReader::next_block_decoded_bytes() const {
  if (next_block_ >= footer_.blocks.size()) return 0;
  const BlockHandle& block = footer_.blocks[next_block_];
  return decoded_block_bytes(block.uncompressed_length, block.count);
}

Result<std::optional<UpdateView>> PartReader::next_block() {
  if (failed_) return std::unexpected(*failed_);
  if (next_block_ < footer_.blocks.size() && block_.count() > 0) {
    // The next block's first update is checked against this one's last,
    // and decompressing replaces these bytes: copy it, only now (not once
    // per block loaded) and only until that check is done.
    const UpdateView last = block_.at(block_.count() - 1);
    previous_key_.assign(last.key);
    previous_value_.assign(last.value);
    previous_time_ = last.time;
    previous_diff_ = last.diff;
  }
  block_.clear();
  position_ = 0;
  if (next_block_ == footer_.blocks.size()) return std::optional<UpdateView>();
  if (auto loaded = load_block(next_block_); !loaded) {
    block_.clear();
    if (loaded.error().is(ErrorKind::kCorruption)) failed_ = loaded.error();
    return std::unexpected(std::move(loaded).error());
  }
  ++next_block_;
  position_ = 1;
  return std::optional<UpdateView>(block_.at(0));
}

Status PartReader::load_block(std::size_t index) {
  const BlockHandle& handle = footer_.blocks[index];
  std::string_view compressed;
  if (!header_checked_) {
    // Only when index == 0 (blocks load in order): the header comes with it.
    TM_ASSIGN(compressed_, fetch_exact(0, handle.offset + handle.compressed_length));
    TM_TRY(check_part_header(name_, compressed_));
    header_checked_ = true;
    compressed = std::string_view(compressed_).substr(handle.offset);
  } else if (handle.offset >= tail_offset_ &&
             handle.offset - tail_offset_ + handle.compressed_length <= tail_.size()) {
    compressed =
        std::string_view(tail_).substr(handle.offset - tail_offset_, handle.compressed_length);
  } else if (handle.offset < tail_offset_ &&
             handle.offset + handle.compressed_length > tail_offset_ &&
             handle.offset + handle.compressed_length - tail_offset_ <= tail_.size()) {
    // It straddles the start of the tail: only the bytes before the tail
    // are fetched (a ranged read fewer per part, which counts on S3).
    TM_ASSIGN(compressed_, fetch_exact(handle.offset, tail_offset_ - handle.offset));
    compressed_.append(tail_, 0, handle.offset + handle.compressed_length - tail_offset_);
    compressed = compressed_;
  } else {
    TM_ASSIGN(compressed_, fetch_exact(handle.offset, handle.compressed_length));
    compressed = compressed_;
  }
  if (part_checksum(compressed) != handle.checksum) {
    return part_corruption(name_, "block " + std::to_string(index) + " checksum mismatch");
  }
  TM_TRY(decompressor_.decompress(name_, index, handle, compressed, &block_.bytes()));
  // Only one block's bytes at a time. (Swap, not `= std::string()`: a move
  // from an empty string keeps the destination's buffer.)
  std::string().swap(compressed_);
  TM_TRY(block_.decode(name_, index, handle.count));
  return check_block(index);
}

Status PartReader::check_block(std::size_t index) {
  const PartStats& stats = footer_.stats;
  const std::size_t count = block_.count();
  const auto failure = [&](std::size_t i, std::string_view detail) {
    return part_corruption(name_, "block " + std::to_string(index) + " update " +
                                      std::to_string(i) + ": " + std::string(detail));
  };

  // Times are checked against the stats' range, which read_footer() checked
  // to lie within the inline description.
  Time time_min = index == 0 ? stats.time_max : observed_time_min_;
  Time time_max = index == 0 ? stats.time_min : observed_time_max_;
  UpdateView previous{previous_key_, previous_value_, previous_time_, previous_diff_};
  for (std::size_t i = 0; i < count; ++i) {
    const UpdateView update = block_.at(i);
    if (update.diff == 0) return failure(i, "diff is 0");
    if (update.time < stats.time_min || update.time > stats.time_max) {
      return failure(i, "time " + std::to_string(update.time) + " outside the stats time range [" +
                            std::to_string(stats.time_min) + ", " + std::to_string(stats.time_max) +
                            "]");
    }
    if (i > 0 || index > 0) {
      const int order = compare_key_value_time(previous.key, previous.value, previous.time,
                                               update.key, update.value, update.time);
      if (order > 0 || (order == 0 && !continues_carry(previous.diff, update.diff))) {
        return failure(i, order == 0 ? "repeats the previous (key, value, time)"
                                     : "out of (key, value, time) order");
      }
    }
    time_min = std::min(time_min, update.time);
    time_max = std::max(time_max, update.time);
    previous = update;
  }

  if (index == 0 && block_.at(0).key != stats.key_min) {
    return part_corruption(name_, "first key differs from stats key_min");
  }
  // No overflow: each block adds less than 2^31 and the sum never exceeds
  // stats.bytes.
  observed_bytes_ += block_.payload_bytes();
  if (observed_bytes_ > stats.bytes) {
    return part_corruption(name_, "payload through block " + std::to_string(index) + " is " +
                                      std::to_string(observed_bytes_) +
                                      " bytes, more than stats bytes " +
                                      std::to_string(stats.bytes));
  }
  observed_time_min_ = time_min;
  observed_time_max_ = time_max;
  const UpdateView last = block_.at(count - 1);
  if (index + 1 == footer_.blocks.size()) {
    if (last.key != stats.key_max) {
      return part_corruption(name_, "last key differs from stats key_max");
    }
    if (observed_bytes_ != stats.bytes) {
      return part_corruption(name_, "payload is " + std::to_string(observed_bytes_) +
                                        " bytes but stats bytes is " + std::to_string(stats.bytes));
    }
    if (time_min != stats.time_min || time_max != stats.time_max) {
      return part_corruption(name_, "times span [" + std::to_string(time_min) + ", " +
                                        std::to_string(time_max) + "] but stats say [" +
                                        std::to_string(stats.time_min) + ", " +
                                        std::to_string(stats.time_max) + "]");
    }
  }
  // Checked against: a copy of a huge update is not kept while this block
  // is read.
  release_oversized(previous_key_, 0);
  release_oversized(previous_value_, 0);
  return {};
}

Result<std::vector<Update>> decode_part(std::string name, std::string bytes) {
  TM_ASSIGN(PartReader reader, PartReader::from_bytes(std::move(name), std::move(bytes)));
  std::vector<Update> updates;
  // The count was checked against the block index, but a hostile one could
  // still be large: let the vector grow past this on its own.
  updates.reserve(std::min<std::uint64_t>(reader.stats().count, std::uint64_t{1} << 16));
  while (true) {
    TM_ASSIGN(const std::optional<UpdateView> update, reader.next());
    if (!update) return updates;
    updates.push_back(update->to_owned());
  }
}

}  // namespace tidemark
