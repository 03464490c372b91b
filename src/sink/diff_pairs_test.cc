// Tests of DiffPairWalker: the pairing of befores and afters within a
// (key, time) group on hand examples and against a reference model, lazy
// fan-out (a diff of ten million and a group of a hundred thousand values
// walk in constant memory), the ordering and determinism checks, and the
// propagation of source errors.
#include "sink/diff_pairs.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "util/try.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// From the ASan and TSan runtimes (GCC 12 ships no
// <sanitizer/allocator_interface.h> declaring it).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace tidemark {
namespace {

// One pass over a vector of updates the test owns.
class VectorSource final : public UpdateSource {
 public:
  explicit VectorSource(const std::vector<Update>* updates) : updates_(updates) {}

  Result<std::optional<UpdateView>> next() override {
    if (position_ == updates_->size()) return std::nullopt;
    const Update& update = (*updates_)[position_++];
    return UpdateView{update.key, update.value, update.time, update.diff};
  }

 private:
  const std::vector<Update>* updates_;
  std::size_t position_ = 0;
};

OpenUpdateSource open_vector(const std::vector<Update>* updates) {
  return [updates]() -> Result<std::unique_ptr<UpdateSource>> {
    return std::make_unique<VectorSource>(updates);
  };
}

// A diff pair that owns its bytes, for comparisons.
struct OwnedPair {
  std::string key;
  Time time = 0;
  std::optional<std::string> before;
  std::optional<std::string> after;
  std::uint64_t index_in_group = 0;

  bool operator==(const OwnedPair&) const = default;
};

std::ostream& operator<<(std::ostream& out, const OwnedPair& pair) {
  return out << "{" << pair.key << "@" << pair.time << " " << pair.before.value_or("-") << " -> "
             << pair.after.value_or("-") << " #" << pair.index_in_group << "}";
}

OwnedPair owned(const DiffPair& pair) {
  OwnedPair out{std::string(pair.key), pair.time, std::nullopt, std::nullopt, pair.index_in_group};
  if (pair.before) out.before = std::string(*pair.before);
  if (pair.after) out.after = std::string(*pair.after);
  return out;
}

OwnedPair pair_of(std::string key, Time time, std::optional<std::string> before,
                  std::optional<std::string> after, std::uint64_t index) {
  return OwnedPair{std::move(key), time, std::move(before), std::move(after), index};
}

// Walks all of `updates`, or returns the walker's first error.
Result<std::vector<OwnedPair>> walk(const OpenUpdateSource& open_source) {
  TM_ASSIGN(DiffPairWalker walker, DiffPairWalker::open(open_source));
  std::vector<OwnedPair> out;
  for (;;) {
    TM_ASSIGN(auto pair, walker.next());
    if (!pair) return out;
    out.push_back(owned(*pair));
  }
}

std::vector<OwnedPair> walk_ok(const std::vector<Update>& updates) {
  auto pairs = walk(open_vector(&updates));
  EXPECT_TRUE(pairs) << pairs.error().to_string();
  return pairs ? *pairs : std::vector<OwnedPair>{};
}

// The reference model: expands every group's copies into two lists and
// pairs them by position.
std::vector<OwnedPair> model_pairs(const std::vector<Update>& updates) {
  std::vector<OwnedPair> out;
  for (std::size_t start = 0; start < updates.size();) {
    std::size_t end = start;
    std::vector<std::string> befores;
    std::vector<std::string> afters;
    while (end < updates.size() && updates[end].key == updates[start].key &&
           updates[end].time == updates[start].time) {
      const Update& update = updates[end++];
      auto& side = update.diff < 0 ? befores : afters;
      for (Diff copy = 0; copy < std::abs(update.diff); ++copy) side.push_back(update.value);
    }
    for (std::size_t i = 0; i < std::max(befores.size(), afters.size()); ++i) {
      OwnedPair pair{updates[start].key, updates[start].time, std::nullopt, std::nullopt, i};
      if (i < befores.size()) pair.before = befores[i];
      if (i < afters.size()) pair.after = afters[i];
      out.push_back(std::move(pair));
    }
    start = end;
  }
  return out;
}

std::string numbered(const std::string& prefix, int index) {
  char digits[16];
  std::snprintf(digits, sizeof digits, "%08d", index);
  return prefix + digits;
}

// Bytes the process has allocated from malloc and not freed. glibc: the
// arena's chunks and the mmapped ones (a large vector is mmapped, and
// uordblks alone would miss it). Coarse: chunks parked in the thread cache
// count as in use, so a few small allocations served from there do not
// show; a collection of pairs does (see TheMemoryProbeSeesAnEagerCollection).
// Under ASan or TSan, whose allocator replaces malloc (mallinfo2 would say
// 0 and turn the memory checks off), the sanitizer's own count: freed
// chunks waiting in ASan's quarantine are not counted.
std::int64_t allocated_bytes() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return static_cast<std::int64_t>(__sanitizer_get_current_allocated_bytes());
#else
  const struct mallinfo2 info = mallinfo2();
  return static_cast<std::int64_t>(info.uordblks + info.hblkhd);
#endif
}

