// Tests of MergeCursor over ordered runs of parts: a run merges like its
// parts taken one by one, filters and validates each part like an unordered
// one, rejects parts out of order, and keeps at most one of its parts open
// (and the next one opening ahead). And of its read-ahead (issue #22): the
// same updates and errors as the sequential read, within the reads pool.
#include "shard/merge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "part/part.h"
#include "shard/read_ahead.h"
#include "testing/shard_util.h"
#include "tidemark/location.h"
#include "tidemark/memory_pool.h"
#include "util/try.h"

namespace tidemark {
namespace {

using PartRun = MergeCursor::PartRun;

Description description(Time lower, Time upper) {
  return Description{Frontier::at(lower), Frontier::at(upper), Frontier::at(0)};
}

// "<prefix><index>" with the index zero-padded, so keys sort as numbers do.
std::string numbered_key(const std::string& prefix, int index) {
  char digits[16];
  std::snprintf(digits, sizeof digits, "%04d", index);
  return prefix + digits;
}

// A Blob that forwards to another and records the key of every ranged read,
// in order: the reads of a PartReader. Each ranged read may be delayed by
// `latency`; the most reads in progress at once is kept. Thread-safe (a
// cursor opens parts concurrently).
class RecordingBlob final : public ForwardingBlob {
 public:
  using ForwardingBlob::ForwardingBlob;
  Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                std::uint64_t length) override {
    {
      std::lock_guard lock(mu_);
      fetches.emplace_back(key);
      if (length > large_fetch_bytes) {
        large_fetches.emplace_back(key);
        if (fail_next_large_fetch) {
          fail_next_large_fetch = false;
          return make_error(ErrorKind::kDeterminate, "injected: a large read failed");
        }
      }
      if (key == fail_key && offset <= fail_offset && fail_offset - offset < length) {
        return make_error(ErrorKind::kDeterminate, "injected: a read failed");
      }
      max_concurrent = std::max(max_concurrent, ++concurrent_);
    }
    std::this_thread::sleep_for(latency);
    auto result = ForwardingBlob::get_range(key, offset, length);
    std::lock_guard lock(mu_);
    --concurrent_;
    return result;
  }

  // Safe while reads (a run's next part opened ahead) are in progress.
  std::set<std::string> fetched_keys() {
    std::lock_guard lock(mu_);
    return {fetches.begin(), fetches.end()};
  }
  std::vector<std::string> fetches_so_far() {
    std::lock_guard lock(mu_);
    return fetches;
  }
  int concurrent() {
    std::lock_guard lock(mu_);
    return concurrent_;
  }

  std::vector<std::string> fetches;
  // The keys of reads of more than large_fetch_bytes, in order; the next
  // such read fails (Determinate) when fail_next_large_fetch is set.
  std::vector<std::string> large_fetches;
  std::uint64_t large_fetch_bytes = UINT64_MAX;
  bool fail_next_large_fetch = false;
  // Every read of fail_key whose range holds fail_offset fails (Determinate).
  std::string fail_key;
  std::uint64_t fail_offset = UINT64_MAX;
  std::chrono::milliseconds latency{0};
  int max_concurrent = 0;

 private:
  std::mutex mu_;
  int concurrent_ = 0;
};

// `size` bytes after `first` that zstd cannot shrink: a block of them is
// one ranged read of its own, not part of the tail open() fetches. Values
// of one `seed` repeat one another (zstd finds those): give each its own.
std::string incompressible(std::size_t size, char first, std::uint64_t seed = 42) {
  std::string value(size, first);
  std::uint64_t state = seed;
  for (std::size_t i = 1; i < value.size(); ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    value[i] = static_cast<char>(state >> 56);
  }
  return value;
}

class MergeRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto mem = open_blob("mem://");
    ASSERT_TRUE(mem) << mem.error().to_string();
    blob_ = std::make_shared<RecordingBlob>(*mem);
  }

  // Writes `updates` (sorted, consolidated) as the part "shard/s/part/<name>"
  // with small blocks, registered with the part's own description.
  PartRef write_part(const std::string& name, const Description& desc,
                     const std::vector<Update>& updates, std::size_t block_bytes = 64) {
    PartWriter writer(desc, PartOptions{.block_bytes = block_bytes});
    for (const Update& update : updates) {
      EXPECT_TRUE(writer.add(UpdateView{update.key, update.value, update.time, update.diff}));
    }
    auto bytes = writer.finish();
    EXPECT_TRUE(bytes) << bytes.error().to_string();
    PartRef ref;
    ref.key = "shard/s/part/" + name;
    ref.size = bytes->size();
    ref.count = writer.stats().count;
    ref.bytes = writer.stats().bytes;
    ref.time_min = writer.stats().time_min;
    ref.time_max = writer.stats().time_max;
    ref.lower = desc.lower;
    ref.upper = desc.upper;
    EXPECT_TRUE(blob_->set(ref.key, *bytes));
    return ref;
  }

  // Every update of the merge, in order.
  Result<std::vector<Update>> read_all(const std::vector<PartRun>& runs, TimeWindow window = {},
                                       ReadMemory memory = {}) {
    TM_ASSIGN(MergeCursor cursor, MergeCursor::open(blob_, runs, window, {}, std::move(memory)));
    std::vector<Update> out;
    for (;;) {
      TM_ASSIGN(auto update, cursor.next());
      if (!update) return out;
      out.push_back(update->to_owned());
    }
  }

  // Writes a part holding one incompressible 2 MiB update under `key` (a
  // block of its own, over kDeferBlockBytes, and a ranged read of its own),
  // and adds it to `expected` and to `huge` (blob key -> key).
  PartRef write_huge_part(const std::string& name, const std::string& key, char first, Time time,
                          std::vector<Update>& expected, std::map<std::string, std::string>& huge) {
    expected.push_back(Update{key, incompressible(2 << 20, first), time, 1});
    PartRef ref = write_part(name, description(0, 10), {expected.back()});
    huge[ref.key] = key;
    return ref;
  }

  // An ordered run of huge parts, one per key (in order), as compaction
  // cuts them.
  PartRun huge_run(const std::string& name, const std::vector<std::string>& keys,
                   std::vector<Update>& expected, std::map<std::string, std::string>& huge) {
    std::vector<PartRef> run;
    for (const std::string& key : keys) {
      run.push_back(write_huge_part(name + key, key, 'v', 1, expected, huge));
    }
    return PartRun{run, true};
  }

  // Merges `runs` into `expected` (sorted here), checking after every update
  // that the reads over kDeferBlockBytes so far are exactly one per part of
  // `huge` whose key the merge has reached: none at open.
  void expect_huge_blocks_load_when_reached(const std::vector<PartRun>& runs,
                                            std::vector<Update> expected,
                                            const std::map<std::string, std::string>& huge) {
    std::sort(expected.begin(), expected.end(), [](const Update& a, const Update& b) {
      return compare_key_value_time(a.key, a.value, a.time, b.key, b.value, b.time) < 0;
    });
    blob_->large_fetch_bytes = MergeCursor::kDeferBlockBytes;
    blob_->large_fetches.clear();
    auto cursor = MergeCursor::open(blob_, runs, {});
    ASSERT_TRUE(cursor) << cursor.error().to_string();
    EXPECT_TRUE(blob_->large_fetches.empty()) << "open loaded " << blob_->large_fetches[0];
    std::vector<Update> merged;
    for (;;) {
      auto update = cursor->next();
      ASSERT_TRUE(update) << update.error().to_string();
      if (!*update) break;
      merged.push_back((*update)->to_owned());
      std::vector<std::string> loaded = blob_->large_fetches, reached;
      for (const auto& [blob_key, key] : huge) {
        if (key <= merged.back().key) reached.push_back(blob_key);
      }
      std::sort(loaded.begin(), loaded.end());
      std::sort(reached.begin(), reached.end());
      EXPECT_EQ(loaded, reached) << "after " << merged.back().key;
    }
    EXPECT_TRUE(merged == expected);
  }

  std::shared_ptr<RecordingBlob> blob_;
};

