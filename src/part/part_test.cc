#include "part/part.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "location/forwarding.h"
#include "location/mem_blob.h"
#include "util/coding.h"
#include "util/try.h"

namespace tidemark {
namespace {

constexpr const char* kName = "shard/s/part/p1";

Description description(Time lower, std::optional<Time> upper, Time since = 0) {
  return Description{Frontier::at(lower), Frontier::from_optional(upper), Frontier::at(since)};
}

std::string random_bytes(std::mt19937_64& random, std::size_t length) {
  std::string bytes(length, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

// Sorted, consolidated updates with times in [10, 10 + time_span).
std::vector<Update> make_updates(std::size_t n, std::uint64_t seed, std::size_t key_length = 8,
                                 std::size_t value_length = 16, Time time_span = 100) {
  std::mt19937_64 random(seed);
  std::vector<Update> updates;
  for (std::size_t i = 0; i < n; ++i) {
    std::string key = random_bytes(random, 1 + random() % key_length);
    std::string value = random_bytes(random, random() % (value_length + 1));
    auto diff = static_cast<Diff>(random() % 7) - 3;
    updates.push_back(
        Update{std::move(key), std::move(value), 10 + random() % time_span, diff == 0 ? 1 : diff});
  }
  consolidate(updates);
  return updates;
}

Result<std::string> write_part(const Description& desc, const std::vector<Update>& updates,
                               PartOptions options = {}) {
  PartWriter writer(desc, options);
  for (const Update& update : updates) {
    TM_TRY(writer.add(UpdateView{update.key, update.value, update.time, update.diff}));
  }
  return writer.finish();
}

std::string must_write(const Description& desc, const std::vector<Update>& updates,
                       PartOptions options = {}) {
  auto bytes = write_part(desc, updates, options);
  EXPECT_TRUE(bytes.has_value()) << bytes.error().to_string();
  return bytes.value_or("");
}

PartStats expected_stats(const std::vector<Update>& updates) {
  PartStats stats;
  if (updates.empty()) return stats;
  stats.key_min = updates.front().key;
  stats.key_max = updates.back().key;
  stats.time_min = stats.time_max = updates.front().time;
  for (const Update& update : updates) {
    stats.time_min = std::min(stats.time_min, update.time);
    stats.time_max = std::max(stats.time_max, update.time);
    stats.bytes += update.key.size() + update.value.size() + 16;
  }
  stats.count = updates.size();
  return stats;
}

template <typename T>
void expect_corruption(const Result<T>& result, std::string_view fragment = "") {
  ASSERT_FALSE(result.has_value()) << "expected corruption containing '" << fragment << "'";
  const Error& error = result.error();
  EXPECT_EQ(error.kind, ErrorKind::kCorruption) << error.to_string();
  EXPECT_TRUE(error.message.starts_with(std::string("part ") + kName + ": ")) << error.message;
  EXPECT_NE(error.message.find(fragment), std::string::npos)
      << "'" << error.message << "' lacks '" << fragment << "'";
}

// The pieces of an encoded part, to reassemble after tampering.
struct Pieces {
  PartFooter footer;
  std::vector<std::string> blocks;  // compressed
};

Pieces split(const std::string& bytes) {
  Pieces pieces;
  auto trailer = decode_part_trailer(kName, std::string_view(bytes).substr(bytes.size() - 32));
  EXPECT_TRUE(trailer.has_value());
  auto footer = decode_part_footer(
      kName, std::string_view(bytes).substr(trailer->footer_offset, trailer->footer_length));
  EXPECT_TRUE(footer.has_value());
  pieces.footer = *footer;
  for (const BlockHandle& block : footer->blocks) {
    pieces.blocks.push_back(bytes.substr(block.offset, block.compressed_length));
  }
  return pieces;
}

// Header, `blocks` back to back, `footer` as given, a valid trailer.
std::string assemble(const PartFooter& footer, const std::vector<std::string>& blocks) {
  std::string out;
  encode_part_header(&out);
  for (const std::string& block : blocks) out += block;
  PartTrailer trailer;
  trailer.footer_offset = out.size();
  encode_part_footer(footer, &out);
  trailer.footer_length = static_cast<std::uint32_t>(out.size() - trailer.footer_offset);
  trailer.footer_checksum = part_checksum(std::string_view(out).substr(trailer.footer_offset));
  encode_part_trailer(trailer, &out);
  return out;
}

// Rewrites offsets, compressed lengths and checksums to match `blocks`.
void reindex(PartFooter& footer, const std::vector<std::string>& blocks) {
  std::uint64_t offset = kPartHeaderBytes;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    footer.blocks[i].offset = offset;
    footer.blocks[i].compressed_length = blocks[i].size();
    footer.blocks[i].checksum = part_checksum(blocks[i]);
    offset += blocks[i].size();
  }
}

std::string compress(std::string_view uncompressed) {
  std::string out;
  BlockCompressor compressor(1);
  EXPECT_TRUE(compressor.compress(uncompressed, &out).has_value());
  return out;
}

// A part with exactly these blocks and stats, however wrong they are.
std::string craft(const Description& desc, const PartStats& stats,
                  const std::vector<std::vector<Update>>& block_updates) {
  PartFooter footer{desc, stats, {}};
  std::vector<std::string> blocks;
  for (const auto& updates : block_updates) {
    BlockBuilder builder;
    for (const Update& u : updates) builder.add(UpdateView{u.key, u.value, u.time, u.diff});
    std::string uncompressed;
    builder.finish(&uncompressed);
    blocks.push_back(compress(uncompressed));
    footer.blocks.push_back(BlockHandle{0, 0, uncompressed.size(), updates.size(), 0});
  }
  reindex(footer, blocks);
  return assemble(footer, blocks);
}

std::vector<Update> read_all(PartReader& reader) {
  std::vector<Update> out;
  while (true) {
    auto next = reader.next();
    EXPECT_TRUE(next.has_value()) << next.error().to_string();
    if (!next || !*next) return out;
    out.push_back((*next)->to_owned());
  }
}

// Round trips --------------------------------------------------------------

TEST(PartTest, EmptyPartRoundTrips) {
  const std::string bytes = must_write(description(0, 10), {});
  EXPECT_LT(bytes.size(), 64u);
  auto reader = PartReader::from_bytes(kName, bytes);
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  EXPECT_EQ(reader->block_count(), 0u);
  EXPECT_EQ(reader->stats(), PartStats{});
  EXPECT_EQ(reader->inline_desc(), description(0, 10));
  auto next = reader->next();
  ASSERT_TRUE(next.has_value());
  EXPECT_FALSE(next->has_value());
  // The end is sticky.
  EXPECT_FALSE(reader->next()->has_value());
}

TEST(PartTest, EmptyIntervalAndClosedLowerHoldNoData) {
  const Description closed{Frontier::closed(), Frontier::closed(), Frontier::at(3)};
  auto updates = decode_part(kName, must_write(closed, {}));
  ASSERT_TRUE(updates.has_value()) << updates.error().to_string();
  EXPECT_TRUE(updates->empty());
  PartWriter writer(closed);
  EXPECT_TRUE(writer.add(UpdateView{"k", "v", 5, 1}).error().is(ErrorKind::kInvalidUsage));
}

TEST(PartTest, OneUpdateRoundTrips) {
  const std::vector<Update> updates = {{"key", "value", 7, -2}};
  const std::string bytes = must_write(description(5, 8, 2), updates);
  auto reader = PartReader::from_bytes(kName, bytes);
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  EXPECT_EQ(reader->block_count(), 1u);
  EXPECT_EQ(reader->inline_desc(), description(5, 8, 2));
  EXPECT_EQ(reader->stats(), expected_stats(updates));
  EXPECT_EQ(read_all(*reader), updates);
}

TEST(PartTest, ACarryRoundTrips) {
  // A total of 2 * i64::MAX + 3 for one (key, value, time) (update.h).
  const std::vector<Update> updates = {
      {"a", "v", 7, INT64_MAX}, {"a", "v", 7, INT64_MAX}, {"a", "v", 7, 3}, {"b", "v", 7, 1}};
  const std::string bytes = must_write(description(5, 8), updates);
  auto reader = PartReader::from_bytes(kName, bytes);
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  EXPECT_EQ(read_all(*reader), updates);
}

TEST(PartTest, ManyBlocksRoundTrip) {
  const auto updates = make_updates(5000, 1);
  PartOptions options;
  options.block_bytes = 300;
  PartWriter writer(description(0, 200), options);
  for (const Update& u : updates) {
    ASSERT_TRUE(writer.add(UpdateView{u.key, u.value, u.time, u.diff}).has_value());
  }
  EXPECT_EQ(writer.count(), updates.size());
  EXPECT_EQ(writer.stats(), expected_stats(updates));
  EXPECT_GT(writer.encoded_bytes_so_far(), 0u);
  auto bytes = writer.finish();
  ASSERT_TRUE(bytes.has_value());
  auto reader = PartReader::from_bytes(kName, *bytes);
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  EXPECT_GT(reader->block_count(), 100u);
  EXPECT_EQ(reader->stats(), expected_stats(updates));
  EXPECT_EQ(read_all(*reader), updates);
  // Writer calls after finish fail.
  EXPECT_FALSE(writer.finish().has_value());
  EXPECT_FALSE(writer.add(UpdateView{"zzz", "", 1, 1}).has_value());
}

TEST(PartTest, BlocksRespectBlockBytes) {
  const auto updates = make_updates(2000, 2, 20, 40);
  PartOptions options;
  options.block_bytes = 1000;
  const std::string bytes = must_write(description(0, 200), updates, options);
  const Pieces pieces = split(bytes);
  std::size_t first = 0;
  for (const BlockHandle& block : pieces.footer.blocks) {
    std::uint64_t payload = 0;
    for (std::size_t i = first; i < first + block.count; ++i) {
      payload += updates[i].key.size() + updates[i].value.size() + 16;
    }
    EXPECT_LE(payload, options.block_bytes);
    // Cut only when the next update would not fit.
    if (first + block.count < updates.size()) {
      const Update& next = updates[first + block.count];
      EXPECT_GT(payload + next.key.size() + next.value.size() + 16, options.block_bytes);
    }
    first += block.count;
  }
  EXPECT_EQ(first, updates.size());
}

TEST(PartTest, HugeValueRoundTrips) {
  std::mt19937_64 random(3);
  std::string huge(16 << 20, 'x');
  for (std::size_t i = 0; i < huge.size(); i += 4096) huge[i] = static_cast<char>(random());
  const std::vector<Update> updates = {{"a", "small", 1, 1},
                                       {"b", huge, 2, 3},
                                       {"c", std::string(1 << 20, '\0'), 2, 1},
                                       {"d", "small", 3, -1}};
  const std::string bytes = must_write(description(0, 10), updates);
  EXPECT_LT(bytes.size(), 2u << 20);  // compressible
  auto reader = PartReader::from_bytes(kName, bytes);
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  // An update bigger than block_bytes is a block of its own, and no small
  // neighbour fits beside it.
  EXPECT_EQ(reader->block_count(), 4u);
  EXPECT_EQ(read_all(*reader), updates);
}

TEST(PartTest, BinaryKeysAndValuesWithNuls) {
  std::vector<Update> updates = {{std::string("\0", 1), std::string("\0\0", 2), 1, 1},
                                 {std::string("\0\0", 2), "", 1, 1},
                                 {std::string("a\0b", 3), std::string("\xff\0", 2), 1, 1},
                                 {std::string("a\0b", 3), std::string("\xff\0", 2), 2, -1},
                                 {"\xff\xfe", std::string(1000, '\0'), 3, 5}};
  consolidate(updates);
  auto decoded = decode_part(kName, must_write(description(1, 4), updates));
  ASSERT_TRUE(decoded.has_value()) << decoded.error().to_string();
  EXPECT_EQ(*decoded, updates);
}

TEST(PartTest, ClosedUpperAndExtremeTimes) {
  const Time max = std::numeric_limits<Time>::max();
  const std::vector<Update> updates = {{"k", "a", 0, std::numeric_limits<Diff>::min()},
                                       {"k", "a", max, std::numeric_limits<Diff>::max()},
                                       {"k", "b", 1, 1}};
  const Description desc{Frontier::at(0), Frontier::closed(), Frontier::at(max)};
  auto reader = PartReader::from_bytes(kName, must_write(desc, updates));
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  EXPECT_EQ(reader->inline_desc(), desc);
  EXPECT_EQ(reader->stats().time_min, 0u);
  EXPECT_EQ(reader->stats().time_max, max);
  EXPECT_EQ(read_all(*reader), updates);
}

TEST(PartTest, StatsAreCorrect) {
  const auto updates = make_updates(777, 4, 12, 30, 50);
  PartOptions options;
  options.block_bytes = 2048;
  PartWriter writer(description(10, 60), options);
  for (const Update& u : updates) {
    ASSERT_TRUE(writer.add(UpdateView{u.key, u.value, u.time, u.diff}).has_value());
  }
  EXPECT_EQ(writer.stats(), expected_stats(updates));
  auto bytes = writer.finish();
  ASSERT_TRUE(bytes.has_value());
  auto reader = PartReader::from_bytes(kName, *bytes);
  ASSERT_TRUE(reader.has_value());
  EXPECT_EQ(reader->stats(), expected_stats(updates));
}

TEST(PartTest, CompressionLevelsRoundTrip) {
  const auto updates = make_updates(500, 5);
  for (int level : {-5, 1, 3, 19}) {
    PartOptions options;
    options.zstd_level = level;
    auto decoded = decode_part(kName, must_write(description(0, 200), updates, options));
    ASSERT_TRUE(decoded.has_value());
    EXPECT_EQ(*decoded, updates) << "level " << level;
  }
}

// Writer contract ------------------------------------------------------------

void expect_rejected(const std::vector<Update>& updates, std::string_view fragment) {
  PartWriter writer(description(10, 20));
  Status status;
  for (const Update& u : updates) {
    status = writer.add(UpdateView{u.key, u.value, u.time, u.diff});
    if (!status) break;
  }
  ASSERT_FALSE(status.has_value()) << fragment;
  EXPECT_TRUE(status.error().is(ErrorKind::kInvalidUsage));
  EXPECT_NE(status.error().message.find(fragment), std::string::npos) << status.error().message;
  // The writer is unusable afterwards, even for valid input.
  EXPECT_FALSE(writer.add(UpdateView{"\xff\xff\xff", "", 15, 1}).has_value());
  auto finished = writer.finish();
  ASSERT_FALSE(finished.has_value());
  EXPECT_TRUE(finished.error().is(ErrorKind::kInvalidUsage));
}

TEST(PartWriterTest, RejectsBrokenContract) {
  expect_rejected({{"b", "v", 11, 1}, {"a", "v", 11, 1}}, "order");
  expect_rejected({{"a", "w", 11, 1}, {"a", "v", 11, 1}}, "order");
  expect_rejected({{"a", "v", 12, 1}, {"a", "v", 11, 1}}, "order");
  expect_rejected({{"a", "v", 11, 1}, {"a", "v", 11, 2}}, "repeats");
  // A repeat is a carry (update.h) only after a saturated diff of its sign.
  expect_rejected({{"a", "v", 11, INT64_MAX}, {"a", "v", 11, -1}}, "repeats");
  expect_rejected({{"a", "v", 11, INT64_MAX - 1}, {"a", "v", 11, 1}}, "repeats");
  expect_rejected({{"a", "v", 11, INT64_MIN}, {"a", "v", 11, 1}}, "repeats");
  expect_rejected({{"a", "v", 11, 0}}, "diff 0");
  expect_rejected({{"a", "v", 9, 1}}, "outside");
  expect_rejected({{"a", "v", 20, 1}}, "outside");
  expect_rejected({{"a", "v", 11, 1}, {"b", "v", 25, 1}}, "outside");
}

TEST(PartWriterTest, ChecksOrderAgainstAnUpdateThatIsABlockOfItsOwn) {
  // The last update, read back from the open block's columns, is the whole
  // block when it exceeds block_bytes.
  const std::string big(100 << 10, 'v');
  expect_rejected({{"a", big, 11, 1}, {"a", big, 11, 1}}, "repeats");
  expect_rejected({{"a", big + "w", 11, 1}, {"a", big, 12, 1}}, "order");
  expect_rejected({{"a", "v", 11, 1}, {"b", big, 12, 1}, {"a", "w", 13, 1}}, "order");
}

TEST(PartWriterTest, TakesTheBufferOfAValueThatIsABlockOfItsOwn) {
  PartOptions options;
  options.block_bytes = 1024;
  PartWriter writer(description(0, 10), options);
  std::string small = "small";
  std::string big(1 << 20, 'b');
  big[12345] = 'x';
  const std::string big_copy = big;
  std::string after = "after";
  ASSERT_TRUE(writer.add("a", &small, 1, 1));
  EXPECT_EQ(small, "small");  // copied: it shares its block
  ASSERT_TRUE(writer.add("b", &big, 2, -2));
  EXPECT_TRUE(big.empty());  // taken, not copied
  ASSERT_TRUE(writer.add("c", &after, 3, 1));
  EXPECT_EQ(after, "after");
  // A taken buffer is still checked against: the next update must follow it.
  std::string same = big_copy;
  PartWriter second(description(0, 10), options);
  ASSERT_TRUE(second.add("b", &same, 2, 1));
  EXPECT_TRUE(second.add(UpdateView{"b", big_copy, 2, 1}).error().is(ErrorKind::kInvalidUsage));

  auto bytes = writer.finish();
  ASSERT_TRUE(bytes) << bytes.error().to_string();
  auto reader = PartReader::from_bytes(kName, *bytes);
  ASSERT_TRUE(reader) << reader.error().to_string();
  const std::vector<Update> expected = {
      {"a", "small", 1, 1}, {"b", big_copy, 2, -2}, {"c", "after", 3, 1}};
  EXPECT_EQ(read_all(*reader), expected);
}

TEST(PartWriterTest, RejectsBadConfiguration) {
  const Description backwards = description(10, 5);
  PartOptions zero_blocks;
  zero_blocks.block_bytes = 0;
  PartOptions bad_level;
  bad_level.zstd_level = 1000;
  for (auto [desc, options] :
       {std::pair{backwards, PartOptions{}}, std::pair{description(0, 5), zero_blocks},
        std::pair{description(0, 5), bad_level}}) {
    PartWriter writer(desc, options);
    EXPECT_TRUE(writer.add(UpdateView{"a", "", 1, 1}).error().is(ErrorKind::kInvalidUsage));
    EXPECT_TRUE(writer.finish().error().is(ErrorKind::kInvalidUsage));
  }
}

// Streaming reads -------------------------------------------------------------

TEST(PartReaderTest, ReadingOneUpdateFetchesLittle) {
  // About 4 MiB of incompressible values in 64 KiB blocks.
  std::mt19937_64 random(6);
  std::vector<Update> updates;
  for (int i = 0; i < 4096; ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "key%06d", i);
    updates.push_back(Update{key, random_bytes(random, 1000), 1, 1});
  }
  const std::string bytes = must_write(description(0, 2), updates);
  ASSERT_GT(bytes.size(), 4'000'000u);

  std::uint64_t fetched = 0;
  int fetches = 0;
  auto fetch = [&](std::uint64_t offset, std::uint64_t length) -> Result<std::string> {
    fetched += length;
    ++fetches;
    return bytes.substr(offset, length);
  };
  auto reader = PartReader::open(kName, bytes.size(), fetch);
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  EXPECT_GT(reader->block_count(), 60u);
  EXPECT_EQ(fetches, 1);  // the footer fits in the tail fetch
  auto first = reader->next();
  ASSERT_TRUE(first.has_value() && first->has_value());
  EXPECT_EQ((*first)->to_owned(), updates[0]);
  EXPECT_LT(fetched, 200u * 1024) << "of " << bytes.size();
  EXPECT_EQ(fetches, 2);

  // Streaming the rest fetches each byte about once.
  std::size_t n = 1;
  while (true) {
    auto next = reader->next();
    ASSERT_TRUE(next.has_value());
    if (!*next) break;
    ASSERT_EQ((*next)->to_owned(), updates[n]);
    ++n;
  }
  EXPECT_EQ(n, updates.size());
  EXPECT_LT(fetched, bytes.size() + 2 * PartReader::kOpenFetchBytes);
}

TEST(PartReaderTest, LargeFooterIsFetchedSeparately) {
  const auto updates = make_updates(20000, 7);
  PartOptions options;
  options.block_bytes = 20;  // one update a block: a footer over 64 KiB
  const std::string bytes = must_write(description(0, 200), updates, options);
  int fetches = 0;
  auto reader =
      PartReader::open(kName, bytes.size(), [&](std::uint64_t offset, std::uint64_t length) {
        ++fetches;
        return Result<std::string>(bytes.substr(offset, length));
      });
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  EXPECT_EQ(fetches, 2);
  EXPECT_EQ(reader->block_count(), updates.size());
  EXPECT_EQ(read_all(*reader), updates);
}

// The in-memory backend, counting range reads and failing them on demand.
class MapBlob : public ForwardingBlob {
 public:
  MapBlob() : ForwardingBlob(std::make_shared<MemBlob>()) {}
  Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                std::uint64_t length) override {
    ++range_reads;
    if (fail_reads) return determinate("injected failure");
    return ForwardingBlob::get_range(key, offset, length);
  }
  int range_reads = 0;
  bool fail_reads = false;
};

TEST(PartReaderTest, OpensFromBlobAndRetriesFailedFetches) {
  const auto updates = make_updates(20000, 8, 10, 100);
  const std::string bytes = must_write(description(0, 200), updates);
  ASSERT_GT(bytes.size(), 2 * PartReader::kOpenFetchBytes);
  MapBlob blob;
  ASSERT_TRUE(blob.set(kName, bytes).has_value());
  auto reader = PartReader::open_blob(blob, kName, bytes.size());
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  EXPECT_EQ(blob.range_reads, 1);

  // A failed fetch is passed through and leaves the reader where it was.
  blob.fail_reads = true;
  auto failed = reader->next();
  ASSERT_FALSE(failed.has_value());
  EXPECT_TRUE(failed.error().is(ErrorKind::kDeterminate));
  blob.fail_reads = false;
  EXPECT_EQ(read_all(*reader), updates);

  // A missing object is NotFound, not corruption.
  auto missing = PartReader::open_blob(blob, "absent", bytes.size());
  ASSERT_FALSE(missing.has_value());
  EXPECT_TRUE(missing.error().is(ErrorKind::kNotFound));
}

// Corruption ------------------------------------------------------------------

// A few KiB, a dozen blocks.
std::vector<Update> small_updates() {
  return make_updates(150, 9, 6, 12);
}
PartOptions small_blocks() {
  PartOptions options;
  options.block_bytes = 400;
  return options;
}

TEST(PartCorruptionTest, EveryTruncationIsCorruption) {
  const std::string bytes = must_write(description(0, 200), small_updates(), small_blocks());
  ASSERT_GT(split(bytes).footer.blocks.size(), 5u);
  for (std::size_t length = 0; length < bytes.size(); ++length) {
    SCOPED_TRACE(length);
    expect_corruption(decode_part(kName, bytes.substr(0, length)));
  }
  // The caller claims the full size but the object is shorter.
  for (std::size_t length : {std::size_t{0}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string truncated = bytes.substr(0, length);
    auto reader =
        PartReader::open(kName, bytes.size(), [&](std::uint64_t offset, std::uint64_t count) {
          return Result<std::string>(offset >= truncated.size() ? std::string()
                                                                : truncated.substr(offset, count));
        });
    expect_corruption(reader, "fetched");
  }
}

// Flips `mask` into each byte in [0, size) with `stride` and decodes.
void flip_every_byte(const std::string& bytes, const std::vector<Update>& original,
                     std::size_t stride, std::uint8_t mask) {
  std::size_t flips = 0;
  for (std::size_t i = 0; i < bytes.size(); i += stride) {
    std::string damaged = bytes;
    damaged[i] = static_cast<char>(damaged[i] ^ mask);
    auto decoded = decode_part(kName, std::move(damaged));
    if (decoded.has_value()) {
      ADD_FAILURE() << "flip at " << i << " of " << bytes.size() << " went unnoticed"
                    << (*decoded == original ? "" : " AND CHANGED THE DATA");
      continue;
    }
    ASSERT_EQ(decoded.error().kind, ErrorKind::kCorruption) << decoded.error().to_string();
    ASSERT_TRUE(decoded.error().message.starts_with(std::string("part ") + kName + ": "))
        << decoded.error().message;
    ++flips;
  }
  EXPECT_GT(flips, 0u);
}

TEST(PartCorruptionTest, EveryFlippedByteIsCorruption) {
  const auto updates = small_updates();
  const std::string bytes = must_write(description(0, 200), updates, small_blocks());
  ASSERT_GT(split(bytes).footer.blocks.size(), 5u);
  for (std::uint8_t mask : {0x01, 0x80, 0xff}) flip_every_byte(bytes, updates, 1, mask);
}

TEST(PartCorruptionTest, FlippedBytesInALargerPartAreCorruption) {
  // Larger than the open() tail fetch, so the header travels with block 0.
  const auto updates = make_updates(5000, 10, 10, 40);
  const std::string bytes = must_write(description(0, 200), updates, PartOptions{4096, 1});
  ASSERT_GT(bytes.size(), 2 * PartReader::kOpenFetchBytes);
  flip_every_byte(bytes, updates, 401, 0x10);
  for (std::size_t i : {0, 3, 8, 11}) {  // header
    std::string damaged = bytes;
    damaged[i] ^= 1;
    expect_corruption(decode_part(kName, damaged), "header");
  }
}

TEST(PartCorruptionTest, UnsupportedVersion) {
  std::string bytes = must_write(description(0, 200), small_updates());
  std::string trailer_version = bytes;
  trailer_version[bytes.size() - 32 + 12] = 7;
  expect_corruption(decode_part(kName, trailer_version), "unsupported part version 7");
  std::string header_version = bytes;
  header_version[8] = 2;
  expect_corruption(decode_part(kName, header_version), "unsupported part version 2");
  std::string trailer_magic = bytes;
  trailer_magic.back() = '2';
  expect_corruption(decode_part(kName, trailer_magic), "trailer: bad magic");
}

TEST(PartCorruptionTest, FooterPlacement) {
  const std::string bytes = must_write(description(0, 200), small_updates(), small_blocks());
  const std::size_t trailer = bytes.size() - 32;
  for (auto [field, delta] : {std::pair{0, 1}, std::pair{0, -1}, std::pair{8, 1}, std::pair{8, -1},
                              std::pair{7, 0x80}, std::pair{11, 0x80}}) {
    std::string damaged = bytes;
    damaged[trailer + field] = static_cast<char>(damaged[trailer + field] + delta);
    expect_corruption(decode_part(kName, damaged), "footer");
  }
  std::string checksum = bytes;
  checksum[trailer + 16] ^= 1;
  expect_corruption(decode_part(kName, checksum), "footer checksum mismatch");
}

// Footers with a valid checksum but contents that do not match the data.
class PartFooterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    updates_ = small_updates();
    bytes_ = must_write(description(0, 200), updates_, small_blocks());
    pieces_ = split(bytes_);
    ASSERT_GT(pieces_.blocks.size(), 5u);
    // Reassembling untouched pieces gives back the same bytes.
    ASSERT_EQ(assemble(pieces_.footer, pieces_.blocks), bytes_);
  }
  // Decodes the part reassembled after `tamper` edits the pieces.
  template <typename Tamper>
  Result<std::vector<Update>> tampered(Tamper tamper) {
    Pieces pieces = pieces_;
    tamper(pieces);
    return decode_part(kName, assemble(pieces.footer, pieces.blocks));
  }
  std::vector<Update> updates_;
  std::string bytes_;
  Pieces pieces_;
};