constexpr std::int64_t kMiB = 1 << 20;

// --- Hand examples --------------------------------------------------------

TEST(DiffPairWalkerTest, EmptyInputHasNoPairs) {
  std::vector<Update> updates;
  EXPECT_TRUE(walk_ok(updates).empty());
}

TEST(DiffPairWalkerTest, InsertOnlyFansOutToUnpairedAfters) {
  std::vector<Update> updates = {{"k", "v", 5, 3}};
  EXPECT_EQ(walk_ok(updates), (std::vector<OwnedPair>{
                                  pair_of("k", 5, std::nullopt, "v", 0),
                                  pair_of("k", 5, std::nullopt, "v", 1),
                                  pair_of("k", 5, std::nullopt, "v", 2),
                              }));
}

TEST(DiffPairWalkerTest, DeleteOnlyFansOutToUnpairedBefores) {
  std::vector<Update> updates = {{"k", "v", 5, -2}};
  EXPECT_EQ(walk_ok(updates), (std::vector<OwnedPair>{
                                  pair_of("k", 5, "v", std::nullopt, 0),
                                  pair_of("k", 5, "v", std::nullopt, 1),
                              }));
}

TEST(DiffPairWalkerTest, UpdatePairsOldWithNew) {
  // The after sorts before the before: pairing follows each side's own order.
  std::vector<Update> updates = {{"k", "new", 1, 1}, {"k", "old", 1, -1}};
  EXPECT_EQ(walk_ok(updates), (std::vector<OwnedPair>{pair_of("k", 1, "old", "new", 0)}));
}

TEST(DiffPairWalkerTest, MixedCountsPairInValueOrderThenLeaveTheRestAlone) {
  std::vector<Update> updates = {{"k", "a", 1, -2}, {"k", "b", 1, 1}, {"k", "c", 1, 3}};
  EXPECT_EQ(walk_ok(updates), (std::vector<OwnedPair>{
                                  pair_of("k", 1, "a", "b", 0),
                                  pair_of("k", 1, "a", "c", 1),
                                  pair_of("k", 1, std::nullopt, "c", 2),
                                  pair_of("k", 1, std::nullopt, "c", 3),
                              }));
  // Deterministic: a second walk gives the same sequence.
  EXPECT_EQ(walk_ok(updates), walk_ok(updates));
}

TEST(DiffPairWalkerTest, LeftoverBeforesStandAloneAsDeletes) {
  std::vector<Update> updates = {
      {"k", "a", 1, -1}, {"k", "b", 1, 2}, {"k", "c", 1, -2}, {"k", "d", 1, -1}};
  EXPECT_EQ(walk_ok(updates), (std::vector<OwnedPair>{
                                  pair_of("k", 1, "a", "b", 0),
                                  pair_of("k", 1, "c", "b", 1),
                                  pair_of("k", 1, "c", std::nullopt, 2),
                                  pair_of("k", 1, "d", std::nullopt, 3),
                              }));
}