// `count` updates with keys "<prefix>NNNN" from `first` on, times cycling
// through [0, 10).
std::vector<Update> run_updates(const std::string& prefix, int first, int count,
                                const std::string& value = "v") {
  std::vector<Update> out;
  for (int i = first; i < first + count; ++i) {
    out.push_back(Update{numbered_key(prefix, i), value, static_cast<Time>(i % 10), 1});
  }
  return out;
}

void expect_corruption_naming(const Result<std::vector<Update>>& result, const std::string& part,
                              const std::string& fragment) {
  ASSERT_FALSE(result.has_value()) << "expected a corruption naming " << part;
  EXPECT_EQ(result.error().kind, ErrorKind::kCorruption) << result.error().to_string();
  EXPECT_NE(result.error().message.find("part " + part), std::string::npos)
      << result.error().to_string();
  EXPECT_NE(result.error().message.find(fragment), std::string::npos) << result.error().to_string();
}

TEST_F(MergeRunTest, RunMergesLikeItsPartsUnordered) {
  const Description desc = description(0, 10);
  std::vector<PartRef> run;
  for (int p = 0; p < 3; ++p)
    run.push_back(write_part("run" + std::to_string(p), desc, run_updates("k", p * 30, 30)));
  // Unordered parts overlapping the run's keys and each other, with values
  // of their own so no (key, value, time) repeats and the order is total.
  std::vector<PartRef> loose = {write_part("loose0", desc, run_updates("k", 10, 50, "w")),
                                write_part("loose1", desc, run_updates("k", 0, 90, "x"))};

  auto merged = read_all({PartRun{run, /*ordered=*/true}, PartRun{loose, /*ordered=*/false}});
  ASSERT_TRUE(merged) << merged.error().to_string();

  std::vector<PartRef> all = run;
  all.insert(all.end(), loose.begin(), loose.end());
  auto reference = read_all({PartRun{all, /*ordered=*/false}});
  ASSERT_TRUE(reference) << reference.error().to_string();

  EXPECT_EQ(merged->size(), 90u + 50u + 90u);
  EXPECT_EQ(*merged, *reference);
  for (std::size_t i = 1; i < merged->size(); ++i) {
    const Update& a = (*merged)[i - 1];
    const Update& b = (*merged)[i];
    EXPECT_LT(compare_key_value_time(a.key, a.value, a.time, b.key, b.value, b.time), 0) << i;
  }
}

TEST_F(MergeRunTest, FiltersEachPartOfARunOnItsOwn) {
  std::vector<PartRef> run = {
      write_part("run0", description(0, 10), run_updates("k", 0, 20)),
      write_part("run1", description(0, 10), run_updates("k", 20, 20)),
      // Times [20, 30): outside the window, so never opened.
      write_part("run2", description(20, 30),
                 {Update{"k0040", "v", 20, 1}, Update{"k0041", "v", 25, 1}}),
      write_part("run3", description(0, 10), run_updates("k", 50, 20)),
  };
  run[1].lower = Frontier::at(5);  // registered range narrower than its inline description
  run[3].upper = Frontier::at(4);

  auto merged = read_all({PartRun{run, /*ordered=*/true}}, TimeWindow{2, 7});
  ASSERT_TRUE(merged) << merged.error().to_string();

  std::vector<Update> expected;
  const auto keep = [&](int first, Time min, Time max) {
    for (const Update& update : run_updates("k", first, 20)) {
      if (update.time >= min && update.time <= max) expected.push_back(update);
    }
  };
  keep(0, 2, 7);
  keep(20, 5, 7);
  keep(50, 2, 3);
  EXPECT_EQ(*merged, expected);
  EXPECT_EQ(blob_->fetched_keys().count(run[2].key), 0u);
}

TEST_F(MergeRunTest, ValidatesEachPartOfARunWhenItOpens) {
  std::vector<PartRef> run = {
      write_part("run0", description(0, 10), run_updates("k", 0, 20)),
      write_part("run1", description(0, 10), run_updates("k", 20, 20)),
      write_part("run2", description(0, 10), run_updates("k", 40, 20)),
  };
  {
    std::vector<PartRef> bad = run;
    bad[1].lower = Frontier::at(10);  // [10, 20) misses its inline [0, 10)
    bad[1].upper = Frontier::at(20);
    bad[1].time_min = 10;
    bad[1].time_max = 19;
    expect_corruption_naming(read_all({PartRun{bad, true}}), bad[1].key, "cannot be reconciled");
  }
  {
    std::vector<PartRef> bad = run;
    bad[2].count += 1;
    expect_corruption_naming(read_all({PartRun{bad, true}}), bad[2].key, "registered 21");
  }
}

