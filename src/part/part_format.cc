#include "part/part_format.h"

#include <xxh3.h>
#include <zstd.h>

#include "util/coding.h"
#include "util/try.h"

namespace tidemark {

namespace {

// The smallest encoded block handle: four one-byte varints and a fixed64.
constexpr std::uint64_t kMinEncodedBlockHandleBytes = 12;

std::string block_name(std::size_t block_index) {
  return "block " + std::to_string(block_index);
}

}  // namespace

std::unexpected<Error> part_corruption(std::string_view part_name, std::string_view detail) {
  std::string message = "part ";
  message += part_name;
  message += ": ";
  message += detail;
  return corruption(std::move(message));
}

std::uint64_t part_checksum(std::string_view bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

void release_oversized(std::string& buffer, std::size_t needed) {
  constexpr std::size_t kKeepBytes = std::size_t{1} << 20;
  if (buffer.capacity() > kKeepBytes && buffer.capacity() / 4 > needed) std::string().swap(buffer);
}

// Header ---------------------------------------------------------------------

void encode_part_header(std::string* out) {
  Encoder encoder(out);
  encoder.put_raw(kPartMagic);
  encoder.put_fixed32(kPartFormatVersion);
}

Status check_part_header(std::string_view part_name, std::string_view header) {
  Decoder decoder(header);
  std::string_view magic;
  std::uint32_t version;
  if (!decoder.get_raw(kPartMagic.size(), &magic) || !decoder.get_fixed32(&version)) {
    return part_corruption(part_name, "header: truncated");
  }
  if (magic != kPartMagic) return part_corruption(part_name, "header: bad magic");
  if (version != kPartFormatVersion) {
    return part_corruption(part_name,
                           "header: unsupported part version " + std::to_string(version));
  }
  return {};
}

// Footer ---------------------------------------------------------------------

void encode_part_footer(const PartFooter& footer, std::string* out) {
  Encoder encoder(out);
  put_frontier(encoder, footer.inline_desc.lower);
  put_frontier(encoder, footer.inline_desc.upper);
  put_frontier(encoder, footer.inline_desc.since);
  encoder.put_bytes(footer.stats.key_min);
  encoder.put_bytes(footer.stats.key_max);
  encoder.put_varint(footer.stats.time_min);
  encoder.put_varint(footer.stats.time_max);
  encoder.put_varint(footer.stats.count);
  encoder.put_varint(footer.stats.bytes);
  encoder.put_varint(footer.blocks.size());
  for (const BlockHandle& block : footer.blocks) {
    encoder.put_varint(block.offset);
    encoder.put_varint(block.compressed_length);
    encoder.put_varint(block.uncompressed_length);
    encoder.put_varint(block.count);
    encoder.put_fixed64(block.checksum);
  }
}

Result<PartFooter> decode_part_footer(std::string_view part_name, std::string_view bytes) {
  Decoder decoder(bytes);
  PartFooter footer;
  if (!get_frontier(decoder, &footer.inline_desc.lower) ||
      !get_frontier(decoder, &footer.inline_desc.upper) ||
      !get_frontier(decoder, &footer.inline_desc.since)) {
    return part_corruption(part_name, "footer: malformed inline description");
  }
  std::string_view key_min, key_max;
  PartStats& stats = footer.stats;
  if (!decoder.get_bytes(&key_min) || !decoder.get_bytes(&key_max) ||
      !decoder.get_varint(&stats.time_min) || !decoder.get_varint(&stats.time_max) ||
      !decoder.get_varint(&stats.count) || !decoder.get_varint(&stats.bytes)) {
    return part_corruption(part_name, "footer: malformed stats");
  }
  stats.key_min.assign(key_min);
  stats.key_max.assign(key_max);
  std::uint64_t block_count;
  if (!decoder.get_varint(&block_count)) {
    return part_corruption(part_name, "footer: malformed block count");
  }
  if (block_count > decoder.remaining() / kMinEncodedBlockHandleBytes) {
    return part_corruption(part_name, "footer: block count " + std::to_string(block_count) +
                                          " does not fit in the footer's " +
                                          std::to_string(decoder.remaining()) + " remaining bytes");
  }
  footer.blocks.resize(block_count);
  for (std::size_t i = 0; i < footer.blocks.size(); ++i) {
    BlockHandle& block = footer.blocks[i];
    if (!decoder.get_varint(&block.offset) || !decoder.get_varint(&block.compressed_length) ||
        !decoder.get_varint(&block.uncompressed_length) || !decoder.get_varint(&block.count) ||
        !decoder.get_fixed64(&block.checksum)) {
      return part_corruption(part_name, "footer: malformed index entry for " + block_name(i));
    }
  }
  if (!decoder.empty()) {
    return part_corruption(part_name,
                           "footer: " + std::to_string(decoder.remaining()) + " trailing bytes");
  }
  return footer;
}

Status check_part_footer(std::string_view part_name, const PartFooter& footer,
                         std::uint64_t footer_offset) {
  const Description& desc = footer.inline_desc;
  if (desc.upper < desc.lower) {
    return part_corruption(part_name,
                           "inline description " + desc.to_string() + " has upper < lower");
  }

  const PartStats& stats = footer.stats;
  if (stats.count == 0) {
    if (!stats.key_min.empty() || !stats.key_max.empty() || stats.time_min != 0 ||
        stats.time_max != 0 || stats.bytes != 0) {
      return part_corruption(part_name, "stats of an empty part are not empty");
    }
  } else {
    if (stats.key_min > stats.key_max) {
      return part_corruption(part_name, "stats key_min > key_max");
    }
    if (stats.time_min > stats.time_max) {
      return part_corruption(part_name, "stats time_min " + std::to_string(stats.time_min) +
                                            " > time_max " + std::to_string(stats.time_max));
    }
    if (!desc.contains(stats.time_min) || !desc.contains(stats.time_max)) {
      return part_corruption(part_name, "stats time range [" + std::to_string(stats.time_min) +
                                            ", " + std::to_string(stats.time_max) +
                                            "] is outside the inline description " +
                                            desc.to_string());
    }
    if (stats.bytes / 16 < stats.count) {
      return part_corruption(part_name, "stats bytes " + std::to_string(stats.bytes) +
                                            " too small for " + std::to_string(stats.count) +
                                            " updates");
    }
  }

  for (std::size_t i = 1; i < footer.blocks.size(); ++i) {
    if (footer.blocks[i].offset <= footer.blocks[i - 1].offset) {
      return part_corruption(part_name, "block index not in increasing order at " + block_name(i));
    }
  }
  std::uint64_t expected_offset = kPartHeaderBytes;
  std::uint64_t total_count = 0;
  for (std::size_t i = 0; i < footer.blocks.size(); ++i) {
    const BlockHandle& block = footer.blocks[i];
    const std::string name = block_name(i);
    if (block.offset < expected_offset) {
      return part_corruption(part_name, name + " at offset " + std::to_string(block.offset) +
                                            " overlaps what precedes it (ends at " +
                                            std::to_string(expected_offset) + ")");
    }
    if (block.offset > expected_offset) {
      return part_corruption(part_name, name + " at offset " + std::to_string(block.offset) +
                                            " leaves a gap after offset " +
                                            std::to_string(expected_offset));
    }
    if (block.offset > footer_offset || block.compressed_length == 0 ||
        block.compressed_length > footer_offset - block.offset) {
      return part_corruption(part_name, name + " [" + std::to_string(block.offset) + ", +" +
                                            std::to_string(block.compressed_length) +
                                            ") is empty or extends past the footer at " +
                                            std::to_string(footer_offset));
    }
    if (block.count == 0) return part_corruption(part_name, name + " has no updates");
    if (block.uncompressed_length > kMaxBlockUncompressedBytes ||
        (block.uncompressed_length + kMaxCompressionRatio - 1) / kMaxCompressionRatio >
            block.compressed_length) {
      return part_corruption(part_name, name + " claims an implausible uncompressed length " +
                                            std::to_string(block.uncompressed_length) + " for " +
                                            std::to_string(block.compressed_length) +
                                            " compressed bytes");
    }
    if (block.count > block.uncompressed_length / kMinEncodedUpdateBytes) {
      return part_corruption(part_name, name + " claims " + std::to_string(block.count) +
                                            " updates in " +
                                            std::to_string(block.uncompressed_length) + " bytes");
    }
    // No more than the writer can have made, so that what a block decodes
    // to is bounded before anything is allocated (a few KiB of zstd can
    // claim hundreds of MiB of empty updates): a block of several updates
    // holds at most kMaxBlockBytesOption of payload, and no block encodes
    // more than its payload (at most the part's) allows.
    if (block.count > 1 && block.count > kMaxBlockBytesOption / 16) {
      return part_corruption(part_name, name + " claims " + std::to_string(block.count) +
                                            " updates, more than a block can hold (" +
                                            std::to_string(kMaxBlockBytesOption / 16) + ")");
    }
    const std::uint64_t payload =
        block.count > 1 ? std::min<std::uint64_t>(stats.bytes, kMaxBlockBytesOption) : stats.bytes;
    if (block.uncompressed_length > max_block_length(payload, block.count)) {
      return part_corruption(part_name, name + " claims " +
                                            std::to_string(block.uncompressed_length) +
                                            " bytes, more than " + std::to_string(block.count) +
                                            " updates of at most " + std::to_string(payload) +
                                            " payload bytes encode to");
    }
    // Cannot overflow: each count is below 2^28 and there are fewer than
    // 2^61 blocks in a footer that fits in memory.
    total_count += block.count;
    expected_offset = block.offset + block.compressed_length;
  }
  if (expected_offset != footer_offset) {
    return part_corruption(part_name, "blocks end at " + std::to_string(expected_offset) +
                                          " but the footer starts at " +
                                          std::to_string(footer_offset));
  }
  if (total_count != stats.count) {
    return part_corruption(part_name, "block counts sum to " + std::to_string(total_count) +
                                          " but stats count is " + std::to_string(stats.count));
  }
  return {};
}

// Trailer --------------------------------------------------------------------

void encode_part_trailer(const PartTrailer& trailer, std::string* out) {
  Encoder encoder(out);
  encoder.put_fixed64(trailer.footer_offset);
  encoder.put_fixed32(trailer.footer_length);
  encoder.put_fixed32(trailer.version);
  encoder.put_fixed64(trailer.footer_checksum);
  encoder.put_raw(kPartMagic);
}

Result<PartTrailer> decode_part_trailer(std::string_view part_name, std::string_view bytes) {
  if (bytes.size() != kPartTrailerBytes) {
    return part_corruption(part_name, "trailer of " + std::to_string(bytes.size()) +
                                          " bytes, expected " + std::to_string(kPartTrailerBytes));
  }
  if (bytes.substr(kPartTrailerBytes - kPartMagic.size()) != kPartMagic) {
    return part_corruption(part_name, "trailer: bad magic");
  }
  Decoder decoder(bytes);
  PartTrailer trailer;
  // Cannot fail: the size was checked above.
  [[maybe_unused]] bool ok =
      decoder.get_fixed64(&trailer.footer_offset) && decoder.get_fixed32(&trailer.footer_length) &&
      decoder.get_fixed32(&trailer.version) && decoder.get_fixed64(&trailer.footer_checksum);
  if (trailer.version != kPartFormatVersion) {
    return part_corruption(part_name,
                           "trailer: unsupported part version " + std::to_string(trailer.version));
  }
  return trailer;
}

// Blocks ---------------------------------------------------------------------

void BlockBuilder::add(UpdateView update, std::string* value_buffer) {
  Encoder(&key_lengths_).put_varint(update.key.size());
  keys_.append(update.key);
  Encoder(&value_lengths_).put_varint(update.value.size());
  if (value_buffer && count_ == 0) {
    values_.clear();
    values_.swap(*value_buffer);
  } else {
    values_.append(update.value);
  }
  // Wrapping subtraction, reinterpreted as signed: a bijection on u64, and
  // small when neighbouring times are close in either direction.
  Encoder(&time_deltas_).put_signed_varint(static_cast<std::int64_t>(update.time - previous_time_));
  previous_time_ = update.time;
  Encoder(&diffs_).put_signed_varint(update.diff);
  last_diff_ = update.diff;
  last_key_length_ = update.key.size();
  last_value_length_ = update.value.size();
  ++count_;
  payload_bytes_ += update_payload_bytes(update);
}

std::uint64_t BlockBuilder::encoded_bytes() const {
  return key_lengths_.size() + keys_.size() + value_lengths_.size() + values_.size() +
         time_deltas_.size() + diffs_.size();
}

void BlockBuilder::finish(std::string* out) {
  Encoder(out).put_varint(count_);
  for (const std::string* column :
       {&key_lengths_, &keys_, &value_lengths_, &values_, &time_deltas_, &diffs_}) {
    out->append(*column);
  }
  reset();
}

Result<std::uint64_t> BlockBuilder::finish_compressed(BlockCompressor& compressor,
                                                      std::size_t block_bytes, std::string* out) {
  std::string count;
  Encoder(&count).put_varint(count_);
  const std::string_view pieces[] = {count,   key_lengths_, keys_, value_lengths_,
                                     values_, time_deltas_, diffs_};
  std::uint64_t length = 0;
  for (std::string_view piece : pieces) length += piece.size();
  TM_TRY(compressor.compress(pieces, out));
  for (std::string* column :
       {&key_lengths_, &keys_, &value_lengths_, &values_, &time_deltas_, &diffs_}) {
    release_oversized(*column, block_bytes);
  }
  reset();
  return length;
}

void BlockBuilder::reset() {
  for (std::string* column :
       {&key_lengths_, &keys_, &value_lengths_, &values_, &time_deltas_, &diffs_}) {
    column->clear();
  }
  previous_time_ = 0;
  last_diff_ = 0;
  last_key_length_ = last_value_length_ = 0;
  count_ = 0;
  payload_bytes_ = 0;
}

namespace {

// Reads `count` varint lengths into `offsets` (count + 1 running sums,
// starting at 0) and then skips the bytes they cover; `base` receives the
// position of those bytes in `block`.
[[nodiscard]] bool decode_byte_column(std::string_view block, Decoder& decoder, std::size_t count,
                                      std::vector<std::uint32_t>& offsets, std::size_t* base) {
  offsets.resize(count + 1);
  std::uint32_t* out = offsets.data();
  out[0] = 0;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t length;
    if (!decoder.get_varint(&length)) return false;
    // The block is at most kMaxBlockUncompressedBytes, so once total fits
    // in it, it fits in a u32.
    if (length > block.size() || (total += length) > block.size()) return false;
    out[i + 1] = static_cast<std::uint32_t>(total);
  }
  *base = block.size() - decoder.remaining();
  std::string_view bytes;
  return decoder.get_raw(total, &bytes);
}

}  // namespace

Status DecodedBlock::decode(std::string_view part_name, std::size_t block_index,
                            std::uint64_t expected_count) {
  count_ = 0;
  const std::string_view block(bytes_);
  const std::string name = block_name(block_index);
  if (block.size() > kMaxBlockUncompressedBytes) {
    return part_corruption(part_name, name + " is larger than the format allows");
  }
  Decoder decoder(block);
  std::uint64_t count;
  if (!decoder.get_varint(&count)) return part_corruption(part_name, name + ": malformed count");
  if (count != expected_count) {
    return part_corruption(part_name, name + " holds " + std::to_string(count) +
                                          " updates but its index entry says " +
                                          std::to_string(expected_count));
  }
  if (count > block.size() / kMinEncodedUpdateBytes) {
    return part_corruption(part_name,
                           name + ": count " + std::to_string(count) + " too large for its size");
  }
  if (!decode_byte_column(block, decoder, count, key_offsets_, &keys_base_)) {
    return part_corruption(part_name, name + ": malformed key column");
  }
  if (!decode_byte_column(block, decoder, count, value_offsets_, &values_base_)) {
    return part_corruption(part_name, name + ": malformed value column");
  }
  times_.resize(count);
  Time time = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t delta;
    if (!decoder.get_signed_varint(&delta)) {
      return part_corruption(part_name, name + ": malformed time column");
    }
    time += static_cast<std::uint64_t>(delta);
    times_[i] = time;
  }
  diffs_.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (!decoder.get_signed_varint(&diffs_[i])) {
      return part_corruption(part_name, name + ": malformed diff column");
    }
  }
  if (!decoder.empty()) {
    return part_corruption(
        part_name, name + " has " + std::to_string(decoder.remaining()) + " trailing bytes");
  }
  count_ = count;
  payload_bytes_ = key_offsets_[count] + std::uint64_t{value_offsets_[count]} + 16 * count;
  return {};
}