TEST(DiffPairWalkerTest, GroupsOfSeveralKeysAndTimesEachCountFromZero) {
  // Time-major, as a listen emits: key "a" appears at two times, apart.
  std::vector<Update> updates = {
      {"a", "1", 1, 1}, {"b", "1", 1, 2},  {"a", "1", 2, -1},
      {"a", "2", 2, 1}, {"b", "1", 2, -1}, {"c", "x", 2, -1},
  };
  EXPECT_EQ(walk_ok(updates), (std::vector<OwnedPair>{
                                  pair_of("a", 1, std::nullopt, "1", 0),
                                  pair_of("b", 1, std::nullopt, "1", 0),
                                  pair_of("b", 1, std::nullopt, "1", 1),
                                  pair_of("a", 2, "1", "2", 0),
                                  pair_of("b", 2, "1", std::nullopt, 0),
                                  pair_of("c", 2, "x", std::nullopt, 0),
                              }));
}

TEST(DiffPairWalkerTest, KeyMajorGroupsWithOneTimeEach) {
  // A snapshot at as_of: every update at one time, sorted by (key, value).
  std::vector<Update> updates = {{"a", "1", 7, 1}, {"a", "2", 7, 1}, {"b", "1", 7, 1}};
  EXPECT_EQ(walk_ok(updates), (std::vector<OwnedPair>{
                                  pair_of("a", 7, std::nullopt, "1", 0),
                                  pair_of("a", 7, std::nullopt, "2", 1),
                                  pair_of("b", 7, std::nullopt, "1", 0),
                              }));
}

TEST(DiffPairWalkerTest, AnEmptyKeyOrValueIsAnOrdinaryOne) {
  std::vector<Update> updates = {{"", "", 0, -1}, {"", "x", 0, 1}, {"k", "", 0, 1}};
  EXPECT_EQ(walk_ok(updates), (std::vector<OwnedPair>{
                                  pair_of("", 0, "", "x", 0),
                                  pair_of("k", 0, std::nullopt, "", 0),
                              }));
}

TEST(DiffPairWalkerTest, ViewsStayValidUntilTheNextCall) {
  // Sources that hand out views into buffers they overwrite on every next().
  class ReusingSource final : public UpdateSource {
   public:
    explicit ReusingSource(const std::vector<Update>* updates) : updates_(updates) {}
    Result<std::optional<UpdateView>> next() override {
      if (position_ == updates_->size()) return std::nullopt;
      current_ = (*updates_)[position_++];
      return UpdateView{current_.key, current_.value, current_.time, current_.diff};
    }

   private:
    const std::vector<Update>* updates_;
    std::size_t position_ = 0;
    Update current_;
  };
  std::vector<Update> updates = {
      {"key-one", "aaaa", 1, -2}, {"key-one", "bbbb", 1, 3}, {"key-two", "cccc", 1, 1}};
  auto pairs = walk([&]() -> Result<std::unique_ptr<UpdateSource>> {
    return std::make_unique<ReusingSource>(&updates);
  });
  ASSERT_TRUE(pairs) << pairs.error().to_string();
  EXPECT_EQ(*pairs, model_pairs(updates));
}

TEST(DiffPairWalkerTest, AMovedWalkerContinuesWhereItWas) {
  std::vector<Update> updates = {{"k", "a", 1, -1}, {"k", "b", 1, 2}};
  auto walker = DiffPairWalker::open(open_vector(&updates));
  ASSERT_TRUE(walker);
  auto first = walker->next();
  ASSERT_TRUE(first && *first);
  EXPECT_EQ(owned(**first), pair_of("k", 1, "a", "b", 0));
  DiffPairWalker moved = std::move(*walker);
  auto second = moved.next();
  ASSERT_TRUE(second && *second);
  EXPECT_EQ(owned(**second), pair_of("k", 1, std::nullopt, "b", 1));
  auto end = moved.next();
  ASSERT_TRUE(end);
  EXPECT_FALSE(*end);
  // The end is sticky.
  auto again = moved.next();
  ASSERT_TRUE(again);
  EXPECT_FALSE(*again);
}