TEST_F(PartFooterTest, BlockIndexOutOfOrder) {
  expect_corruption(tampered([](Pieces& p) { std::swap(p.footer.blocks[1], p.footer.blocks[2]); }),
                    "increasing order");
}

TEST_F(PartFooterTest, BlockIndexOverlapsOrLeavesGaps) {
  expect_corruption(tampered([](Pieces& p) { p.footer.blocks[2].offset -= 1; }), "overlaps");
  expect_corruption(tampered([](Pieces& p) { p.footer.blocks[2].offset += 1; }), "gap");
  expect_corruption(tampered([](Pieces& p) { p.footer.blocks[0].offset = 0; }), "overlaps");
  expect_corruption(tampered([](Pieces& p) { p.footer.blocks.back().compressed_length += 1; }),
                    "past the footer");
  expect_corruption(tampered([](Pieces& p) { p.footer.blocks.back().compressed_length -= 1; }),
                    "blocks end at");
  expect_corruption(tampered([](Pieces& p) { p.footer.blocks.pop_back(); }), "blocks end at");
  expect_corruption(tampered([](Pieces& p) { p.footer.blocks[3].compressed_length = 1ull << 62; }),
                    "past the footer");
}

TEST_F(PartFooterTest, SwappedBlocksWithConsistentIndex) {
  // Blocks 1 and 2 trade places; the index is rewritten to match, so only
  // the order check across blocks can notice.
  expect_corruption(tampered([](Pieces& p) {
                      std::swap(p.blocks[1], p.blocks[2]);
                      std::swap(p.footer.blocks[1], p.footer.blocks[2]);
                      reindex(p.footer, p.blocks);
                    }),
                    "block 2 update 0: out of (key, value, time) order");
}