TEST_F(MergeRunTest, RejectsARunOutOfOrder) {
  const Description desc = description(0, 10);
  std::vector<PartRef> overlapping = {
      write_part("run0", desc, run_updates("k", 0, 20)),
      write_part("run1", desc, run_updates("k", 20, 20)),
      write_part("run2", desc, run_updates("k", 30, 20)),  // starts inside run1
  };
  expect_corruption_naming(read_all({PartRun{overlapping, true}}), overlapping[2].key,
                           "out of order within its run");
  // The same parts unordered are a valid merge.
  EXPECT_TRUE(read_all({PartRun{overlapping, false}}));

  // A part starting with its predecessor's last update is out of order too.
  std::vector<PartRef> touching = {
      write_part("run3", desc, run_updates("k", 0, 20)),
      write_part("run4", desc, run_updates("k", 19, 20)),
  };
  expect_corruption_naming(read_all({PartRun{touching, true}}), touching[1].key,
                           "out of order within its run");

  // Parts in reverse order.
  std::vector<PartRef> reversed = {overlapping[1], overlapping[0]};
  expect_corruption_naming(read_all({PartRun{reversed, true}}), overlapping[0].key,
                           "out of order within its run");
}

TEST_F(MergeRunTest, AcceptsARunWhosePartsShareAKey) {
  // Part boundaries inside one key: the order check must compare values and
  // times, not only keys.
  const Description desc = description(0, 10);
  std::vector<PartRef> run = {
      write_part("run0", desc, {Update{"a", "v", 1, 1}, Update{"k", "v", 3, 1}}),
      write_part("run1", desc, {Update{"k", "v", 5, 1}, Update{"k", "w", 0, 1}}),
      write_part("run2", desc, {Update{"k", "x", 2, 1}, Update{"z", "v", 1, 1}}),
  };
  auto merged = read_all({PartRun{run, true}});
  ASSERT_TRUE(merged) << merged.error().to_string();
  EXPECT_EQ(merged->size(), 6u);

  std::vector<PartRef> backwards = {
      write_part("run3", desc, {Update{"a", "v", 1, 1}, Update{"k", "v", 5, 1}}),
      write_part("run4", desc, {Update{"k", "v", 3, 1}, Update{"z", "v", 1, 1}}),
  };
  expect_corruption_naming(read_all({PartRun{backwards, true}}), backwards[1].key,
                           "out of order within its run");
  // A part starting inside the previous one is refused even when the
  // updates that overlap are all out of the window: its first key says so.
  std::vector<PartRef> overlapping = {
      write_part("run5", desc, {Update{"a", "v", 1, 1}, Update{"m", "v", 1, 1}}),
      write_part("run6", desc, {Update{"c", "v", 5, 1}, Update{"z", "v", 1, 1}}),
  };
  expect_corruption_naming(read_all({PartRun{overlapping, true}}, TimeWindow{1, 2}),
                           overlapping[1].key, "out of order within its run");
}

TEST_F(MergeRunTest, ChecksHugeValuesAcrossPartsFromAPrefixOrByReadingAgain) {
  // Parts meeting inside one key with huge values: the run keeps only a
  // prefix of the last value, and reads the part again when the values
  // share all of it.
  const Description desc = description(0, 10);
  const std::string common(MergeCursor::kRunCheckValueBytes + 10, 'p');
  const auto run_of = [&](const std::string& name, const std::string& last,
                          const std::string& first) {
    return std::vector<PartRef>{
        write_part(name + "0", desc, {Update{"a", "v", 1, 1}, Update{"k", last, 1, 1}}),
        write_part(name + "1", desc, {Update{"k", first, 1, 1}, Update{"z", "v", 1, 1}})};
  };
  // Settled by the prefix.
  EXPECT_TRUE(read_all({PartRun{run_of("differ", "a" + common, "b" + common), true}}));
  auto before = run_of("before", "b" + common, "a" + common);
  expect_corruption_naming(read_all({PartRun{before, true}}), before[1].key,
                           "out of order within its run");
  // The next value is the kept prefix itself: shorter, so before.
  auto prefix = run_of("prefix", common + "x", common.substr(0, MergeCursor::kRunCheckValueBytes));
  expect_corruption_naming(read_all({PartRun{prefix, true}}), prefix[1].key,
                           "out of order within its run");
  // Settled only by reading the first part again.
  auto again = run_of("again", common + "a", common + "b");
  blob_->fetches.clear();
  auto merged = read_all({PartRun{again, true}});
  ASSERT_TRUE(merged) << merged.error().to_string();
  EXPECT_EQ(merged->size(), 4u);
  // The first part was read again once the second was open.
  const auto second = std::find(blob_->fetches.begin(), blob_->fetches.end(), again[1].key);
  EXPECT_NE(std::find(second, blob_->fetches.end(), again[0].key), blob_->fetches.end());
  auto reversed = run_of("reversed", common + "b", common + "a");
  expect_corruption_naming(read_all({PartRun{reversed, true}}), reversed[1].key,
                           "out of order within its run");
  // Equal values: then the time decides.
  auto repeated = run_of("repeated", common + "a", common + "a");
  expect_corruption_naming(read_all({PartRun{repeated, true}}), repeated[1].key,
                           "out of order within its run");
}

TEST_F(MergeRunTest, OpenBlockBytesCountsTheBlocksAMergeHolds) {
  const Description desc = description(0, 10);
  // Small blocks (write_part cuts them at 64 bytes), many updates: the
  // reference alone allows a block as large as the part.
  std::vector<Update> many;
  for (int i = 0; i < 9'999; ++i) {
    many.push_back(Update{numbered_key("m", i), std::string(100, 'v'), 1, 1});
  }
  const PartRef small = write_part("small", desc, run_updates("k", 0, 10));
  const PartRef wide = write_part("wide", desc, many);
  const PartRef huge = write_part("huge", desc, {Update{"h", std::string(2 << 20, 'h'), 1, 1}});
  const auto decoded = [&](const PartRef& ref) {
    auto reader = PartReader::open_blob(*blob_, ref.key, ref.size);
    EXPECT_TRUE(reader) << reader.error().to_string();
    return reader->largest_decoded_block_bytes();
  };
  const auto bound = [](const PartRef& ref) {
    return decoded_block_bytes(max_block_length(ref.bytes, ref.count), ref.count);
  };
  ASSERT_GT(bound(wide), kExactBlockBytesAbove);
  ASSERT_LT(decoded(wide), 1024u);
  ASSERT_GT(decoded(huge), 2u << 20);
  const std::vector<PartRun> runs = {PartRun{{small, wide, huge}, false},
                                     PartRun{{small, wide, huge}, true}};

  blob_->fetches.clear();
  auto from_refs = open_block_bytes(*blob_, runs, false);
  ASSERT_TRUE(from_refs) << from_refs.error().to_string();
  EXPECT_TRUE(blob_->fetches.empty());
  EXPECT_EQ((*from_refs)[0], bound(small) + bound(wide) + bound(huge));
  EXPECT_EQ((*from_refs)[1], std::max({bound(small), bound(wide), bound(huge)}));

  // With footers: exact for the parts whose reference allows over 1 MiB,
  // and only those are fetched.
  auto exact = open_block_bytes(*blob_, runs, true);
  ASSERT_TRUE(exact) << exact.error().to_string();
  EXPECT_EQ((*exact)[0], bound(small) + decoded(wide) + decoded(huge));
  EXPECT_EQ((*exact)[1], decoded(huge));
  EXPECT_EQ(blob_->fetched_keys(), (std::set<std::string>{wide.key, huge.key}));
  EXPECT_GE(bound(small), decoded(small));
}