// --- Against the reference model -----------------------------------------

// Random groups, time-major or key-major, with values drawn from a small
// alphabet (so groups mix befores and afters of neighbouring values) and
// small diffs with the occasional large one.
std::vector<Update> random_updates(std::mt19937_64& rng) {
  std::vector<Update> updates;
  const int keys = std::uniform_int_distribution<int>(1, 6)(rng);
  const int times = std::uniform_int_distribution<int>(1, 4)(rng);
  const bool time_major = rng() % 2 == 0;
  std::vector<std::pair<std::string, Time>> groups;
  for (int t = 0; t < times; ++t) {
    for (int k = 0; k < keys; ++k) {
      if (rng() % 4 == 0) continue;  // not every key changes at every time
      groups.emplace_back(numbered("k", k), static_cast<Time>(t));
    }
  }
  if (!time_major) {
    std::sort(groups.begin(), groups.end());
  }
  for (const auto& [key, time] : groups) {
    for (int v = 0; v < 8; ++v) {
      if (rng() % 2 == 0) continue;
      Diff diff = std::uniform_int_distribution<Diff>(1, 4)(rng);
      if (rng() % 16 == 0) diff = std::uniform_int_distribution<Diff>(5, 40)(rng);
      if (rng() % 2 == 0) diff = -diff;
      updates.push_back(Update{key, numbered("v", v), time, diff});
    }
  }
  return updates;
}

TEST(DiffPairWalkerTest, RandomWorkloadsMatchTheReferenceModel) {
  std::mt19937_64 rng(20240611);
  std::uint64_t total_pairs = 0;
  for (int round = 0; round < 2000; ++round) {
    std::vector<Update> updates = random_updates(rng);
    std::vector<OwnedPair> expected = model_pairs(updates);
    std::vector<OwnedPair> actual = walk_ok(updates);
    // The exact sequence, since the pairing is specified...
    ASSERT_EQ(actual, expected) << "round " << round;
    // ...and, for a diagnosis that does not depend on it, the multiset of
    // (before, after) per (key, time), and the indexes 0, 1, ... per group.
    std::map<std::tuple<std::string, Time>, std::vector<OwnedPair>> by_group;
    for (const OwnedPair& pair : actual) by_group[{pair.key, pair.time}].push_back(pair);
    for (auto& [group, pairs] : by_group) {
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        ASSERT_EQ(pairs[i].index_in_group, i) << "round " << round;
        ASSERT_TRUE(pairs[i].before || pairs[i].after);
      }
    }
    total_pairs += actual.size();
  }
  EXPECT_GT(total_pairs, 10000u);
}

// --- Lazy fan-out: memory is O(1) in the diff and the group size ----------

// Pulls every pair, checking the allocated bytes every so often against the
// level after open; returns the number of pairs and the largest growth.
struct WalkFigures {
  std::uint64_t pairs = 0;
  std::uint64_t befores = 0;
  std::uint64_t afters = 0;
  std::int64_t peak_growth = 0;
};

WalkFigures walk_measuring(const std::vector<Update>& updates) {
  WalkFigures figures;
  auto walker = DiffPairWalker::open(open_vector(&updates));
  EXPECT_TRUE(walker) << walker.error().to_string();
  if (!walker) return figures;
  const std::int64_t baseline = allocated_bytes();
  for (;;) {
    auto pair = walker->next();
    EXPECT_TRUE(pair) << pair.error().to_string();
    if (!pair || !*pair) break;
    figures.befores += (*pair)->before.has_value();
    figures.afters += (*pair)->after.has_value();
    if (++figures.pairs % 65536 == 0) {
      figures.peak_growth = std::max(figures.peak_growth, allocated_bytes() - baseline);
    }
  }
  figures.peak_growth = std::max(figures.peak_growth, allocated_bytes() - baseline);
  return figures;
}