TEST_F(PartFooterTest, CountsThatDoNotAddUp) {
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.count += 1; }), "sum to");
  expect_corruption(tampered([](Pieces& p) {
                      p.footer.blocks[0].count += 1;
                      p.footer.blocks[1].count -= 1;
                    }),
                    "block 0 holds");
  expect_corruption(tampered([](Pieces& p) {
                      p.footer.stats.count -= p.footer.blocks[4].count;
                      p.footer.blocks[4].count = 0;
                    }),
                    "block 4 has no updates");
  expect_corruption(tampered([](Pieces& p) {
                      p.footer.blocks[0].count = 1ull << 40;
                      p.footer.stats.count = 1ull << 41;
                      p.footer.stats.bytes = 1ull << 50;
                    }),
                    "updates in");
}

TEST_F(PartFooterTest, UncompressedLengths) {
  expect_corruption(tampered([](Pieces& p) { p.footer.blocks[1].uncompressed_length += 1; }),
                    "content size");
  expect_corruption(tampered([](Pieces& p) { p.footer.blocks[1].uncompressed_length -= 1; }),
                    "content size");
  // Refused from the index alone, before anything is allocated.
  expect_corruption(
      tampered([](Pieces& p) { p.footer.blocks[1].uncompressed_length = 3ull << 30; }),
      "implausible");
  expect_corruption(
      tampered([](Pieces& p) { p.footer.blocks[1].uncompressed_length = ~std::uint64_t{0}; }),
      "implausible");
  expect_corruption(tampered([](Pieces& p) {
                      p.footer.blocks[1].uncompressed_length =
                          p.footer.blocks[1].compressed_length * kMaxCompressionRatio + 1;
                    }),
                    "implausible");
}

