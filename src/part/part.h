// PartWriter and PartReader: build one immutable part, and stream one back.
//
// A part (layout in part/part_format.h) holds updates sorted strictly by
// (key, value, time), consolidated, with diff != 0 and every time inside the
// part's inline description. The writer enforces that on the way in; the
// reader checks it again on the way out, together with every checksum and
// every recorded size and stat, so that a damaged or hostile object yields a
// Corruption error naming the part ("part <name>: ...") and never a crash,
// an unbounded allocation or data different from what was written.
//
// Memory: the writer holds the whole encoded part (it returns it as one
// string) plus the open block's columns, from which the block is compressed
// straight into the part (never concatenated first); its order check reads
// the last update in those columns, so an update is held once, not copied.
// The reader holds one decoded block (its bytes and column arrays), the
// block index (about 40 bytes a block) and at most kOpenFetchBytes of the
// object's tail fetched by open(); while it loads the next block, also that
// block compressed and a copy of the last update before it (for the order
// check), both released once the block is checked. Buffers are reused across
// blocks; one far larger than the current block (after a huge update) is
// released. So a block holding one huge update costs about that update once
// between loads, and up to about three times while the next one loads.
//
// Thread-safety: PartWriter and PartReader are single-threaded; distinct
// instances are independent.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "part/part_format.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/location.h"
#include "tidemark/update.h"

namespace tidemark {

struct PartOptions {
  // A block is cut before an update would bring its payload
  // (update_payload_bytes) past this; an update bigger than this is a block
  // of its own. REQUIRES: 1 <= block_bytes <= kMaxBlockBytesOption.
  std::size_t block_bytes = 64 * 1024;
  // REQUIRES: within zstd's levels (ZSTD_minCLevel() .. ZSTD_maxCLevel()).
  int zstd_level = 1;
};

// Builds one part in memory.
class PartWriter {
 public:
  // An invalid description (upper < lower) or options make every call fail
  // with InvalidUsage.
  explicit PartWriter(Description inline_desc, PartOptions options = {});
  PartWriter(PartWriter&&) noexcept = default;
  PartWriter& operator=(PartWriter&&) noexcept = default;
  PartWriter(const PartWriter&) = delete;
  PartWriter& operator=(const PartWriter&) = delete;

  // REQUIRES: updates in strictly increasing (key, value, time) order
  // (equal triples already consolidated), diff != 0, and the time within the
  // inline description (lower <= time < upper). A violation is
  // InvalidUsage, and afterwards every call fails: a part is never built
  // from input that broke the contract.
  [[nodiscard]] Status add(UpdateView update) { return add_update(update, nullptr); }
  // The same for the update (key, *value, time, diff), the value being the
  // caller's buffer: when the update is a block of its own (over
  // block_bytes), that buffer becomes the block's value column instead of
  // being copied, and *value is left empty; otherwise it is left as it was.
  [[nodiscard]] Status add(std::string_view key, std::string* value, Time time, Diff diff) {
    return add_update(UpdateView{key, *value, time, diff}, value);
  }

  // Approximate size of the part so far: the finished blocks compressed plus
  // the open block uncompressed. For cutting parts at a target size.
  std::uint64_t encoded_bytes_so_far() const;
  std::uint64_t count() const { return stats_.count; }
  const PartStats& stats() const { return stats_; }

  // The encoded object. Afterwards every call fails.
  [[nodiscard]] Result<std::string> finish();

 private:
  [[nodiscard]] Status add_update(UpdateView update, std::string* value_buffer);
  std::unexpected<Error> fail(std::string message);
  [[nodiscard]] Status flush_block();

  Description inline_desc_;
  PartOptions options_;
  std::optional<Error> error_;  // set once add() or finish() failed
  bool finished_ = false;
  BlockBuilder block_;
  BlockCompressor compressor_;
  std::string out_;  // header and finished blocks
  std::vector<BlockHandle> blocks_;
  PartStats stats_;
};

// Streams a part block by block, fetching byte ranges on demand.
class PartReader {
 public:
  // Bytes [offset, offset + length) of the object. An error is passed
  // through unchanged; a result of another length is Corruption.
  using FetchRange = std::function<Result<std::string>(std::uint64_t offset, std::uint64_t length)>;