TEST_F(MergeRunTest, OpensOnePartOfARunAtATime) {
  constexpr int kParts = 50;
  constexpr int kPerPart = 10;
  const Description desc = description(0, 10);
  std::vector<PartRef> run;
  for (int p = 0; p < kParts; ++p) {
    run.push_back(
        write_part(numbered_key("run", p), desc, run_updates("k", p * kPerPart, kPerPart)));
  }
  std::vector<PartRef> loose = {write_part("loose0", desc, run_updates("k", 0, 100, "w")),
                                write_part("loose1", desc, run_updates("k", 200, 100, "w"))};
  std::map<std::string, int> run_index;  // blob key -> position in the run
  for (int p = 0; p < kParts; ++p) run_index[run[p].key] = p;
  blob_->fetches.clear();

  auto cursor = MergeCursor::open(blob_, {PartRun{run, true}, PartRun{loose, false}}, {});
  ASSERT_TRUE(cursor) << cursor.error().to_string();
  auto first = cursor->next();
  ASSERT_TRUE(first && *first);
  // The run's first part, and perhaps its second, opened ahead.
  EXPECT_GE(blob_->fetched_keys().size(), 1u + loose.size());
  EXPECT_LE(blob_->fetched_keys().size(), 2u + loose.size());

  // Whenever the merge emits an update of run part k, the run has fetched
  // from parts 0..k and at most k + 2 (k + 1 opened once part k was
  // exhausted, and the part after it opened ahead).
  std::size_t emitted = 1;
  int last_run_part = 0;
  for (;;) {
    auto update = cursor->next();
    ASSERT_TRUE(update) << update.error().to_string();
    if (!*update) break;
    ++emitted;
    if ((*update)->value == "v")
      last_run_part = std::stoi(std::string((*update)->key.substr(1))) / kPerPart;
    int highest_fetched = -1;
    for (const std::string& key : blob_->fetched_keys()) {
      if (auto it = run_index.find(key); it != run_index.end()) {
        highest_fetched = std::max(highest_fetched, it->second);
      }
    }
    EXPECT_GE(highest_fetched, last_run_part);
    EXPECT_LE(highest_fetched, last_run_part + 2) << "after " << emitted << " updates";
  }
  EXPECT_EQ(emitted, static_cast<std::size_t>(kParts * kPerPart) + 200u);

  // Once a later part of the run is read, no earlier part is read again.
  int previous = -1;
  for (const std::string& key : blob_->fetches_so_far()) {
    if (auto it = run_index.find(key); it != run_index.end()) {
      EXPECT_GE(it->second, previous) << key;
      previous = it->second;
    }
  }
  EXPECT_EQ(previous, kParts - 1);
}

TEST_F(MergeRunTest, SlowPartsOpenConcurrently) {
  // 24 loose parts behind a blob whose reads take 20 ms: opened one by one
  // that is 48 reads in a row (footer, first block). The cursor opens them
  // on up to kOpenThreads threads, and the merge is unchanged.
  std::vector<PartRef> loose;
  std::vector<Update> expected;
  for (int p = 0; p < 24; ++p) {
    std::vector<Update> updates;
    for (int i = 0; i < 3; ++i) {
      updates.push_back(Update{numbered_key("k", i * 24 + p), "v", 1, 1});
      expected.push_back(updates.back());
    }
    loose.push_back(write_part("loose" + std::to_string(p), description(0, 5), updates));
  }
  std::sort(expected.begin(), expected.end(),
            [](const Update& a, const Update& b) { return a.key < b.key; });
  blob_->latency = std::chrono::milliseconds(20);
  auto merged = read_all({PartRun{loose, false}});
  ASSERT_TRUE(merged) << merged.error().to_string();
  EXPECT_EQ(*merged, expected);
  EXPECT_GT(blob_->max_concurrent, 1);
  EXPECT_LE(blob_->max_concurrent, static_cast<int>(MergeCursor::kOpenThreads));
}

TEST_F(MergeRunTest, OpenStopsWhenAsked) {
  std::vector<PartRef> loose;
  for (int p = 0; p < 8; ++p) {
    loose.push_back(
        write_part("p" + std::to_string(p), description(0, 5), {Update{"k", "v", 1, 1}}));
  }
  auto cursor = MergeCursor::open(blob_, {PartRun{loose, false}}, {}, [] { return true; });
  ASSERT_FALSE(cursor);
  EXPECT_TRUE(cursor.error().is(ErrorKind::kClosed)) << cursor.error().to_string();
  EXPECT_TRUE(blob_->fetches.empty());
}

TEST_F(MergeRunTest, LoadsLargeFirstBlocksOnlyWhenTheMergeReachesThem) {
  // Loose parts of one huge update each, beside a part of small updates:
  // the merge loads a huge block only once it has emitted everything
  // sorting before that part's first key.
  std::vector<Update> expected;
  std::map<std::string, std::string> huge;
  std::vector<PartRef> loose;
  for (const std::string key : {"k0005", "k0012", "k0030"}) {
    loose.push_back(write_huge_part("huge-" + key, key, 'y', 1, expected, huge));
  }
  // Two huge updates under one key: both load once the merge reaches it,
  // and the smaller value comes first.
  loose.push_back(write_huge_part("huge-k0012x", "k0012", 'x', 2, expected, huge));
  for (const Update& update : run_updates("k", 0, 40)) expected.push_back(update);
  loose.push_back(write_part("small", description(0, 10), run_updates("k", 0, 40)));
  expect_huge_blocks_load_when_reached({PartRun{loose, false}}, expected, huge);
}