TEST(DiffPairWalkerTest, TheMemoryProbeSeesAnEagerCollection) {
  // What the regression in the Materialize sink did: collect a key's pairs
  // before handing out the first. The probe must see that, or the lazy
  // fan-out tests below prove nothing.
  constexpr Diff kCopies = 100'000;
  std::vector<Update> updates = {{"hot", "row", 0, kCopies}};
  auto walker = DiffPairWalker::open(open_vector(&updates));
  ASSERT_TRUE(walker);
  const std::int64_t baseline = allocated_bytes();
  std::vector<DiffPair> collected;
  for (;;) {
    auto pair = walker->next();
    ASSERT_TRUE(pair);
    if (!*pair) break;
    collected.push_back(**pair);
  }
  EXPECT_EQ(collected.size(), static_cast<std::size_t>(kCopies));
  EXPECT_GT(allocated_bytes() - baseline, kMiB);
}

TEST(DiffPairWalkerTest, ADiffOfTenMillionFansOutLazily) {
  constexpr Diff kCopies = 10'000'000;
  std::vector<Update> updates = {{"hot", "row", 0, kCopies}};
  WalkFigures figures = walk_measuring(updates);
  EXPECT_EQ(figures.pairs, static_cast<std::uint64_t>(kCopies));
  EXPECT_EQ(figures.afters, static_cast<std::uint64_t>(kCopies));
  EXPECT_EQ(figures.befores, 0u);
  EXPECT_LT(figures.peak_growth, kMiB);
  RecordProperty("peak_growth_bytes", std::to_string(figures.peak_growth));
  std::printf("diff of 10M: %llu pairs, peak heap growth %lld bytes\n",
              static_cast<unsigned long long>(figures.pairs),
              static_cast<long long>(figures.peak_growth));
}

TEST(DiffPairWalkerTest, TenMillionBeforesPairWithTenMillionAftersLazily) {
  constexpr Diff kCopies = 10'000'000;
  std::vector<Update> updates = {{"hot", "new", 0, kCopies}, {"hot", "old", 0, -kCopies}};
  WalkFigures figures = walk_measuring(updates);
  EXPECT_EQ(figures.pairs, static_cast<std::uint64_t>(kCopies));
  EXPECT_EQ(figures.befores, static_cast<std::uint64_t>(kCopies));
  EXPECT_EQ(figures.afters, static_cast<std::uint64_t>(kCopies));
  EXPECT_LT(figures.peak_growth, kMiB);
  std::printf("-10M/+10M: %llu pairs, peak heap growth %lld bytes\n",
              static_cast<unsigned long long>(figures.pairs),
              static_cast<long long>(figures.peak_growth));
}

TEST(DiffPairWalkerTest, AGroupOfAHundredThousandValuesIsNeverCollected) {
  // Values alternate sign, so each pass steps over every other update.
  constexpr int kValues = 100'000;
  std::vector<Update> updates;
  updates.reserve(kValues);
  for (int v = 0; v < kValues; ++v) {
    updates.push_back(Update{"wide", numbered("a-value-longer-than-the-small-string-buffer-", v), 3,
                             v % 2 == 0 ? -1 : 1});
  }
  WalkFigures figures = walk_measuring(updates);
  EXPECT_EQ(figures.pairs, static_cast<std::uint64_t>(kValues / 2));
  EXPECT_EQ(figures.befores, static_cast<std::uint64_t>(kValues / 2));
  EXPECT_EQ(figures.afters, static_cast<std::uint64_t>(kValues / 2));
  EXPECT_LT(figures.peak_growth, kMiB);
  std::printf("100k values: %llu pairs, peak heap growth %lld bytes\n",
              static_cast<unsigned long long>(figures.pairs),
              static_cast<long long>(figures.peak_growth));
}