  // open() fetches this much of the object's end at once, hoping to find
  // the whole footer in it (and the whole object, when it is this small).
  static constexpr std::uint64_t kOpenFetchBytes = 64 * 1024;

  // Reads and validates the trailer and the footer of the object of `size`
  // bytes; `name` (usually the blob key) prefixes every error message.
  [[nodiscard]] static Result<PartReader> open(std::string name, std::uint64_t size,
                                               FetchRange fetch);
  // Fetches through blob.get_range(key, ...). REQUIRES: `blob` outlives the
  // reader.
  [[nodiscard]] static Result<PartReader> open_blob(Blob& blob, std::string key,
                                                    std::uint64_t size);
  // The whole object already in memory (tests, small parts).
  [[nodiscard]] static Result<PartReader> from_bytes(std::string name, std::string bytes);
  // The same, sharing the bytes (an inline part: PartRef::data).
  [[nodiscard]] static Result<PartReader> from_shared(std::string name,
                                                      std::shared_ptr<const std::string> bytes);

  PartReader(PartReader&&) noexcept = default;
  PartReader& operator=(PartReader&&) noexcept = default;
  PartReader(const PartReader&) = delete;
  PartReader& operator=(const PartReader&) = delete;

  const std::string& name() const { return name_; }
  const Description& inline_desc() const { return footer_.inline_desc; }
  const PartStats& stats() const { return footer_.stats; }
  std::size_t block_count() const { return footer_.blocks.size(); }
  // decoded_block_bytes of the part's largest block, from its index: what
  // reading the part holds between block loads (less the small tail).
  std::uint64_t largest_decoded_block_bytes() const;
  // decoded_block_bytes of the block the next call to next() loads once the
  // current one is used up; 0 when there is none.
  std::uint64_t next_block_decoded_bytes() const;
  // The next call to next() loads a block (or ends): the current one is
  // used up, or none is loaded yet.
  bool block_used_up() const { return position_ >= block_.count(); }

  // The next update in (key, value, time) order, or nullopt at the end. The
  // view stays valid until the next call to next() (or until the reader is
  // moved or destroyed). Corruption is sticky:
  // after one, every call returns it. Any other error (a failed fetch)
  // leaves the reader where it was, so next() may be retried.
  [[nodiscard]] Result<std::optional<UpdateView>> next() {
    if (position_ < block_.count()) [[likely]] {
      return std::optional<UpdateView>(block_.at(position_++));
    }
    return next_block();
  }

 private:
  PartReader() = default;
  [[nodiscard]] Status read_footer();
  [[nodiscard]] Result<std::optional<UpdateView>> next_block();
  [[nodiscard]] Status load_block(std::size_t index);
  [[nodiscard]] Status check_block(std::size_t index);
  [[nodiscard]] Result<std::string> fetch_exact(std::uint64_t offset, std::uint64_t length);

  std::string name_;
  std::uint64_t size_ = 0;
  FetchRange fetch_;
  PartFooter footer_;
  bool header_checked_ = false;
  // Bytes [tail_offset_, tail_offset_ + tail_.size()) of the object, kept
  // from open(): the blocks inside it need no fetch.
  std::string tail_;
  std::uint64_t tail_offset_ = 0;

  BlockDecompressor decompressor_;
  std::string compressed_;  // the current block as fetched
  DecodedBlock block_;
  std::size_t position_ = 0;     // next update in block_
  std::size_t next_block_ = 0;   // next block to load
  std::optional<Error> failed_;  // sticky corruption

  // The last update of the previous block, for the order check across
  // blocks, and the totals checked against the stats at the last block.
  std::string previous_key_, previous_value_;
  Time previous_time_ = 0;
  Diff previous_diff_ = 0;
  Time observed_time_min_ = 0, observed_time_max_ = 0;
  std::uint64_t observed_bytes_ = 0;
};

// Decodes a whole part into owned updates (tests, tools).
[[nodiscard]] Result<std::vector<Update>> decode_part(std::string name, std::string bytes);

}  // namespace tidemark