void ZstdCompressContextDeleter::operator()(ZSTD_CCtx_s* context) const {
  ZSTD_freeCCtx(context);
}
void ZstdDecompressContextDeleter::operator()(ZSTD_DCtx_s* context) const {
  ZSTD_freeDCtx(context);
}

bool BlockCompressor::valid_level(int level) {
  return level >= ZSTD_minCLevel() && level <= ZSTD_maxCLevel();
}

Status BlockCompressor::compress(std::string_view uncompressed, std::string* out) {
  return compress(std::span<const std::string_view>(&uncompressed, 1), out);
}

namespace {

// The calling thread's compression context (BlockCompressor), and the level
// it is set to.
struct CachedCompressContext {
  std::unique_ptr<ZSTD_CCtx_s, ZstdCompressContextDeleter> context;
  int level = 0;
};
thread_local CachedCompressContext cached_compress_context;

// Frees the thread's context when it has grown past the bound, once a call
// no longer needs it.
struct CompressContextTrim {
  ~CompressContextTrim() {
    CachedCompressContext& cached = cached_compress_context;
    if (cached.context &&
        ZSTD_sizeof_CCtx(cached.context.get()) > BlockCompressor::kMaxCachedCompressContextBytes) {
      cached.context.reset();
    }
  }
};

}  // namespace