TEST_F(MergeRunTest, LoadsAHugePartOfARunOnlyWhenTheMergeReachesIt) {
  // Two ordered runs whose parts (one huge update each, as compaction cuts
  // them) interleave by key: when a run moves to its next part, that part's
  // block waits until the merge reaches its first key, so the runs do not
  // hold a huge block each.
  std::vector<Update> expected;
  std::map<std::string, std::string> huge;
  std::vector<PartRun> runs = {huge_run("a", {"k0005", "k0030", "k0031"}, expected, huge),
                               huge_run("b", {"k0012", "k0040"}, expected, huge)};
  for (const Update& update : run_updates("k", 0, 45)) expected.push_back(update);
  runs.push_back(
      PartRun{{write_part("small", description(0, 10), run_updates("k", 0, 45))}, false});
  expect_huge_blocks_load_when_reached(runs, expected, huge);
}

TEST_F(MergeRunTest, RetriesALargeFirstBlockWhoseLoadFailed) {
  const Description desc = description(0, 10);
  const std::string huge = incompressible(3 << 20, 'h');
  const PartRef big = write_part("big", desc, {Update{"m", huge, 1, 1}});
  const PartRef small = write_part("small", desc, run_updates("k", 0, 3));
  blob_->large_fetch_bytes = MergeCursor::kDeferBlockBytes;
  auto cursor = MergeCursor::open(blob_, {PartRun{{big, small}, false}}, {});
  ASSERT_TRUE(cursor) << cursor.error().to_string();
  for (int i = 0; i < 3; ++i) {
    auto update = cursor->next();
    ASSERT_TRUE(update && *update);
    EXPECT_EQ((*update)->key, numbered_key("k", i));
  }
  blob_->fail_next_large_fetch = true;
  auto failed = cursor->next();
  ASSERT_FALSE(failed);
  EXPECT_TRUE(failed.error().is(ErrorKind::kDeterminate)) << failed.error().to_string();
  auto again = cursor->next();
  ASSERT_TRUE(again && *again) << (again ? "ended" : again.error().to_string());
  EXPECT_EQ((*again)->key, "m");
  EXPECT_TRUE((*again)->value == huge);
  auto end = cursor->next();
  ASSERT_TRUE(end);
  EXPECT_FALSE(*end);
}

// A read's decoded blocks draw from its ReadMemory: each input's current
// block is reserved before it loads and released when the next replaces it
// or the input ends, so the pool sees what the merge holds; a block that
// cannot fit fails the read with Full instead of being allocated anyway.
TEST_F(MergeRunTest, BlocksAreChargedToTheReadsMemory) {
  const Description desc = description(0, 10);
  const std::string huge = incompressible(3 << 20, 'h');
  const PartRef big = write_part("big", desc, {Update{"m", huge, 1, 1}});
  const PartRef small = write_part("small", desc, run_updates("k", 0, 40));
  auto pool = MemoryPool::create("reads", 8 << 20);
  {
    auto cursor = MergeCursor::open(blob_, {PartRun{{big, small}, false}}, {}, {},
                                    ReadMemory{pool, std::chrono::milliseconds(100)});
    ASSERT_TRUE(cursor) << cursor.error().to_string();
    std::size_t rows = 0;
    for (;;) {
      auto update = cursor->next();
      ASSERT_TRUE(update) << update.error().to_string();
      if (!*update) break;
      ++rows;
      // The huge block is held while its update is the current one.
      if ((*update)->key == "m") {
        EXPECT_GE(pool->used(), huge.size());
      }
    }
    EXPECT_EQ(rows, 41u);
    EXPECT_GE(pool->stats().peak_used, huge.size());
    EXPECT_LE(pool->stats().peak_used, pool->capacity());
  }
  EXPECT_EQ(pool->used(), 0u);  // every block's bytes back

  // Too small for the huge block: the read fails with Full, naming the
  // pool, once its wait is over; the pool is untouched.
  auto tight = MemoryPool::create("reads", 1 << 20);
  auto cursor = MergeCursor::open(blob_, {PartRun{{big, small}, false}}, {}, {},
                                  ReadMemory{tight, std::chrono::milliseconds(100)});
  Status read = cursor ? Status{} : Status(std::unexpected(cursor.error()));
  while (read && cursor) {
    auto update = cursor->next();
    if (!update) {
      read = std::unexpected(update.error());
      break;
    }
    if (!*update) break;
  }
  ASSERT_FALSE(read) << "a 3 MiB block was read through a 1 MiB pool";
  EXPECT_EQ(read.error().kind, ErrorKind::kFull) << read.error().to_string();
  EXPECT_NE(read.error().message.find("more than the reads memory's capacity"), std::string::npos)
      << read.error().message;
  EXPECT_EQ(tight->used(), 0u);

  // Room taken by others: the huge block waits for it, and fails after the
  // wait; once the room is free the same read goes through.
  auto shared = MemoryPool::create("reads", 4 << 20);
  auto read_all_through = [&]() -> Status {
    TM_ASSIGN(MergeCursor cursor,
              MergeCursor::open(blob_, {PartRun{{big, small}, false}}, {}, {},
                                ReadMemory{shared, std::chrono::milliseconds(200)}));
    for (;;) {
      TM_ASSIGN(auto update, cursor.next());
      if (!update) return {};
    }
  };
  {
    Lease held = shared->force_reserve(2 << 20);
    const auto started = std::chrono::steady_clock::now();
    Status waited = read_all_through();
    ASSERT_FALSE(waited);
    EXPECT_EQ(waited.error().kind, ErrorKind::kFull) << waited.error().to_string();
    EXPECT_NE(waited.error().message.find("could not give within 200 ms"), std::string::npos)
        << waited.error().message;
    EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(200));
  }
  Status read_again = read_all_through();
  EXPECT_TRUE(read_again) << read_again.error().to_string();
}

