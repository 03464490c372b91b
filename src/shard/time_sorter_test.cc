// TimeSorter: the external sort of a listen's window (time_sorter.h).
// Each test names the behaviour it pins down; all compare the sorter's
// output with consolidating the whole input at once and sorting it stably
// by time, which is what a listen emitted before the sorter.
#include "shard/time_sorter.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "tidemark/memory_pool.h"
#include "util/try.h"

namespace tidemark {
namespace {

namespace fs = std::filesystem;

constexpr Diff kMax = std::numeric_limits<Diff>::max();
constexpr Diff kMin = std::numeric_limits<Diff>::min();

// What the listen's old in-memory path gave for a window.
std::vector<Update> reference(std::vector<Update> updates) {
  consolidate(updates);
  std::stable_sort(updates.begin(), updates.end(),
                   [](const Update& a, const Update& b) { return a.time < b.time; });
  return updates;
}

std::vector<Update> in_merge_order(std::vector<Update> updates) {
  std::stable_sort(updates.begin(), updates.end(), [](const Update& a, const Update& b) {
    return compare_key_value_time(a.key, a.value, a.time, b.key, b.value, b.time) < 0;
  });
  return updates;
}

// Feeds `updates` (in merge order) through a sorter and reads it out.
Result<std::vector<Update>> sort_through(TimeSorter& sorter, const std::vector<Update>& updates) {
  for (const Update& u : updates) {
    TM_TRY(sorter.add(UpdateView{u.key, u.value, u.time, u.diff}));
  }
  TM_TRY(sorter.finish());
  std::vector<Update> out;
  for (;;) {
    TM_ASSIGN(const UpdateView* update, sorter.next());
    if (!update) break;
    out.push_back(update->to_owned());
  }
  return out;
}

// A fresh directory, removed afterwards.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    std::string path = (fs::temp_directory_path() / "tidemark-time-sorter-XXXXXX").string();
    EXPECT_NE(::mkdtemp(path.data()), nullptr);
    path_ = path;
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

  // Names in the directory (a scratch file never has one for long).
  std::size_t names() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(path_)) ++n;
    return n;
  }
  // Files this process has open in the directory.
  std::size_t open_files() const {
    std::size_t n = 0;
    for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
      std::error_code error;
      const std::string target = fs::read_symlink(entry.path(), error).string();
      if (!error && target.starts_with(path_ + "/")) ++n;
    }
    return n;
  }

 private:
  std::string path_;
};

// Updates over `times` times, in merge order, with repeats of one
// (key, value, time) (cancelling ones too) and keys updated at many times.
std::vector<Update> random_window(std::uint64_t seed, int count, Time times) {
  std::mt19937_64 rng(seed);
  std::vector<Update> out;
  for (int i = 0; i < count; ++i) {
    Update u{"k" + std::to_string(rng() % 97), "v" + std::to_string(rng() % 5), rng() % times,
             static_cast<Diff>(rng() % 5) - 2};
    if (u.diff == 0) u.diff = 1;
    out.push_back(u);
    if (rng() % 8 == 0) out.push_back(Update{u.key, u.value, u.time, -u.diff});
  }
  return in_merge_order(out);
}

TEST(TimeSorterTest, AWindowThatFitsNeverTouchesTheDisk) {
  ScratchDirectory dir;
  const std::vector<Update> input = random_window(1, 2000, 50);
  TimeSorter sorter(1 << 20, dir.path(), {});
  auto out = sort_through(sorter, input);
  ASSERT_TRUE(out) << out.error().to_string();
  EXPECT_EQ(*out, reference(input));
  EXPECT_EQ(sorter.stats().runs_written, 0u);
}

// A tiny budget: hundreds of runs, merged 64 at a time into longer ones
// (a cascade), then merged once more; the same output as in memory.
TEST(TimeSorterTest, ManyRunsCascadeAndMergeToTheSameOutput) {
  ScratchDirectory dir;
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const std::vector<Update> input = random_window(seed, 8000, 300);
    TimeSorter sorter(600, dir.path(), {});
    auto out = sort_through(sorter, input);
    ASSERT_TRUE(out) << out.error().to_string();
    EXPECT_EQ(*out, reference(input)) << "seed " << seed;
    EXPECT_GT(sorter.stats().runs_written, 64u * 4);
    EXPECT_GE(sorter.stats().merges, 4u);
  }
  EXPECT_EQ(dir.names(), 0u);
}