TEST(DiffPairWalkerTest, TheLargestDiffsCountExactly) {
  // |i64 min| copies fit in the walker's counter; pull only the first few.
  std::vector<Update> updates = {{"k", "a", 0, std::numeric_limits<Diff>::min()},
                                 {"k", "b", 0, std::numeric_limits<Diff>::max()}};
  auto walker = DiffPairWalker::open(open_vector(&updates));
  ASSERT_TRUE(walker);
  for (std::uint64_t i = 0; i < 3; ++i) {
    auto pair = walker->next();
    ASSERT_TRUE(pair && *pair);
    EXPECT_EQ(owned(**pair), pair_of("k", 0, "a", "b", i));
  }
}

TEST(DiffPairWalkerTest, ACarryRepeatsItsValueAndCountsOn) {
  // A total beyond an i64 comes as several updates of one value (update.h).
  // The befores' pass reads past the afters' carry to its first before,
  // checking the carry's order on the way.
  constexpr Diff kMax = std::numeric_limits<Diff>::max();
  constexpr Diff kMin = std::numeric_limits<Diff>::min();
  std::vector<Update> updates = {
      {"k", "a", 0, kMax}, {"k", "a", 0, 1}, {"k", "b", 0, kMin}, {"k", "b", 0, -1}};
  auto walker = DiffPairWalker::open(open_vector(&updates));
  ASSERT_TRUE(walker) << walker.error().to_string();
  for (std::uint64_t i = 0; i < 3; ++i) {
    auto pair = walker->next();
    ASSERT_TRUE(pair && *pair) << (pair ? "end" : pair.error().to_string());
    EXPECT_EQ(owned(**pair), pair_of("k", 0, "b", "a", i));
  }
  // A repeat after anything but a saturated diff of its sign is no carry.
  std::vector<Update> bad = {{"k", "a", 0, kMax - 1}, {"k", "a", 0, 1}, {"k", "b", 0, -1}};
  auto refused = DiffPairWalker::open(open_vector(&bad));
  if (refused) {
    auto pair = refused->next();
    ASSERT_FALSE(pair) << "a repeat that is no carry was accepted";
    EXPECT_TRUE(pair.error().is(ErrorKind::kInvalidUsage)) << pair.error().to_string();
  } else {
    EXPECT_TRUE(refused.error().is(ErrorKind::kInvalidUsage)) << refused.error().to_string();
  }
}

// --- Contract violations --------------------------------------------------

void expect_invalid_usage(const std::vector<Update>& updates, const std::string& what) {
  auto pairs = walk(open_vector(&updates));
  ASSERT_FALSE(pairs) << what;
  EXPECT_TRUE(pairs.error().is(ErrorKind::kInvalidUsage))
      << what << ": " << pairs.error().to_string();
}

TEST(DiffPairWalkerTest, ValuesNotIncreasingWithinAGroupAreInvalidUsage) {
  expect_invalid_usage({{"k", "b", 1, 1}, {"k", "a", 1, 1}}, "decreasing afters");
  expect_invalid_usage({{"k", "b", 1, -1}, {"k", "a", 1, -1}}, "decreasing befores");
  expect_invalid_usage({{"k", "b", 1, 1}, {"k", "a", 1, -1}}, "decreasing, mixed signs");
  expect_invalid_usage({{"k", "a", 1, 1}, {"k", "a", 1, -1}}, "a repeated value");
  expect_invalid_usage({{"j", "a", 1, 1}, {"k", "c", 1, 1}, {"k", "b", 1, 1}},
                       "decreasing in a later group");
}

TEST(DiffPairWalkerTest, AZeroDiffIsInvalidUsage) {
  expect_invalid_usage({{"k", "a", 1, 0}}, "a zero diff alone");
  expect_invalid_usage({{"k", "a", 1, 1}, {"k", "b", 1, 0}}, "a zero diff after an insert");
}