// Parts of many blocks (values of random sizes, zstd cannot shrink them),
// as loose parts and as ordered runs, cut at random block sizes.
std::vector<PartRun> random_runs(
    MergeRunTest* test, std::uint64_t seed,
    const std::function<PartRef(const std::string&, const Description&, const std::vector<Update>&,
                                std::size_t)>& write) {
  std::mt19937_64 random(seed);
  const auto updates = [&](const std::string& prefix, int first, int count) {
    std::vector<Update> out;
    for (int i = first; i < first + count; ++i) {
      std::string value(1 + random() % 300, 'v');
      for (char& c : value) c = static_cast<char>(random() >> 56);
      out.push_back(
          Update{numbered_key(prefix, i), std::move(value), static_cast<Time>(random() % 10), 1});
    }
    return out;
  };
  const std::size_t block_sizes[] = {64, 700, 4096, 16384};
  std::vector<PartRun> runs;
  PartRun loose;
  for (int p = 0; p < 4; ++p) {
    // Interleaved keys: every loose part covers the same key range.
    loose.parts.push_back(write("loose" + std::to_string(p), description(0, 10),
                                updates("k" + std::to_string(p % 2), 0, 500 + random() % 1500),
                                block_sizes[random() % 4]));
  }
  runs.push_back(loose);
  for (int r = 0; r < 2; ++r) {
    PartRun run{{}, true};
    int first = 0;
    for (int p = 0; p < 3; ++p) {
      const int count = 300 + random() % 1000;
      run.parts.push_back(write("run" + std::to_string(r) + "-" + std::to_string(p),
                                description(0, 10), updates("k0", first, count),
                                block_sizes[random() % 4]));
      first += count;
    }
    runs.push_back(run);
  }
  (void)test;
  return runs;
}

class ReadAheadTest : public MergeRunTest {
 protected:
  void SetUp() override {
    MergeRunTest::SetUp();
    // Small spans, so that parts of a few hundred KiB take many, cut
    // anywhere in a block; read-ahead from this quick test blob too.
    ReadAheadSource::set_span_bytes_for_testing(16 << 10);
    MergeCursor::set_read_ahead_for_testing(true);
  }
  void TearDown() override {
    ReadAheadSource::set_span_bytes_for_testing(0);
    MergeCursor::reset_read_ahead_for_testing();
  }

  std::vector<PartRun> runs(std::uint64_t seed) {
    return random_runs(
        this, seed,
        [this](const std::string& name, const Description& desc, const std::vector<Update>& updates,
               std::size_t block_bytes) { return write_part(name, desc, updates, block_bytes); });
  }

  // Reads `runs` to the end or the first error: the updates before it, and
  // the error.
  std::pair<std::vector<Update>, std::optional<Error>> read_until_error(
      const std::vector<PartRun>& runs, ReadMemory memory = {}) {
    std::vector<Update> out;
    auto cursor = MergeCursor::open(blob_, runs, {}, {}, std::move(memory));
    if (!cursor) return {out, cursor.error()};
    for (;;) {
      auto update = cursor->next();
      if (!update) return {out, update.error()};
      if (!*update) return {out, std::nullopt};
      out.push_back((*update)->to_owned());
    }
  }

  // Waits (up to 5 s) until no read of the blob is in progress and `pool`
  // (when given) holds nothing: fetches a cursor left behind end on their own.
  void wait_for_quiet(const std::shared_ptr<MemoryPool>& pool) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((blob_->concurrent() > 0 || (pool && pool->used() > 0)) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(blob_->concurrent(), 0);
    if (pool) {
      EXPECT_EQ(pool->used(), 0u);
    }
  }
};

TEST_F(ReadAheadTest, GivesTheUpdatesOfTheSequentialRead) {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::vector<PartRun> shard = runs(seed);
    MergeCursor::set_read_ahead_for_testing(false);
    auto sequential = read_all(shard);
    ASSERT_TRUE(sequential) << sequential.error().to_string();
    const std::size_t sequential_fetches = blob_->fetches.size();
    MergeCursor::set_read_ahead_for_testing(true);
    blob_->fetches.clear();
    blob_->max_concurrent = 0;
    blob_->latency = std::chrono::milliseconds(1);
    auto ahead = read_all(shard);
    blob_->latency = std::chrono::milliseconds(0);
    ASSERT_TRUE(ahead) << ahead.error().to_string();
    EXPECT_TRUE(*ahead == *sequential);
    EXPECT_GT(sequential->size(), 5000u);
    // Spans of many blocks: fewer reads, several at once.
    EXPECT_LT(blob_->fetches.size(), sequential_fetches);
    EXPECT_GT(blob_->max_concurrent, 1);
    blob_->fetches.clear();
  }
}

// By default read-ahead runs only where it helps: from a blob with
// latency, several reads at once once the merge runs; never for a merge
// opened without it (compaction's). (From a quick blob it stays off when
// every part opened in under 2 ms: a choice made on time, so only its
// answer is checked here, not which way it went.)
TEST_F(ReadAheadTest, ByDefaultItReadsAheadOnlyWhereItHelps) {
  const std::vector<PartRun> shard = runs(3);
  MergeCursor::reset_read_ahead_for_testing();
  // The most reads at once while the merge runs (opening reads parts
  // concurrently anyway), and the updates.
  auto merge_reads = [&](bool read_ahead) -> std::pair<int, std::vector<Update>> {
    auto merge = MergeCursor::open(blob_, shard, {}, {}, {}, read_ahead);
    EXPECT_TRUE(merge) << merge.error().to_string();
    if (!merge) return {};
    blob_->max_concurrent = 0;
    std::vector<Update> out;
    for (;;) {
      auto update = merge->next();
      EXPECT_TRUE(update) << update.error().to_string();
      if (!update || !*update) break;
      out.push_back((*update)->to_owned());
    }
    return {blob_->max_concurrent, out};
  };
  const auto [quick_reads, quick] = merge_reads(true);
  EXPECT_GT(quick.size(), 5000u);
  blob_->latency = std::chrono::milliseconds(2);
  const auto [slow_reads, slow] = merge_reads(true);
  EXPECT_TRUE(slow == quick);
  EXPECT_GT(slow_reads, 1);
  const auto [compaction_reads, compaction] = merge_reads(false);
  EXPECT_TRUE(compaction == quick);
  EXPECT_LE(compaction_reads, 1);
  blob_->latency = std::chrono::milliseconds(0);
  wait_for_quiet(nullptr);
}