// The decompression bomb: an 8 KiB part whose one block passed every
// footer and block check and decompressed to 67 million empty updates
// (268 MB of columns, 1.84 GB decoded). Its index alone is now refused,
// before anything is allocated: a block of several updates holds at most
// kMaxBlockBytesOption / 16 of them, and no block encodes to more than its
// payload allows.
TEST(PartFooterBoundsTest, ABlockClaimingMoreThanAWriterMakesIsRefusedFromTheIndex) {
  auto footer_of = [](std::uint64_t count, std::uint64_t payload, std::uint64_t uncompressed) {
    PartFooter footer;
    footer.inline_desc = description(0, 10);
    footer.stats.key_min = footer.stats.key_max = "";
    footer.stats.time_min = footer.stats.time_max = 1;
    footer.stats.count = count;
    footer.stats.bytes = payload;
    footer.blocks.push_back(BlockHandle{kPartHeaderBytes, 8192, uncompressed, count, 0});
    return footer;
  };
  const std::uint64_t footer_offset = kPartHeaderBytes + 8192;
  const std::uint64_t bomb = 67'000'000;
  auto many = check_part_footer(kName, footer_of(bomb, 16 * bomb, 4 * bomb), footer_offset);
  ASSERT_FALSE(many);
  EXPECT_EQ(many.error().kind, ErrorKind::kCorruption);
  EXPECT_NE(many.error().message.find("more than a block can hold"), std::string::npos)
      << many.error().message;
  // Three updates of 60 payload bytes cannot encode to 268 MB.
  auto large = check_part_footer(kName, footer_of(3, 60, 4 * bomb), footer_offset);
  ASSERT_FALSE(large);
  EXPECT_NE(large.error().message.find("encode to"), std::string::npos) << large.error().message;
  // The largest block a writer makes passes: kMaxBlockBytesOption of payload
  // in 16-byte updates.
  const std::uint64_t most = kMaxBlockBytesOption / 16;
  EXPECT_TRUE(check_part_footer(kName, footer_of(most, 16 * most, 30 * most), footer_offset))
      << "a block a writer can make was refused";
  // One update of half a gigabyte is a block of its own.
  auto huge = check_part_footer(kName, footer_of(1, 1ull << 29, 1ull << 29), footer_offset);
  EXPECT_TRUE(huge) << huge.error().message;
}