std::size_t BlockCompressor::thread_context_bytes() {
  const CachedCompressContext& cached = cached_compress_context;
  return cached.context ? ZSTD_sizeof_CCtx(cached.context.get()) : 0;
}

Status BlockCompressor::compress(std::span<const std::string_view> pieces, std::string* out) {
  const auto failed = [](std::size_t code) {
    return determinate(std::string("zstd compression failed: ") + ZSTD_getErrorName(code));
  };
  if (pieces.empty()) return compress(std::string_view(), out);
  CachedCompressContext& cached = cached_compress_context;
  const CompressContextTrim trim;
  if (!cached.context) {
    cached.context.reset(ZSTD_createCCtx());
    if (!cached.context) return determinate("zstd: cannot allocate a compression context");
    cached.level = 0;  // zstd's default, set below
  }
  ZSTD_CCtx_s* context = cached.context.get();
  // Forgets any frame an earlier call left unfinished (it failed midway).
  std::size_t result = ZSTD_CCtx_reset(context, ZSTD_reset_session_only);
  if (!ZSTD_isError(result) && cached.level != level_) {
    result = ZSTD_CCtx_setParameter(context, ZSTD_c_compressionLevel, level_);
    if (!ZSTD_isError(result)) cached.level = level_;
  }
  std::size_t total = 0;
  for (std::string_view piece : pieces) total += piece.size();
  // The pledged size goes into the frame header as its content size.
  if (!ZSTD_isError(result)) result = ZSTD_CCtx_setPledgedSrcSize(context, total);
  if (ZSTD_isError(result)) return failed(result);
  // With room for the bound, zstd never stops for lack of output space.
  const std::size_t start = out->size();
  const std::size_t bound = ZSTD_compressBound(total);
  bool done = false;
  out->resize_and_overwrite(start + bound, [&](char* data, std::size_t) {
    ZSTD_outBuffer output{data + start, bound, 0};
    for (std::size_t i = 0; i < pieces.size() && !ZSTD_isError(result); ++i) {
      const bool last = i + 1 == pieces.size();
      ZSTD_inBuffer input{pieces[i].data(), pieces[i].size(), 0};
      do {
        result =
            ZSTD_compressStream2(context, &output, &input, last ? ZSTD_e_end : ZSTD_e_continue);
        done = last ? result == 0 : input.pos == input.size;
      } while (!ZSTD_isError(result) && !done && output.pos < output.size);
      if (!done) break;
    }
    return done ? start + output.pos : start;
  });
  if (ZSTD_isError(result)) return failed(result);
  if (!done) return determinate("zstd compression overran its bound");
  return {};
}