// Equal (time, key, value) in different runs are summed across them:
// cancelling ones vanish, others come out once.
TEST(TimeSorterTest, DiffsCancelAndSumAcrossRuns) {
  ScratchDirectory dir;
  std::vector<Update> input;
  for (int i = 0; i < 40; ++i) input.push_back(Update{"a", "x", 7, i % 2 == 0 ? 3 : -3});
  for (int i = 0; i < 41; ++i) input.push_back(Update{"b", "y", 7, 1});
  for (Time t = 1; t < 30; ++t) input.push_back(Update{"c", "z", t, 1});
  input = in_merge_order(input);
  // Two updates a run (64 bytes): every repeat is in another run.
  TimeSorter sorter(64, dir.path(), {});
  auto out = sort_through(sorter, input);
  ASSERT_TRUE(out) << out.error().to_string();
  EXPECT_EQ(*out, reference(input));
  EXPECT_EQ(std::count_if(out->begin(), out->end(), [](const Update& u) { return u.key == "a"; }),
            0);
  ASSERT_EQ(std::count_if(out->begin(), out->end(), [](const Update& u) { return u.key == "b"; }),
            1);
  EXPECT_GT(sorter.stats().runs_written, 64u);
}

// A sum past i64 comes out as a carry (update.h), whether its parts were
// in one run or several.
TEST(TimeSorterTest, SumsPastI64AreCarriedAcrossRuns) {
  ScratchDirectory dir;
  std::vector<Update> input;
  for (int i = 0; i < 3; ++i) input.push_back(Update{"max", "", 1, kMax});
  for (int i = 0; i < 2; ++i) input.push_back(Update{"min", "", 2, kMin});
  input.push_back(Update{"min", "", 2, -5});
  input.push_back(Update{"back", "", 3, kMax});
  input.push_back(Update{"back", "", 3, kMax});
  input.push_back(Update{"back", "", 3, -kMax});
  input.push_back(Update{"back", "", 3, -kMax});
  input.push_back(Update{"back", "", 3, 1});
  input = in_merge_order(input);
  for (std::uint64_t budget : {std::uint64_t{64}, std::uint64_t{1} << 20}) {
    TimeSorter sorter(budget, dir.path(), {});
    auto out = sort_through(sorter, input);
    ASSERT_TRUE(out) << out.error().to_string();
    EXPECT_EQ(*out, reference(input)) << "budget " << budget;
    const std::vector<Update> expected = {
        {"max", "", 1, kMax}, {"max", "", 1, kMax}, {"max", "", 1, kMax}, {"min", "", 2, kMin},
        {"min", "", 2, kMin}, {"min", "", 2, -5},   {"back", "", 3, 1}};
    EXPECT_EQ(*out, expected) << "budget " << budget;
  }
}