TEST(DiffPairWalkerTest, ValuesMayDecreaseAcrossGroups) {
  // Only contiguity of groups is the contract, not an order between them.
  std::vector<Update> updates = {{"b", "z", 2, 1}, {"a", "a", 1, 1}, {"b", "y", 1, -1}};
  EXPECT_EQ(walk_ok(updates), model_pairs(updates));
}

// A factory whose first pass reads `first` and every later one `second`.
OpenUpdateSource open_twice(const std::vector<Update>* first, const std::vector<Update>* second) {
  auto opened = std::make_shared<int>(0);
  return [=]() -> Result<std::unique_ptr<UpdateSource>> {
    return std::make_unique<VectorSource>((*opened)++ == 0 ? first : second);
  };
}

void expect_passes_disagree(const std::vector<Update>& first, const std::vector<Update>& second,
                            const std::string& what) {
  for (bool swapped : {false, true}) {
    auto walker =
        DiffPairWalker::open(swapped ? open_twice(&second, &first) : open_twice(&first, &second));
    ASSERT_TRUE(walker) << what;
    std::optional<Error> failure;
    for (int calls = 0; calls < 1000 && !failure; ++calls) {
      auto pair = walker->next();
      if (!pair) {
        failure = pair.error();
      } else if (!*pair) {
        break;
      }
    }
    ASSERT_TRUE(failure) << what << (swapped ? " (swapped)" : "");
    EXPECT_TRUE(failure->is(ErrorKind::kInvalidUsage)) << what << ": " << failure->to_string();
    // Sticky: the walker does not go on from a state it cannot trust.
    auto again = walker->next();
    ASSERT_FALSE(again);
    EXPECT_EQ(again.error().message, failure->message);
  }
}

TEST(DiffPairWalkerTest, PassesThatDisagreeAreInvalidUsageNeverACrash) {
  const std::vector<Update> base = {{"a", "1", 1, -1}, {"a", "2", 1, 1}, {"b", "1", 1, 2}};
  expect_passes_disagree(base, {{"a", "1", 1, -1}, {"a", "2", 1, 1}, {"c", "1", 1, 2}},
                         "another key for the second group");
  expect_passes_disagree(base, {{"a", "1", 1, -1}, {"a", "2", 1, 1}, {"b", "1", 2, 2}},
                         "another time for the second group");
  expect_passes_disagree(base, {{"a", "1", 1, -1}, {"a", "3", 1, 1}, {"b", "1", 1, 2}},
                         "another value within a group");
  expect_passes_disagree(base, {{"a", "1", 1, -1}, {"a", "2", 1, 2}, {"b", "1", 1, 2}},
                         "another diff within a group");
  expect_passes_disagree(base, {{"a", "1", 1, -1}, {"a", "2", 1, 1}},
                         "one pass ends a group early");
  expect_passes_disagree(base,
                         {{"a", "1", 1, -1}, {"a", "2", 1, 1}, {"a", "3", 1, 1}, {"b", "1", 1, 2}},
                         "an extra update within a group");
  expect_passes_disagree(base,
                         {{"a", "0", 1, 1}, {"a", "1", 1, -1}, {"a", "2", 1, 1}, {"b", "1", 1, 2}},
                         "an extra update at the start of a group");
  expect_passes_disagree(base,
                         {{"a", "1", 1, -1}, {"a", "2", 1, 1}, {"b", "1", 1, 2}, {"c", "1", 1, 1}},
                         "an extra group at the end");
  expect_passes_disagree(base, {}, "one pass is empty");
}

// --- Source errors --------------------------------------------------------

// A source that yields `updates` and then fails with an Indeterminate error
// at its `fail_at`-th call of next() (counting from 0).
class FailingSource final : public UpdateSource {
 public:
  FailingSource(const std::vector<Update>* updates, std::size_t fail_at)
      : inner_(updates), fail_at_(fail_at) {}
  Result<std::optional<UpdateView>> next() override {
    if (calls_++ == fail_at_) return indeterminate("blob read timed out");
    return inner_.next();
  }