TEST_F(PartFooterTest, AnUncompressedLengthBeyondThePayloadIsRefused) {
  expect_corruption(tampered([](Pieces& p) {
                      p.footer.blocks[1].uncompressed_length =
                          max_block_length(p.footer.stats.bytes, p.footer.blocks[1].count) + 1;
                    }),
                    "encode to");
}

TEST_F(PartFooterTest, StatsThatDoNotMatchTheData) {
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.key_min += "x"; }), "key_min");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.key_min = ""; }), "key_min");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.key_max += "x"; }), "key_max");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.key_max = p.footer.stats.key_min; }),
                    "key_max");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.time_min += 1; }), "time");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.time_max -= 1; }), "time");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.time_min -= 1; }), "stats say");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.time_max += 1; }), "stats say");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.bytes += 1; }), "stats bytes");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.bytes -= 1; }), "stats bytes");
  expect_corruption(tampered([](Pieces& p) { p.footer.stats.bytes = 3; }), "too small");
  expect_corruption(
      tampered([](Pieces& p) { std::swap(p.footer.stats.time_min, p.footer.stats.time_max); }),
      "time_min");
}

TEST_F(PartFooterTest, DescriptionThatDoesNotCoverTheData) {
  expect_corruption(tampered([](Pieces& p) {
                      p.footer.inline_desc.upper = Frontier::at(p.footer.stats.time_max);
                    }),
                    "outside the inline description");
  expect_corruption(tampered([](Pieces& p) {
                      p.footer.inline_desc.lower = Frontier::at(p.footer.stats.time_min + 1);
                    }),
                    "outside the inline description");
  expect_corruption(tampered([](Pieces& p) { p.footer.inline_desc.lower = Frontier::at(300); }),
                    "upper < lower");
}