// An update larger than the whole budget is a run of its own, and still
// sums with its equals.
TEST(TimeSorterTest, AnUpdateLargerThanTheBudgetIsARunOfItsOwn) {
  ScratchDirectory dir;
  const std::string huge(300'000, 'h');
  std::vector<Update> input = random_window(4, 500, 20);
  input.push_back(Update{"huge", huge, 3, 1});
  input.push_back(Update{"huge", huge, 3, 1});
  input.push_back(Update{"huge", huge, 9, 1});
  input.push_back(Update{"huge", huge, 10, -1});
  input.push_back(Update{"huge2", huge, 10, 1});
  input = in_merge_order(input);
  auto pool = MemoryPool::create("reads", 64 << 20);
  {
    TimeSorter sorter(4096, dir.path(), ReadMemory{pool});
    auto out = sort_through(sorter, input);
    ASSERT_TRUE(out) << out.error().to_string();
    EXPECT_EQ(*out, reference(input));
  }
  EXPECT_EQ(pool->used(), 0u);
}

// With a pool, the run and the merge's buffers are charged to it while
// held, within the stated bound, and given back when the sorter goes.
TEST(TimeSorterTest, ItsMemoryIsChargedWithinTheBound) {
  ScratchDirectory dir;
  const std::vector<Update> input = random_window(5, 50'000, 1000);
  for (std::uint64_t budget : {std::uint64_t{4096}, std::uint64_t{64} << 10}) {
    auto pool = MemoryPool::create("reads", 64 << 20);
    {
      TimeSorter sorter(budget, dir.path(), ReadMemory{pool});
      auto out = sort_through(sorter, input);
      ASSERT_TRUE(out) << out.error().to_string();
      EXPECT_EQ(*out, reference(input));
      EXPECT_GT(sorter.stats().runs_written, 0u);
    }
    const std::uint64_t bound =
        budget + (TimeSorter::kMaxFanIn + 1) * TimeSorter::run_buffer_bytes(budget) + 1024;
    EXPECT_GT(pool->stats().peak_used, budget / 2) << "budget " << budget;
    EXPECT_LE(pool->stats().peak_used, bound) << "budget " << budget;
    EXPECT_EQ(pool->used(), 0u);
  }
}

// The merge relies on the input's order, so the sorter checks it, across
// spilled runs too.
TEST(TimeSorterTest, UpdatesOutOfOrderAreRefused) {
  ScratchDirectory dir;
  TimeSorter sorter(128, dir.path(), {});
  ASSERT_TRUE(sorter.add(UpdateView{"b", "1", 5, 1}));
  ASSERT_TRUE(sorter.add(UpdateView{"b", "1", 5, 1}));  // equal: allowed
  ASSERT_TRUE(sorter.add(UpdateView{"b", "1", 6, 1}));  // the run spills here
  auto refused = sorter.add(UpdateView{"a", "9", 9, 1});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_GT(sorter.stats().runs_written, 0u);
  EXPECT_FALSE(sorter.finish());

  TimeSorter within(1 << 20, dir.path(), {});
  ASSERT_TRUE(within.add(UpdateView{"b", "1", 5, 1}));
  EXPECT_FALSE(within.add(UpdateView{"b", "1", 4, 1}));
}

// Scratch files never have a name, and are closed with the sorter.
TEST(TimeSorterTest, ScratchFilesAreNamelessAndGoWithTheSorter) {
  ScratchDirectory dir;
  const std::vector<Update> input = random_window(6, 5000, 100);
  {
    TimeSorter sorter(1024, dir.path(), {});
    for (const Update& u : input)
      ASSERT_TRUE(sorter.add(UpdateView{u.key, u.value, u.time, u.diff}));
    ASSERT_TRUE(sorter.finish());
    auto first = sorter.next();
    ASSERT_TRUE(first && *first);
    EXPECT_GT(dir.open_files(), 1u);
    EXPECT_EQ(dir.names(), 0u);
  }
  EXPECT_EQ(dir.open_files(), 0u);
  EXPECT_EQ(dir.names(), 0u);
}

// A directory that cannot be made fails the sort with an error naming it;
// so does every later call. A window that fits never needs it.
TEST(TimeSorterTest, AScratchDirectoryThatCannotBeMadeIsAnErrorNamingIt) {
  ScratchDirectory dir;
  std::ofstream(dir.path() + "/file") << "not a directory\n";
  const std::string scratch = dir.path() + "/file/scratch";
  const std::vector<Update> input = random_window(7, 2000, 50);
  TimeSorter sorter(1024, scratch, {});
  auto out = sort_through(sorter, input);
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(out.error().message.find(scratch), std::string::npos) << out.error().message;
  EXPECT_FALSE(sorter.finish());

  TimeSorter fits(1 << 20, scratch, {});
  auto in_memory = sort_through(fits, input);
  ASSERT_TRUE(in_memory) << in_memory.error().to_string();
  EXPECT_EQ(*in_memory, reference(input));
}

// A write that fails (here: past RLIMIT_FSIZE, as a full disk would) is an
// error naming the directory, not a crash and not a short answer.
TEST(TimeSorterTest, AFailedScratchWriteIsAnErrorNamingTheDirectory) {
  ScratchDirectory dir;
  const std::vector<Update> input = random_window(8, 20'000, 300);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 1 << 10;  // a run merged from 64 is more
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  TimeSorter sorter(1024, dir.path(), {});
  auto out = sort_through(sorter, input);
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(out.error().message.find(dir.path()), std::string::npos) << out.error().message;
  EXPECT_NE(out.error().message.find("write"), std::string::npos) << out.error().message;
}

}  // namespace
}  // namespace tidemark