TEST_F(ReadAheadTest, StaysWithinTheReadsPool) {
  const std::vector<PartRun> shard = runs(7);
  // What the sequential read holds at most: its current blocks.
  MergeCursor::set_read_ahead_for_testing(false);
  auto unbounded = MemoryPool::create("reads", std::uint64_t{1} << 40);
  auto sequential = read_all(shard, {}, ReadMemory{unbounded});
  ASSERT_TRUE(sequential) << sequential.error().to_string();
  const std::uint64_t blocks = unbounded->stats().peak_used;
  ASSERT_GT(blocks, 0u);
  MergeCursor::set_read_ahead_for_testing(true);
  // Smaller than the blocks (the read completes, overdrawn as without
  // read-ahead), room for a few spans, and more than read-ahead takes.
  for (std::uint64_t capacity : {blocks / 2, 2 * blocks + (32 << 10), std::uint64_t{64} << 20}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    auto pool = MemoryPool::create("reads", capacity);
    blob_->latency = std::chrono::milliseconds(1);
    auto ahead = read_all(shard, {}, ReadMemory{pool, std::chrono::milliseconds(1000)});
    blob_->latency = std::chrono::milliseconds(0);
    ASSERT_TRUE(ahead) << ahead.error().to_string();
    EXPECT_TRUE(*ahead == *sequential);
    if (capacity >= 2 * blocks) {
      EXPECT_LE(pool->stats().peak_used, capacity);
    }
    wait_for_quiet(pool);
  }
}

TEST_F(ReadAheadTest, LeavesTheRoomItsCallerAsksFor) {
  const std::vector<PartRun> shard = runs(9);
  MergeCursor::set_read_ahead_for_testing(false);
  auto unbounded = MemoryPool::create("reads", std::uint64_t{1} << 40);
  auto sequential = read_all(shard, {}, ReadMemory{unbounded});
  ASSERT_TRUE(sequential) << sequential.error().to_string();
  const std::size_t sequential_fetches = blob_->fetches.size();
  MergeCursor::set_read_ahead_for_testing(true);
  // A caller (a listen's sorter) that needs the whole pool: read-ahead
  // takes none of it, and the read is the sequential one.
  auto pool = MemoryPool::create("reads", 64 << 20);
  blob_->fetches.clear();
  auto cursor = MergeCursor::open(blob_, shard, {}, {}, ReadMemory{pool});
  ASSERT_TRUE(cursor) << cursor.error().to_string();
  cursor->leave_room_for(64 << 20);
  std::vector<Update> out;
  for (;;) {
    auto update = cursor->next();
    ASSERT_TRUE(update) << update.error().to_string();
    if (!*update) break;
    out.push_back((*update)->to_owned());
  }
  EXPECT_TRUE(out == *sequential);
  EXPECT_EQ(blob_->fetches.size(), sequential_fetches);
  EXPECT_EQ(pool->stats().peak_used, unbounded->stats().peak_used);
}

TEST_F(ReadAheadTest, AFailingReadFailsWhereTheSequentialReadFails) {
  const std::vector<PartRun> shard = runs(11);
  const PartRef& victim = shard[1].parts[1];                // inside an ordered run
  ASSERT_GT(victim.size, 2 * PartReader::kOpenFetchBytes);  // size / 3 is before the tail
  blob_->fail_key = victim.key;
  blob_->fail_offset = victim.size / 3;
  MergeCursor::set_read_ahead_for_testing(false);
  const auto [sequential, sequential_error] = read_until_error(shard);
  ASSERT_TRUE(sequential_error);
  MergeCursor::set_read_ahead_for_testing(true);
  blob_->latency = std::chrono::milliseconds(1);
  const auto [ahead, ahead_error] = read_until_error(shard);
  blob_->latency = std::chrono::milliseconds(0);
  ASSERT_TRUE(ahead_error);
  EXPECT_EQ(ahead_error->to_string(), sequential_error->to_string());
  EXPECT_EQ(ahead.size(), sequential.size());
  EXPECT_TRUE(ahead == sequential);
  wait_for_quiet(nullptr);
}

TEST_F(ReadAheadTest, ADamagedBlockFailsWhereTheSequentialReadFails) {
  const std::vector<PartRun> shard = runs(13);
  for (const PartRef& victim : {shard[0].parts[2], shard[2].parts[0]}) {
    SCOPED_TRACE(victim.key);
    auto original = blob_->get(victim.key);
    ASSERT_TRUE(original && *original);
    std::string damaged = **original;
    ASSERT_GT(damaged.size(), 2 * PartReader::kOpenFetchBytes);
    damaged[damaged.size() / 3] ^= 0x55;
    ASSERT_TRUE(blob_->set(victim.key, damaged));
    MergeCursor::set_read_ahead_for_testing(false);
    const auto [sequential, sequential_error] = read_until_error(shard);
    ASSERT_TRUE(sequential_error);
    EXPECT_EQ(sequential_error->kind, ErrorKind::kCorruption) << sequential_error->to_string();
    MergeCursor::set_read_ahead_for_testing(true);
    const auto [ahead, ahead_error] = read_until_error(shard);
    ASSERT_TRUE(ahead_error);
    EXPECT_EQ(ahead_error->to_string(), sequential_error->to_string());
    EXPECT_TRUE(ahead == sequential);
    ASSERT_TRUE(blob_->set(victim.key, **original));
  }
}

// The budget bounds fetches in flight, not spans fetched and waiting for
// their reader: those hold bytes only.
TEST(ReadAheadBudgetTest, AFetchedSpanHoldsBytesButNoFetch) {
  auto budget = std::make_shared<ReadAheadBudget>(nullptr);
  std::vector<ReadAheadGrant> grants;
  for (std::size_t i = 0; i < ReadAheadBudget::kCursorFetches; ++i) {
    auto grant = budget->try_take(1024);
    ASSERT_TRUE(grant);
    grants.push_back(std::move(*grant));
  }
  EXPECT_FALSE(budget->try_take(1024));  // as many fetches in flight as allowed
  grants[0].end_fetch();
  grants[0].end_fetch();  // once only
  auto more = budget->try_take(1024);
  ASSERT_TRUE(more);
  EXPECT_FALSE(budget->try_take(1024));
  EXPECT_EQ(budget->bytes(), (ReadAheadBudget::kCursorFetches + 1) * 1024);
  // Bytes still bound what is held, fetched or not.
  for (ReadAheadGrant& grant : grants) grant.end_fetch();
  more->end_fetch();
  EXPECT_FALSE(budget->try_take(ReadAheadBudget::kCursorBytes));
  grants.clear();  // a grant whose fetch ended gives back its bytes alone
  EXPECT_EQ(budget->bytes(), 1024u);
  auto rest = budget->try_take(ReadAheadBudget::kCursorBytes - 1024);
  EXPECT_TRUE(rest);
}

