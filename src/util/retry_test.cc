#include "tidemark/retry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace tidemark {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(RetryTest, OnlyInfrastructureFailuresAreRetryable) {
  EXPECT_TRUE(is_retryable(determinate("x").error()));
  EXPECT_TRUE(is_retryable(indeterminate("x").error()));
  EXPECT_FALSE(is_retryable(invalid_usage("x").error()));
  EXPECT_FALSE(is_retryable(corruption("x").error()));
  EXPECT_FALSE(is_retryable(make_error(ErrorKind::kNotFound, "x").error()));
}

TEST(RetryTest, StopsAfterMaxAttempts) {
  int calls = 0;
  auto result = with_retries(RetryPolicy{milliseconds(1), milliseconds(2), 4, {}}, [&]() -> Status {
    ++calls;
    return determinate("down");
  });
  EXPECT_EQ(calls, 4);
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().kind, ErrorKind::kDeterminate);
  EXPECT_NE(result.error().message.find("gave up after 4 attempts"), std::string::npos)
      << result.error().message;
}

TEST(RetryTest, StopsAtTheDeadlineAndNeverSleepsPastIt) {
  const auto started = Clock::now();
  int calls = 0;
  auto result = with_retries(RetryPolicy{milliseconds(40), milliseconds(80), 0, milliseconds(150)},
                             [&]() -> Status {
                               ++calls;
                               return indeterminate("slow");
                             });
  const auto took = Clock::now() - started;
  ASSERT_FALSE(result);
  EXPECT_GE(calls, 2);
  EXPECT_GE(took, milliseconds(150));
  EXPECT_LT(took, milliseconds(400));
}

TEST(RetryTest, SucceedsOnceTheFailurePasses) {
  int calls = 0;
  auto result = with_retries(RetryPolicy{milliseconds(1), milliseconds(1), 0, milliseconds(5000)},
                             [&]() -> Result<int> {
                               if (++calls < 5) return determinate("not yet");
                               return 42;
                             });
  ASSERT_TRUE(result);
  EXPECT_EQ(*result, 42);
  EXPECT_EQ(calls, 5);
}

TEST(RetryTest, DoesNotRetryWhatCannotPass) {
  int calls = 0;
  auto result =
      with_retries(RetryPolicy{milliseconds(1), milliseconds(1), 10, {}}, [&]() -> Status {
        ++calls;
        return invalid_usage("no");
      });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(result.error().message, "no");
}

TEST(RetryTest, StopEndsTheWait) {
  const auto started = Clock::now();
  std::atomic<bool> stop{false};
  Backoff backoff(RetryPolicy{milliseconds(10'000), milliseconds(10'000), 0, milliseconds(60'000)});
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(100));
    stop = true;
  });
  EXPECT_FALSE(backoff.next([&] { return stop.load(); }));
  stopper.join();
  EXPECT_LT(Clock::now() - started, milliseconds(2000));
}

TEST(RetryTest, WaitsGrowWithJitterUpToTheCeiling) {
  Backoff backoff(RetryPolicy{milliseconds(8), milliseconds(32), 7, {}});
  std::vector<milliseconds> waits;
  for (;;) {
    const auto before = Clock::now();
    if (!backoff.next()) break;
    waits.push_back(std::chrono::duration_cast<milliseconds>(Clock::now() - before));
  }
  ASSERT_EQ(waits.size(), 6u);
  EXPECT_EQ(backoff.attempts(), 7);
  // Ceilings 8, 16, 32, 32, ...: each wait is at least half of its ceiling
  // (the upper bound allows for a loaded machine's late wake-ups).
  const int ceilings[] = {8, 16, 32, 32, 32, 32};
  for (std::size_t i = 0; i < waits.size(); ++i) {
    EXPECT_GE(waits[i].count(), ceilings[i] / 2) << i;
    EXPECT_LE(waits[i].count(), ceilings[i] + 500) << i;
  }
}

// next_wait: the same waits for a caller that waits on a timer, with
// nothing slept here; the attempts it allows and the deadline bound them.
TEST(RetryTest, NextWaitGivesTheWaitsWithoutSleeping) {
  using std::chrono::milliseconds;
  Backoff backoff(RetryPolicy{milliseconds(8), milliseconds(64), 6, {}});
  const auto start = std::chrono::steady_clock::now();
  milliseconds ceiling(8);
  for (int i = 0; i < 5; ++i) {
    auto wait = backoff.next_wait();
    ASSERT_TRUE(wait) << i;
    EXPECT_GE(*wait, ceiling / 2) << i;
    EXPECT_LE(*wait, ceiling) << i;
    ceiling = std::min(ceiling * 2, milliseconds(64));
  }
  EXPECT_EQ(backoff.attempts(), 6);
  EXPECT_FALSE(backoff.next_wait());  // six attempts made
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(50));

  Backoff bounded(RetryPolicy{milliseconds(1000), milliseconds(1000), 0, milliseconds(30)});
  auto first = bounded.next_wait();
  ASSERT_TRUE(first);
  EXPECT_LE(*first, milliseconds(30));  // never past the deadline
  std::this_thread::sleep_for(milliseconds(40));
  EXPECT_FALSE(bounded.next_wait());
}

}  // namespace
}  // namespace tidemark