Status BlockDecompressor::decompress(std::string_view part_name, std::size_t block_index,
                                     const BlockHandle& handle, std::string_view compressed,
                                     std::string* out) {
  const std::string name = block_name(block_index);
  // Exactly one frame, nothing after it (a skippable frame or a second
  // frame would be bytes that mean nothing).
  const std::size_t frame_length =
      ZSTD_findFrameCompressedSize(compressed.data(), compressed.size());
  if (ZSTD_isError(frame_length) || frame_length != compressed.size()) {
    return part_corruption(part_name, name + " is not exactly one zstd frame");
  }
  const unsigned long long content_size =
      ZSTD_getFrameContentSize(compressed.data(), compressed.size());
  if (content_size == ZSTD_CONTENTSIZE_ERROR || content_size == ZSTD_CONTENTSIZE_UNKNOWN ||
      content_size != handle.uncompressed_length) {
    return part_corruption(part_name, name +
                                          ": zstd frame content size does not match the "
                                          "recorded uncompressed length " +
                                          std::to_string(handle.uncompressed_length));
  }
  if (handle.uncompressed_length > kMaxBlockUncompressedBytes) {
    return part_corruption(part_name, name + " is larger than the format allows");
  }
  thread_local std::unique_ptr<ZSTD_DCtx_s, ZstdDecompressContextDeleter> context(
      ZSTD_createDCtx());
  if (!context) return determinate("zstd: cannot allocate a decompression context");
  const std::size_t length = handle.uncompressed_length;
  release_oversized(*out, length);
  std::size_t result = 0;
  out->resize_and_overwrite(length, [&](char* data, std::size_t) {
    result = ZSTD_decompressDCtx(context.get(), data, length, compressed.data(), compressed.size());
    return ZSTD_isError(result) ? 0 : result;
  });
  if (ZSTD_isError(result)) {
    return part_corruption(part_name,
                           name + ": zstd decompression failed: " + ZSTD_getErrorName(result));
  }
  if (result != length) {
    return part_corruption(part_name, name + " decompressed to " + std::to_string(result) +
                                          " bytes, expected " + std::to_string(length));
  }
  return {};
}

}  // namespace tidemark