// Each input of a merge gets a fair share of the cursor's bytes: room for
// the span it reads and one ahead.
TEST(ReadAheadBudgetTest, SpansShrinkWithTheInputsReadAtOnce) {
  ReadAheadBudget budget(nullptr);
  EXPECT_EQ(budget.span_bytes(), ReadAheadSource::kSpanBytes);  // one input
  EXPECT_EQ(budget.spans_ahead(), ReadAheadSource::kSpansPerPart);
  const std::pair<std::size_t, std::uint64_t> cases[] = {
      {2, 1 << 20}, {32, 256 << 10}, {64, 128 << 10}, {1000, 64 << 10}};
  for (const auto& [inputs, span] : cases) {
    SCOPED_TRACE(std::to_string(inputs) + " inputs");
    budget.set_inputs(inputs);
    EXPECT_EQ(budget.span_bytes(), span);
    const std::uint64_t share = ReadAheadBudget::kCursorBytes / inputs;
    EXPECT_EQ(budget.spans_ahead(), std::clamp<std::uint64_t>(share / span, 1, 8));
    EXPECT_LE(budget.spans_ahead() * budget.span_bytes(),
              std::max(share, ReadAheadBudget::kMinSpanBytes));
  }
}

// A merge of more small parts than fetches may be in flight reads ahead in
// every one of them, not only in the first kCursorFetches (whose spans, once
// fetched, used to hold their fetches until read, so the other parts were
// read block by block when the merge reached them: a freshly appended shard
// on S3 read at a quarter of a merged one's speed). Once the first spans
// are fetched, the first part done tops the others up, and the rest of the
// merge reads nothing more from the blob.
TEST_F(ReadAheadTest, ReadsAheadInEveryOneOfManySmallParts) {
  // One span covers what a part holds below the tail opening reads, so
  // twice kCursorFetches parts take two rounds of fetches.
  ReadAheadSource::set_span_bytes_for_testing(PartReader::kOpenFetchBytes);
  constexpr int kParts = 2 * ReadAheadBudget::kCursorFetches;
  std::vector<PartRef> parts;
  for (int p = 0; p < kParts; ++p) {
    std::vector<Update> updates;
    for (int i = 0; i < 100; ++i) {  // about 100 KiB: beyond the 64 KiB tail opening reads
      updates.push_back(Update{"k" + std::to_string(1000 + p) + "-" + std::to_string(100 + i),
                               incompressible(1000, 'v', 1000 * p + i), 1, 1});
    }
    parts.push_back(write_part("small" + std::to_string(p), description(0, 10), updates, 4096));
    ASSERT_GT(parts.back().size, PartReader::kOpenFetchBytes);
    ASSERT_LT(parts.back().size, 2 * PartReader::kOpenFetchBytes);
  }
  // Slow enough that the first spans are still in flight while the
  // merge's first next() issues them.
  blob_->latency = std::chrono::milliseconds(20);
  auto cursor = MergeCursor::open(blob_, {PartRun{parts, /*ordered=*/false}}, {});
  ASSERT_TRUE(cursor) << cursor.error().to_string();
  std::vector<Update> out;
  auto read = [&](std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      auto update = cursor->next();
      ASSERT_TRUE(update) << update.error().to_string();
      if (!*update) return;
      out.push_back((*update)->to_owned());
    }
  };
  // The first kCursorFetches parts' spans go out at the first next().
  read(1);
  wait_for_quiet(nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // their jobs end
  // Through the first part: its end tops up every other part.
  read(100);
  wait_for_quiet(nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  blob_->fetches.clear();
  read(SIZE_MAX);
  blob_->latency = std::chrono::milliseconds(0);
  EXPECT_EQ(out.size(), static_cast<std::size_t>(kParts) * 100);
  EXPECT_TRUE(std::is_sorted(out.begin(), out.end(),
                             [](const Update& a, const Update& b) { return a.key < b.key; }));
  EXPECT_TRUE(blob_->fetches_so_far().empty())
      << blob_->fetches_so_far().size() << " reads after the top-up, the first of "
      << blob_->fetches_so_far().front();
}

TEST_F(ReadAheadTest, ACursorDestroyedWithFetchesInFlightIsSafe) {
  const std::vector<PartRun> shard = runs(17);
  auto pool = MemoryPool::create("reads", 64 << 20);
  blob_->latency = std::chrono::milliseconds(20);
  for (int reads : {0, 1, 50, 3000}) {
    SCOPED_TRACE("after " + std::to_string(reads) + " updates");
    {
      auto cursor = MergeCursor::open(blob_, shard, {}, {}, ReadMemory{pool});
      ASSERT_TRUE(cursor) << cursor.error().to_string();
      for (int i = 0; i < reads; ++i) {
        auto update = cursor->next();
        ASSERT_TRUE(update && *update);
      }
      EXPECT_GT(pool->used(), 0u);  // spans fetched or on their way
    }
    wait_for_quiet(pool);
  }
  // And with the blob's last owner a fetch in flight.
  {
    auto cursor = MergeCursor::open(blob_, shard, {}, {}, ReadMemory{pool});
    ASSERT_TRUE(cursor);
    blob_.reset();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (pool->used() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(pool->used(), 0u);
}

// Huge updates in ordered runs with disjoint key ranges (a compacted shard
// of seven huge records: runs of 4, 2 and 1 parts), read through a reads
// memory with room for two huge blocks. A run that ended kept its last
// block's bytes charged until the cursor went, so the seventh block found
// the pool full and the read failed after six updates, every time: a
// snapshot of such a shard over HTTP never got past its fifth record.
TEST_F(MergeRunTest, HugeRunsReadThroughAPoolOfTwoBlocks) {
  std::vector<Update> expected;
  std::map<std::string, std::string> huge;
  std::vector<PartRun> runs = {huge_run("a", {"r00", "r01", "r02", "r03"}, expected, huge),
                               huge_run("b", {"r04", "r05"}, expected, huge),
                               huge_run("c", {"r06"}, expected, huge)};
  auto pool = MemoryPool::create("reads", (4 << 20) + (1 << 18));
  auto cursor =
      MergeCursor::open(blob_, runs, {}, {}, ReadMemory{pool, std::chrono::milliseconds(200)});
  ASSERT_TRUE(cursor) << cursor.error().to_string();
  std::size_t rows = 0;
  for (;;) {
    auto update = cursor->next();
    ASSERT_TRUE(update) << "after " << rows << " rows: " << update.error().to_string();
    if (!*update) break;
    ++rows;
  }
  EXPECT_EQ(rows, 7u);
}

}  // namespace
}  // namespace tidemark
