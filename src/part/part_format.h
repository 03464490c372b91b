// The part format: how one immutable part is laid out in its blob object.
//
// A part holds updates sorted strictly by (key, value, time), consolidated
// (no two updates share a (key, value, time); no diff is 0), all with times
// inside the part's own ("inline") description. It is written once by
// PartWriter and read as a stream by PartReader (part/part.h); this file is
// the byte layout and its codecs, shared by both and by tests that craft
// damaged parts.
//
// Format version 1. Integers: fixed32 and fixed64 are little-endian;
// varint is unsigned LEB128 and svarint is a zig-zag varint (util/coding.h).
//
//   offset                     what                    size
//   0                          header                  12 bytes
//   12                         block 0                 compressed_length(0)
//   ...                        block i (contiguous)    compressed_length(i)
//   footer_offset              footer                  footer_length
//   size - 32                  trailer                 32 bytes
//
// Header: magic "TDMPART1" (8 bytes), version fixed32.
//
// Block: exactly one zstd frame that records its content size, nothing
// before or after it. Decompressed it is the columnar block:
//   varint  count                       (>= 1)
//   varint  key_length    x count
//   bytes   keys                        (concatenated; sum of key lengths)
//   varint  value_length  x count
//   bytes   values                      (concatenated)
//   svarint time_delta    x count       (time[i] - time[i-1] mod 2^64,
//                                        with time[-1] = 0)
//   svarint diff          x count
// and nothing after. A block holds updates whose payload bytes (see
// update_payload_bytes) sum to at most the writer's block_bytes, except that
// a single update larger than that is a block of its own.
//
// Footer:
//   frontier lower, upper, since       each: u8 tag, 0 = a time follows as a
//                                      varint, 1 = closed
//   bytes    key_min, key_max          varint length + bytes
//   varint   time_min, time_max, count, bytes
//   varint   block_count
//   block_count x { varint offset, varint compressed_length,
//                   varint uncompressed_length, varint count,
//                   fixed64 checksum (xxh3-64 of the compressed bytes) }
// and nothing after.
//
// Trailer: fixed64 footer_offset, fixed32 footer_length, fixed32 version,
// fixed64 footer checksum (xxh3-64 of the footer bytes), magic "TDMPART1".
//
// A reader reads the trailer from the end (the caller knows the object's
// size), then the footer, then the blocks in order. Every byte of the object
// is checked by something: the header by magic and version, each block by
// its checksum, the footer by its checksum, the trailer by its magic, its
// version and by the footer ending exactly where the trailer starts. The
// semantic checks a reader makes beyond the checksums (so that a footer
// written by a buggy or hostile writer cannot crash it, make it allocate
// without bound, or return wrong data):
//   - blocks start at the header's end, are contiguous, non-empty, and the
//     last ends exactly at the footer;
//   - each block's count >= 1, its uncompressed length is at most
//     kMaxBlockUncompressedBytes and at most kMaxCompressionRatio times its
//     compressed length, and holds at least kMinEncodedUpdateBytes per
//     update; the block counts sum to stats.count;
//   - lower <= upper; an empty part has empty stats; otherwise key_min <=
//     key_max, time_min <= time_max, both inside the inline description,
//     and bytes >= 16 * count;
//   - when decoded: the zstd frame is exactly the block and its content size
//     is the recorded uncompressed length; columns parse exactly; the count
//     matches; updates are strictly increasing within and across blocks;
//     no diff is 0; every time is within [time_min, time_max] (so within the
//     description); the first key is key_min, the last key is key_max, the
//     observed time range and payload bytes equal the stats.
// Every failure is a Corruption error whose message starts with
// "part <name>: ".
//
// Thread-safety: the functions are pure; BlockBuilder, DecodedBlock,
// BlockCompressor and BlockDecompressor are single-threaded value types.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/update.h"

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace tidemark {

// What a part holds, recorded in its footer and checked against the data.
// For an empty part every field is zero or empty.
struct PartStats {
  std::string key_min, key_max;  // the first and the last key
  Time time_min = 0, time_max = 0;
  std::uint64_t count = 0;
  // Sum of update_payload_bytes over the updates: the uncompressed payload.
  std::uint64_t bytes = 0;

  bool operator==(const PartStats&) const = default;
};

inline constexpr std::string_view kPartMagic = "TDMPART1";
inline constexpr std::uint32_t kPartFormatVersion = 1;
inline constexpr std::uint64_t kPartHeaderBytes = 12;
inline constexpr std::uint64_t kPartTrailerBytes = 32;
// The largest PartOptions::block_bytes: a block of more than one update
// holds at most this much payload (update_payload_bytes, at least 16 bytes
// an update), so at most kMaxBlockBytesOption / 16 updates.
inline constexpr std::size_t kMaxBlockBytesOption = std::size_t{64} << 20;
// A block never decompresses to more than this (1 GiB), whatever its
// index says; the writer refuses updates that would need more.
inline constexpr std::uint64_t kMaxBlockUncompressedBytes = std::uint64_t{1} << 30;
// zstd cannot expand more than ~32768x (a 128 KiB block costs >= 4 bytes);
// an index claiming more is corrupt and is refused before allocating.
inline constexpr std::uint64_t kMaxCompressionRatio = 65536;
// The smallest encoded update: four one-byte varints.
inline constexpr std::uint64_t kMinEncodedUpdateBytes = 4;

// The payload an update adds to a block and to PartStats::bytes: its key
// and value bytes plus 8 for the time and 8 for the diff.
inline std::uint64_t update_payload_bytes(UpdateView update) {
  return update.key.size() + update.value.size() + 16;
}

// The most uncompressed bytes a block of `count` updates with `payload`
// bytes of update_payload_bytes can take: each update's two lengths (at most
// 5 bytes each), time delta and diff (at most 10 each) replace its 16 bytes
// of time and diff, and the count takes at most 10.
inline std::uint64_t max_block_length(std::uint64_t payload, std::uint64_t count) {
  return payload + 14 * count + 10;
}

// The memory a DecodedBlock of `count` updates in `uncompressed_length`
// bytes holds: the bytes plus, per update, two u32 offsets, a time and a
// diff.
inline std::uint64_t decoded_block_bytes(std::uint64_t uncompressed_length, std::uint64_t count) {
  return uncompressed_length + 24 * count;
}

// "part <name>: <detail>" as a Corruption error.
std::unexpected<Error> part_corruption(std::string_view part_name, std::string_view detail);

// xxh3-64 of `bytes`: the checksum of blocks and footers.
std::uint64_t part_checksum(std::string_view bytes);

// Frees `buffer` when its capacity is far beyond `needed` (over 1 MiB and
// over 4x), so that one huge update does not pin its memory for the rest of
// a stream, while ordinary blocks keep reusing their buffers.
void release_oversized(std::string& buffer, std::size_t needed);

// Where one block lives and what it holds.
struct BlockHandle {
  std::uint64_t offset = 0;
  std::uint64_t compressed_length = 0;
  std::uint64_t uncompressed_length = 0;
  std::uint64_t count = 0;
  std::uint64_t checksum = 0;

  bool operator==(const BlockHandle&) const = default;
};

struct PartFooter {
  Description inline_desc;
  PartStats stats;
  std::vector<BlockHandle> blocks;

  bool operator==(const PartFooter&) const = default;
};

struct PartTrailer {
  std::uint64_t footer_offset = 0;
  std::uint32_t footer_length = 0;
  std::uint32_t version = kPartFormatVersion;
  std::uint64_t footer_checksum = 0;
};

void encode_part_header(std::string* out);
// Checks the first kPartHeaderBytes of the object: magic and version.
[[nodiscard]] Status check_part_header(std::string_view part_name, std::string_view header);

void encode_part_footer(const PartFooter& footer, std::string* out);
// Parses footer bytes (already checksummed). Only the syntax: lengths and
// varints in bounds, tags known, nothing left over. The block count is
// bounded by the bytes present, so a corrupt count cannot allocate much.
[[nodiscard]] Result<PartFooter> decode_part_footer(std::string_view part_name,
                                                    std::string_view footer);
// The semantic footer checks listed above that need no block data. The
// blocks must end at `footer_offset`.
[[nodiscard]] Status check_part_footer(std::string_view part_name, const PartFooter& footer,
                                       std::uint64_t footer_offset);

void encode_part_trailer(const PartTrailer& trailer, std::string* out);
// Parses the last kPartTrailerBytes of the object; checks magic and version.
[[nodiscard]] Result<PartTrailer> decode_part_trailer(std::string_view part_name,
                                                      std::string_view trailer);

class BlockCompressor;

// Accumulates the columns of one block. Checks nothing: PartWriter enforces
// the order and the bounds (tests use this directly to craft bad blocks).
class BlockBuilder {
 public:
  // With `value_buffer` (holding exactly update.value) into an empty block,
  // that buffer becomes the value column instead of being copied: the
  // caller gets the column's old buffer back, empty.
  void add(UpdateView update, std::string* value_buffer = nullptr);
  bool empty() const { return count_ == 0; }
  std::uint64_t count() const { return count_; }
  // Sum of update_payload_bytes of the updates added.
  std::uint64_t payload_bytes() const { return payload_bytes_; }
  // The size finish() will append, less at most 10 bytes for the count.
  std::uint64_t encoded_bytes() const;
  // The last update added, viewing the columns. REQUIRES: !empty(). Valid
  // until the next add() or finish.
  UpdateView last() const {
    return UpdateView{std::string_view(keys_).substr(keys_.size() - last_key_length_),
                      std::string_view(values_).substr(values_.size() - last_value_length_),
                      previous_time_, last_diff_};
  }
  // Appends the uncompressed block to `out` and empties the builder,
  // keeping its buffers' capacity for the next block.
  void finish(std::string* out);
  // Compresses the block straight from its columns into one frame appended
  // to `out` (the block is never concatenated: a huge update is not held
  // twice) and empties the builder; returns the uncompressed length. A
  // column's capacity is kept for the next block unless release_oversized
  // (below) finds it far beyond `block_bytes`.
  [[nodiscard]] Result<std::uint64_t> finish_compressed(BlockCompressor& compressor,
                                                        std::size_t block_bytes, std::string* out);

 private:
  void reset();

  std::string key_lengths_, keys_, value_lengths_, values_, time_deltas_, diffs_;
  Time previous_time_ = 0;
  Diff last_diff_ = 0;
  std::size_t last_key_length_ = 0, last_value_length_ = 0;
  std::uint64_t count_ = 0;
  std::uint64_t payload_bytes_ = 0;
};

// One decompressed block decoded into columns, so that each update is
// O(1) string_views into bytes(). Buffers keep their capacity across
// blocks: a reader allocates only for a block larger than any before it.
class DecodedBlock {
 public:
  // The decompressed block; the caller fills it, then calls decode().
  std::string& bytes() { return bytes_; }

  // Parses bytes() as a block of `expected_count` updates (block number
  // `block_index` in messages). On error the block is empty.
  [[nodiscard]] Status decode(std::string_view part_name, std::size_t block_index,
                              std::uint64_t expected_count);
  void clear() { count_ = 0; }

  std::size_t count() const { return count_; }
  // REQUIRES: i < count(). Valid until the next decode() or clear().
  UpdateView at(std::size_t i) const {
    const char* data = bytes_.data();
    return UpdateView{std::string_view(data + keys_base_ + key_offsets_[i],
                                       key_offsets_[i + 1] - key_offsets_[i]),
                      std::string_view(data + values_base_ + value_offsets_[i],
                                       value_offsets_[i + 1] - value_offsets_[i]),
                      times_[i], diffs_[i]};
  }
  // Sum of update_payload_bytes over the block.
  std::uint64_t payload_bytes() const { return payload_bytes_; }

 private:
  std::string bytes_;
  // count + 1 offsets relative to keys_base_ / values_base_.
  std::vector<std::uint32_t> key_offsets_, value_offsets_;
  std::vector<Time> times_;
  std::vector<Diff> diffs_;
  std::size_t keys_base_ = 0, values_base_ = 0;
  std::size_t count_ = 0;
  std::uint64_t payload_bytes_ = 0;
};

struct ZstdCompressContextDeleter {
  void operator()(ZSTD_CCtx_s* context) const;
};
struct ZstdDecompressContextDeleter {
  void operator()(ZSTD_DCtx_s* context) const;
};

// Compresses blocks at one zstd level. The zstd context is the calling
// thread's, kept between calls: a context per writer cost a fresh workspace
// (its allocation and page faults) for every part, most of zstd's time for
// the small parts of single-record appends. Memory: each thread that
// compresses keeps one context of at most kMaxCachedCompressContextBytes
// (about 0.5 MiB at level 1 for 64 KiB blocks, 1.4 MiB at most at level 1);
// a context that grew past that (a high level, a huge block) is freed when
// its call returns.
class BlockCompressor {
 public:
  static constexpr std::size_t kMaxCachedCompressContextBytes = 2 << 20;
  // REQUIRES: valid_level(level).
  explicit BlockCompressor(int level) : level_(level) {}
  static bool valid_level(int level);
  // The bytes of the calling thread's cached context; 0 when it has none.
  static std::size_t thread_context_bytes();
  // Appends one zstd frame (with its content size) of `uncompressed` to
  // `out`. Fails only when zstd cannot allocate.
  [[nodiscard]] Status compress(std::string_view uncompressed, std::string* out);
  // The same for the concatenation of `pieces`, streamed into the frame
  // without concatenating them first.
  [[nodiscard]] Status compress(std::span<const std::string_view> pieces, std::string* out);

 private:
  int level_;
};

// One zstd decompression context, reused for every block of a reader.
class BlockDecompressor {
 public:
  // Decompresses block `block_index` (already checksummed) into `out`,
  // replacing its contents. Refuses a frame that is not exactly
  // `compressed`, whose content size is absent or differs from
  // handle.uncompressed_length, or that zstd rejects.
  [[nodiscard]] Status decompress(std::string_view part_name, std::size_t block_index,
                                  const BlockHandle& handle, std::string_view compressed,
                                  std::string* out);
  // Decompression contexts are per thread, not per decompressor: a merge
  // or a snapshot holds hundreds of parts open, a context costs about
  // 160 KiB (literal buffer, entropy tables), and single-shot decompression
  // keeps nothing between calls. Memory: one context per thread that reads.
};

}  // namespace tidemark
