#include "part/part.h"
#include "util/try.h"

namespace tidemark {

namespace {

// The largest update the writer accepts: its encoded block (payload plus
// at most 40 bytes of varints) must stay within kMaxBlockUncompressedBytes.
constexpr std::uint64_t kMaxUpdatePayloadBytes = kMaxBlockUncompressedBytes - 64;

}  // namespace

PartWriter::PartWriter(Description inline_desc, PartOptions options)
    : inline_desc_(inline_desc), options_(options), compressor_(options.zstd_level) {
  if (inline_desc_.upper < inline_desc_.lower) {
    error_ = invalid_usage("part writer: inline description " + inline_desc_.to_string() +
                           " has upper < lower")
                 .error();
  } else if (options_.block_bytes == 0 || options_.block_bytes > kMaxBlockBytesOption) {
    error_ = invalid_usage("part writer: block_bytes " + std::to_string(options_.block_bytes) +
                           " outside [1, " + std::to_string(kMaxBlockBytesOption) + "]")
                 .error();
  } else if (!BlockCompressor::valid_level(options_.zstd_level)) {
    error_ = invalid_usage("part writer: invalid zstd level " + std::to_string(options_.zstd_level))
                 .error();
  }
  encode_part_header(&out_);
}

std::unexpected<Error> PartWriter::fail(std::string message) {
  auto error = invalid_usage("part writer: " + std::move(message));
  error_ = error.error();
  return error;
}

Status PartWriter::add_update(UpdateView update, std::string* value_buffer) {
  if (error_) return std::unexpected(*error_);
  if (finished_) return invalid_usage("part writer: add after finish");
  // Built only on failure: add() is on the hot path.
  const auto position = [&] { return "update " + std::to_string(stats_.count); };
  if (update.diff == 0) return fail(position() + " has diff 0");
  if (!inline_desc_.contains(update.time)) {
    return fail(position() + " has time " + std::to_string(update.time) +
                " outside the inline description " + inline_desc_.to_string());
  }
  if (stats_.count > 0) {
    // The open block always holds the last update: add() flushes a block
    // only just before adding to the next one.
    const UpdateView last = block_.last();
    const int order = compare_key_value_time(last.key, last.value, last.time, update.key,
                                             update.value, update.time);
    if (order == 0 && !continues_carry(last.diff, update.diff)) {
      return fail(position() + " repeats the previous (key, value, time)");
    }
    if (order > 0) return fail(position() + " is before the previous in (key, value, time) order");
  }
  const std::uint64_t payload = update_payload_bytes(update);
  if (payload > kMaxUpdatePayloadBytes) {
    return fail(position() + " of " + std::to_string(payload) + " bytes exceeds the limit of " +
                std::to_string(kMaxUpdatePayloadBytes));
  }
  if (!block_.empty() && block_.payload_bytes() + payload > options_.block_bytes) {
    TM_TRY(flush_block());
  }
  // An update over block_bytes is a block of its own: the block is empty.
  block_.add(update, payload > options_.block_bytes ? value_buffer : nullptr);

  if (stats_.count == 0) {
    stats_.key_min.assign(update.key);
    stats_.time_min = stats_.time_max = update.time;
  } else {
    stats_.time_min = std::min(stats_.time_min, update.time);
    stats_.time_max = std::max(stats_.time_max, update.time);
  }
  stats_.key_max.assign(update.key);
  ++stats_.count;
  stats_.bytes += payload;
  return {};
}

Status PartWriter::flush_block() {
  BlockHandle handle;
  handle.offset = out_.size();
  handle.count = block_.count();
  auto length = block_.finish_compressed(compressor_, options_.block_bytes, &out_);
  if (!length) {
    error_ = length.error();
    return std::unexpected(length.error());
  }
  handle.uncompressed_length = *length;
  handle.compressed_length = out_.size() - handle.offset;
  handle.checksum =
      part_checksum(std::string_view(out_).substr(handle.offset, handle.compressed_length));
  blocks_.push_back(handle);
  return {};
}

std::uint64_t PartWriter::encoded_bytes_so_far() const {
  return out_.size() + block_.encoded_bytes();
}

Result<std::string> PartWriter::finish() {
  if (error_) return std::unexpected(*error_);
  if (finished_) return invalid_usage("part writer: finish called twice");
  if (!block_.empty()) TM_TRY(flush_block());
  finished_ = true;

  PartTrailer trailer;
  trailer.footer_offset = out_.size();
  PartFooter footer{inline_desc_, stats_, std::move(blocks_)};
  blocks_.clear();
  encode_part_footer(footer, &out_);
  const std::string_view footer_bytes = std::string_view(out_).substr(trailer.footer_offset);
  if (footer_bytes.size() > UINT32_MAX) {
    return invalid_usage("part writer: footer of " + std::to_string(footer_bytes.size()) +
                         " bytes exceeds the format's limit; use fewer blocks");
  }
  trailer.footer_length = static_cast<std::uint32_t>(footer_bytes.size());
  trailer.footer_checksum = part_checksum(footer_bytes);
  encode_part_trailer(trailer, &out_);
  return std::move(out_);
}

}  // namespace tidemark