TEST_F(PartFooterTest, EmptyPartWithStats) {
  expect_corruption(tampered([](Pieces& p) {
                      p.blocks.clear();
                      p.footer.blocks.clear();
                      p.footer.stats.count = 0;
                    }),
                    "empty part");
}

TEST(PartFooterSyntaxTest, MalformedFooterBytes) {
  const std::string bytes = must_write(description(0, 200), small_updates(), small_blocks());
  const Pieces pieces = split(bytes);
  std::string footer;
  encode_part_footer(pieces.footer, &footer);
  std::string blocks = bytes.substr(
      kPartHeaderBytes, pieces.footer.blocks.back().offset +
                            pieces.footer.blocks.back().compressed_length - kPartHeaderBytes);
  // Reassembles with raw footer bytes, checksummed.
  auto with_footer = [&](const std::string& raw) {
    std::string out;
    encode_part_header(&out);
    out += blocks;
    PartTrailer trailer;
    trailer.footer_offset = out.size();
    out += raw;
    trailer.footer_length = static_cast<std::uint32_t>(raw.size());
    trailer.footer_checksum = part_checksum(raw);
    encode_part_trailer(trailer, &out);
    return out;
  };
  ASSERT_EQ(with_footer(footer), bytes);
  expect_corruption(decode_part(kName, with_footer(footer + "x")), "trailing bytes");
  for (std::size_t length = 0; length < footer.size(); ++length) {
    expect_corruption(decode_part(kName, with_footer(footer.substr(0, length))), "footer");
  }
  std::string bad_tag = footer;
  bad_tag[0] = 9;
  expect_corruption(decode_part(kName, with_footer(bad_tag)), "malformed inline description");
  // A varint that overflows u64, where the stats' time_min is.
  std::string overflow;
  Encoder encoder(&overflow);
  encoder.put_u8(0);
  encoder.put_varint(0);
  encoder.put_u8(1);
  encoder.put_u8(1);
  encoder.put_bytes("a");
  encoder.put_bytes("b");
  encoder.put_raw(std::string(10, '\xff'));
  expect_corruption(decode_part(kName, with_footer(overflow)), "malformed stats");
  // A huge block count is refused before allocating the index.
  std::string huge_count;
  Encoder huge(&huge_count);
  huge.put_u8(0);
  huge.put_varint(0);
  huge.put_u8(1);
  huge.put_u8(1);
  huge.put_bytes("");
  huge.put_bytes("");
  for (int i = 0; i < 4; ++i) huge.put_varint(0);
  huge.put_varint(1ull << 60);
  expect_corruption(decode_part(kName, with_footer(huge_count)), "does not fit");
}

// Blocks whose bytes pass the checksum but whose contents are wrong.
TEST(PartBlockTest, CraftedBadBlocks) {
  const Description desc = description(0, 100);
  auto stats_for = [](const std::vector<std::vector<Update>>& blocks) {
    std::vector<Update> all;
    for (const auto& block : blocks) all.insert(all.end(), block.begin(), block.end());
    PartStats stats = expected_stats(all);
    return stats;
  };
  auto check = [&](const std::vector<std::vector<Update>>& blocks, std::string_view fragment) {
    SCOPED_TRACE(fragment);
    expect_corruption(decode_part(kName, craft(desc, stats_for(blocks), blocks)), fragment);
  };
  // A sane crafted part decodes: the crafting itself is right.
  const std::vector<std::vector<Update>> good = {{{"a", "1", 1, 1}, {"b", "1", 1, 1}},
                                                 {{"c", "1", 2, 1}}};
  auto decoded = decode_part(kName, craft(desc, stats_for(good), good));
  ASSERT_TRUE(decoded.has_value()) << decoded.error().to_string();

  check({{{"a", "2", 1, 1}, {"a", "1", 1, 1}}}, "block 0 update 1: out of");
  check({{{"a", "1", 1, 1}, {"a", "1", 1, 1}}}, "block 0 update 1: repeats");
  check({{{"a", "1", 1, 1}}, {{"a", "1", 1, 1}}}, "block 1 update 0: repeats");
  check({{{"a", "1", 2, 1}}, {{"a", "1", 1, 1}}}, "block 1 update 0: out of");
  check({{{"a", "1", 1, 1}, {"b", "1", 1, 0}}}, "block 0 update 1: diff is 0");
  // A carry (update.h) repeats its (key, value, time), within a block and
  // across blocks; any other repeat is corruption.
  const std::vector<std::vector<Update>> carry = {
      {{"a", "1", 1, INT64_MAX}, {"a", "1", 1, INT64_MAX}},
      {{"a", "1", 1, 5}, {"b", "1", 1, INT64_MIN}},
      {{"b", "1", 1, -1}}};
  auto carried = decode_part(kName, craft(desc, stats_for(carry), carry));
  ASSERT_TRUE(carried.has_value()) << carried.error().to_string();
  check({{{"a", "1", 1, INT64_MAX}}, {{"a", "1", 1, -1}}}, "block 1 update 0: repeats");
  check({{{"a", "1", 1, INT64_MIN}, {"a", "1", 1, 1}}}, "block 0 update 1: repeats");

  // A time outside the description (and consistent stats) is refused at open.
  check({{{"a", "1", 1, 1}, {"b", "1", 100, 1}}}, "outside the inline description");
  // A time outside the stats range.
  {
    const std::vector<std::vector<Update>> blocks = {{{"a", "1", 5, 1}, {"b", "1", 50, 1}}};
    PartStats stats = stats_for(blocks);
    stats.time_max = 40;
    expect_corruption(decode_part(kName, craft(desc, stats, blocks)),
                      "block 0 update 1: time 50 outside");
  }
}