 private:
  VectorSource inner_;
  std::size_t fail_at_;
  std::size_t calls_ = 0;
};

TEST(DiffPairWalkerTest, AFactoryErrorFailsOpen) {
  auto walker = DiffPairWalker::open(
      []() -> Result<std::unique_ptr<UpdateSource>> { return determinate("no such shard"); });
  ASSERT_FALSE(walker);
  EXPECT_TRUE(walker.error().is(ErrorKind::kDeterminate));
  EXPECT_EQ(walker.error().message, "no such shard");
}

TEST(DiffPairWalkerTest, AFactoryErrorOnTheSecondOpenFailsOpen) {
  std::vector<Update> updates = {{"k", "v", 1, 1}};
  int opened = 0;
  auto walker = DiffPairWalker::open([&]() -> Result<std::unique_ptr<UpdateSource>> {
    if (opened++ == 1) return determinate("out of leases");
    return std::make_unique<VectorSource>(&updates);
  });
  ASSERT_FALSE(walker);
  EXPECT_TRUE(walker.error().is(ErrorKind::kDeterminate));
}

TEST(DiffPairWalkerTest, ANullSourceIsInvalidUsage) {
  auto walker = DiffPairWalker::open(
      []() -> Result<std::unique_ptr<UpdateSource>> { return std::unique_ptr<UpdateSource>(); });
  ASSERT_FALSE(walker);
  EXPECT_TRUE(walker.error().is(ErrorKind::kInvalidUsage));
}

TEST(DiffPairWalkerTest, SourceErrorsPropagateFromEitherPassAtEveryPoint) {
  const std::vector<Update> updates = {
      {"a", "1", 1, -2}, {"a", "2", 1, 1}, {"a", "3", 1, 2}, {"b", "1", 1, 1}, {"c", "1", 2, -1}};
  const std::vector<OwnedPair> expected = model_pairs(updates);
  // Fail the first or the second pass at each of its calls, the call after
  // the end of the input included.
  for (int failing_pass = 0; failing_pass < 2; ++failing_pass) {
    for (std::size_t fail_at = 0; fail_at <= updates.size(); ++fail_at) {
      int opened = 0;
      auto pairs = walk([&]() -> Result<std::unique_ptr<UpdateSource>> {
        if (opened++ == failing_pass) return std::make_unique<FailingSource>(&updates, fail_at);
        return std::make_unique<VectorSource>(&updates);
      });
      ASSERT_FALSE(pairs) << "pass " << failing_pass << " failing at " << fail_at;
      EXPECT_TRUE(pairs.error().is(ErrorKind::kIndeterminate)) << pairs.error().to_string();
      EXPECT_EQ(pairs.error().message, "blob read timed out");
    }
  }
}

TEST(DiffPairWalkerTest, PairsBeforeASourceErrorAreCorrect) {
  const std::vector<Update> updates = {{"a", "1", 1, -1}, {"a", "2", 1, 1}, {"b", "1", 1, 1}};
  int opened = 0;
  auto walker = DiffPairWalker::open([&]() -> Result<std::unique_ptr<UpdateSource>> {
    // The afters pass fails when it reads past group "a".
    if (opened++ == 1) return std::make_unique<FailingSource>(&updates, 2);
    return std::make_unique<VectorSource>(&updates);
  });
  ASSERT_TRUE(walker);
  auto first = walker->next();
  ASSERT_TRUE(first && *first) << (first ? "end" : first.error().to_string());
  EXPECT_EQ(owned(**first), pair_of("a", 1, "1", "2", 0));
  auto second = walker->next();
  ASSERT_FALSE(second);
  EXPECT_TRUE(second.error().is(ErrorKind::kIndeterminate));
  auto third = walker->next();
  ASSERT_FALSE(third);
  EXPECT_TRUE(third.error().is(ErrorKind::kIndeterminate));
}

}  // namespace
}  // namespace tidemark