TEST(PartBlockTest, MalformedColumns) {
  const Description desc = description(0, 100);
  const std::vector<Update> updates = {{"a", "1", 1, 1}, {"b", "22", 2, 1}};
  const PartStats stats = expected_stats(updates);
  // One block of raw uncompressed bytes, compressed and indexed faithfully.
  auto with_block = [&](const std::string& uncompressed, std::uint64_t count) {
    std::vector<std::string> blocks = {compress(uncompressed)};
    PartFooter footer{desc, stats, {BlockHandle{0, 0, uncompressed.size(), count, 0}}};
    reindex(footer, blocks);
    return decode_part(kName, assemble(footer, blocks));
  };
  auto encode = [](auto&& write) {
    std::string out;
    Encoder encoder(&out);
    write(encoder);
    return out;
  };
  const std::string good = encode([](Encoder& e) {
    e.put_varint(2);
    e.put_varint(1);
    e.put_varint(1);
    e.put_raw("ab");
    e.put_varint(1);
    e.put_varint(2);
    e.put_raw("122");
    e.put_signed_varint(1);
    e.put_signed_varint(1);
    e.put_signed_varint(1);
    e.put_signed_varint(1);
  });
  auto decoded = with_block(good, 2);
  ASSERT_TRUE(decoded.has_value()) << decoded.error().to_string();
  EXPECT_EQ(*decoded, updates);

  expect_corruption(with_block(good + "x", 2), "trailing bytes");
  for (std::size_t length = 8; length < good.size(); ++length) {
    expect_corruption(with_block(good.substr(0, length), 2), "malformed");
  }
  // Key lengths past the end.
  std::string long_keys = good;
  long_keys[2] = 100;
  expect_corruption(with_block(long_keys, 2), "malformed key column");
  std::string huge_keys = good;
  huge_keys.replace(2, 1, "\xff\xff\xff\xff\x0f");
  expect_corruption(with_block(huge_keys, 2), "malformed key column");
  // Value lengths past the end.
  std::string long_values = good;
  long_values[6] = 30;
  expect_corruption(with_block(long_values, 2), "malformed value column");
  // Count disagreeing with the index.
  std::string three = good;
  three[0] = 3;
  expect_corruption(with_block(three, 2), "block 0 holds 3 updates");
  expect_corruption(with_block(good, 3), "sum to");
  // A malformed count varint.
  expect_corruption(with_block(std::string(12, '\xff'), 2), "malformed count");
}

TEST(PartBlockTest, ABlockCompressedFromItsColumnsIsTheConcatenatedBlock) {
  BlockBuilder concatenated, streamed;
  for (const Update& u : make_updates(300, 9, 20, 300)) {
    concatenated.add(UpdateView{u.key, u.value, u.time, u.diff});
    streamed.add(UpdateView{u.key, u.value, u.time, u.diff});
  }
  std::string uncompressed;
  concatenated.finish(&uncompressed);
  BlockCompressor compressor(1);
  std::string frame = "prefix";
  auto length = streamed.finish_compressed(compressor, 1 << 10, &frame);
  ASSERT_TRUE(length) << length.error().to_string();
  EXPECT_EQ(*length, uncompressed.size());
  EXPECT_TRUE(streamed.empty());
  ASSERT_TRUE(frame.starts_with("prefix"));
  frame.erase(0, 6);
  EXPECT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), uncompressed.size());
  EXPECT_EQ(ZSTD_findFrameCompressedSize(frame.data(), frame.size()), frame.size());
  std::string back(uncompressed.size(), '\0');
  EXPECT_EQ(ZSTD_decompress(back.data(), back.size(), frame.data(), frame.size()), back.size());
  EXPECT_EQ(back, uncompressed);

  // Pieces, empty ones among them, are one frame of their concatenation.
  const std::string_view pieces[] = {"", "ab", "", "cde", ""};
  std::string out;
  ASSERT_TRUE(compressor.compress(pieces, &out));
  std::string joined(5, '\0');
  EXPECT_EQ(ZSTD_decompress(joined.data(), joined.size(), out.data(), out.size()), 5u);
  EXPECT_EQ(joined, "abcde");
  out.clear();
  ASSERT_TRUE(compressor.compress(std::span<const std::string_view>(), &out));
  EXPECT_EQ(ZSTD_getFrameContentSize(out.data(), out.size()), 0u);
}

// Text that compresses better the harder zstd tries.
std::string compressible_text(std::size_t bytes) {
  std::string out;
  std::uint64_t state = 12345;
  while (out.size() < bytes) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    out += "word" + std::to_string((state >> 33) % 500) + (state % 7 == 0 ? "\n" : " ");
  }
  out.resize(bytes);
  return out;
}

// The frame `level` makes of `text` on a thread of its own (a fresh context).
std::string compress_on_new_thread(int level, const std::string& text) {
  std::string out;
  std::thread([&] {
    BlockCompressor compressor(level);
    EXPECT_TRUE(compressor.compress(text, &out).has_value());
  }).join();
  return out;
}

TEST(PartBlockTest, CompressorsShareTheThreadsContextYetEachKeepsItsLevel) {
  const std::string text = compressible_text(64 << 10);
  const std::string fresh_fast = compress_on_new_thread(1, text);
  const std::string fresh_strong = compress_on_new_thread(19, text);
  ASSERT_NE(fresh_fast, fresh_strong);  // else this test could not tell levels apart
  BlockCompressor fast(1), strong(19);
  for (int round = 0; round < 2; ++round) {
    std::string out;
    ASSERT_TRUE(fast.compress(text, &out));
    EXPECT_EQ(out, fresh_fast) << "round " << round;
    out.clear();
    ASSERT_TRUE(strong.compress(text, &out));
    EXPECT_EQ(out, fresh_strong) << "round " << round;
  }
}

TEST(PartBlockTest, AThreadKeepsOnlyACompressionContextWithinTheBound) {
  std::thread([] {
    EXPECT_EQ(BlockCompressor::thread_context_bytes(), 0u);
    const std::string text = compressible_text(64 << 10);
    std::string out;
    ASSERT_TRUE(BlockCompressor(1).compress(text, &out));
    const std::size_t kept = BlockCompressor::thread_context_bytes();
    EXPECT_GT(kept, 0u);
    EXPECT_LE(kept, BlockCompressor::kMaxCachedCompressContextBytes);
    // Level 9 over 4 MiB needs a context of several MiB: freed after use.
    const std::string large = compressible_text(4 << 20);
    out.clear();
    ASSERT_TRUE(BlockCompressor(9).compress(large, &out));
    EXPECT_EQ(BlockCompressor::thread_context_bytes(), 0u);
    std::string back(large.size(), '\0');
    EXPECT_EQ(ZSTD_decompress(back.data(), back.size(), out.data(), out.size()), large.size());
    EXPECT_EQ(back, large);
  }).join();
}

TEST(PartReaderTest, LargestDecodedBlockBytesComesFromTheIndex) {
  std::vector<Update> updates = make_updates(500, 4);
  // After every key of make_updates (at most 8 bytes).
  updates.push_back(Update{std::string(9, '\xff'), std::string(200 << 10, 'z'), 20, 1});
  const std::string bytes = must_write(description(0, 200), updates);
  auto reader = PartReader::from_bytes(kName, bytes);
  ASSERT_TRUE(reader) << reader.error().to_string();
  std::uint64_t largest = 0;
  for (const BlockHandle& block : split(bytes).footer.blocks) {
    largest = std::max(largest, decoded_block_bytes(block.uncompressed_length, block.count));
  }
  EXPECT_EQ(reader->largest_decoded_block_bytes(), largest);
  EXPECT_GE(largest, 200u << 10);
  EXPECT_LE(largest, decoded_block_bytes(max_block_length(reader->stats().bytes, updates.size()),
                                         updates.size()));
}

TEST(PartBlockTest, FramesMustBeExactlyOneWithContentSize) {
  const Description desc = description(0, 100);
  const std::vector<Update> updates = {{"a", "1", 1, 1}};
  BlockBuilder builder;
  builder.add(UpdateView{"a", "1", 1, 1});
  std::string uncompressed;
  builder.finish(&uncompressed);
  auto decode_with = [&](const std::string& block) {
    std::vector<std::string> blocks = {block};
    PartFooter footer{
        desc, expected_stats(updates), {BlockHandle{0, 0, uncompressed.size(), 1, 0}}};
    reindex(footer, blocks);
    return decode_part(kName, assemble(footer, blocks));
  };
  const std::string frame = compress(uncompressed);
  ASSERT_TRUE(decode_with(frame).has_value());
  expect_corruption(decode_with(frame + frame), "exactly one zstd frame");
  expect_corruption(decode_with(frame + "x"), "exactly one zstd frame");
  expect_corruption(decode_with("not zstd at all"), "exactly one zstd frame");
  // A frame without its content size.
  ZSTD_CCtx* context = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(context, ZSTD_c_contentSizeFlag, 0);
  std::string sizeless(ZSTD_compressBound(uncompressed.size()), '\0');
  sizeless.resize(ZSTD_compress2(context, sizeless.data(), sizeless.size(), uncompressed.data(),
                                 uncompressed.size()));
  ZSTD_freeCCtx(context);
  expect_corruption(decode_with(sizeless), "content size");
  // A frame whose content is damaged but whose checksum (ours) is right.
  std::string damaged = frame;
  damaged[damaged.size() - 2] ^= 0x55;
  auto result = decode_with(damaged);
  expect_corruption(result);
}

TEST(PartReaderTest, CorruptionIsSticky) {
  const auto updates = small_updates();
  std::string bytes = must_write(description(0, 200), updates, small_blocks());
  const Pieces pieces = split(bytes);
  bytes[pieces.footer.blocks[2].offset + 3] ^= 1;
  auto reader = PartReader::from_bytes(kName, bytes);
  ASSERT_TRUE(reader.has_value());
  std::size_t seen = 0;
  Result<std::optional<UpdateView>> next;
  while ((next = reader->next()) && *next) ++seen;
  expect_corruption(next, "block 2 checksum mismatch");
  EXPECT_EQ(seen, pieces.footer.blocks[0].count + pieces.footer.blocks[1].count);
  expect_corruption(reader->next(), "block 2 checksum mismatch");
}

// Throughput (printed, never asserted) ----------------------------------------

TEST(PartThroughput, SmallUpdates) {
#if defined(__SANITIZE_ADDRESS__)
  const std::size_t n = 100'000;
#else
  const std::size_t n = 1'000'000;
#endif
  std::vector<Update> updates;
  updates.reserve(n);
  std::mt19937_64 random(11);
  for (std::size_t i = 0; i < n; ++i) {
    char key[16], value[32];
    std::snprintf(key, sizeof key, "k%09zu", i);
    std::snprintf(value, sizeof value, "{\"v\":%014llu}",
                  static_cast<unsigned long long>(random() % 100000000000000ull));
    updates.push_back(Update{key, value, 1000 + random() % 1000, 1});
  }
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  PartWriter writer(description(0, 5000));
  for (const Update& u : updates) {
    ASSERT_TRUE(writer.add(UpdateView{u.key, u.value, u.time, u.diff}).has_value());
  }
  auto bytes = writer.finish();
  ASSERT_TRUE(bytes.has_value());
  const double encode_seconds = std::chrono::duration<double>(Clock::now() - start).count();

  start = Clock::now();
  auto reader = PartReader::from_bytes(kName, *bytes);
  ASSERT_TRUE(reader.has_value());
  std::size_t count = 0;
  std::uint64_t checksum = 0;
  while (true) {
    auto next = reader->next();
    ASSERT_TRUE(next.has_value());
    if (!*next) break;
    checksum += (*next)->key.size() + (*next)->value.size() + (*next)->time;
    ++count;
  }
  const double decode_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_EQ(count, n);
  std::printf(
      "[throughput] %zu updates (key 10 B, value 20 B): encode %.2f M/s, decode %.2f M/s; "
      "part %.1f MiB (%.1f B/update), %zu blocks [%llu]\n",
      n, n / encode_seconds / 1e6, n / decode_seconds / 1e6, bytes->size() / 1048576.0,
      static_cast<double>(bytes->size()) / n, reader->block_count(),
      static_cast<unsigned long long>(checksum % 10));
}

}  // namespace
}  // namespace tidemark
