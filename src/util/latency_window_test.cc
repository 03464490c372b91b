#include "util/latency_window.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace tidemark {
namespace {

using std::chrono::microseconds;
using std::chrono::seconds;

TEST(LatencyHistogramTest, IsEmptyUntilASampleComes) {
  LatencyHistogram h;
  EXPECT_EQ(h.count(), 0u);
  EXPECT_EQ(h.sum_micros(), 0u);
  EXPECT_EQ(h.quantile_micros(0.5), 0u);
  EXPECT_EQ(h.quantile_micros(0.99), 0u);
}

TEST(LatencyHistogramTest, SmallSamplesAreExactLargerOnesWithinOneSixteenth) {
  for (std::uint64_t v : {0ull, 1ull, 7ull}) {
    LatencyHistogram h;
    h.add(microseconds(v));
    EXPECT_EQ(h.quantile_micros(0.5), v);
  }
  for (std::uint64_t v = 8; v < LatencyHistogram::kMaxMicros; v = v * 3 / 2 + 1) {
    LatencyHistogram h;
    h.add(microseconds(v));
    const double read = static_cast<double>(h.quantile_micros(0.5));
    EXPECT_LE(std::abs(read - static_cast<double>(v)), static_cast<double>(v) / 16) << v;
    EXPECT_EQ(h.sum_micros(), v);
  }
  // Past the range: counted as its top, not lost or wrapped.
  LatencyHistogram h;
  h.add(microseconds(LatencyHistogram::kMaxMicros * 4));
  h.add(microseconds(-5));
  EXPECT_EQ(h.count(), 2u);
  EXPECT_EQ(h.sum_micros(), LatencyHistogram::kMaxMicros);
  EXPECT_GE(h.quantile_micros(1), LatencyHistogram::kMaxMicros / 16 * 15);
  EXPECT_EQ(h.quantile_micros(0.5), 0u);
}

TEST(LatencyHistogramTest, QuantilesFollowTheSamplesRanks) {
  std::vector<std::uint64_t> samples;
  std::mt19937_64 random(7);
  for (int i = 0; i < 10'000; ++i) samples.push_back(100 + random() % 100'000);
  LatencyHistogram h;
  for (std::uint64_t s : samples) h.add(microseconds(s));
  std::sort(samples.begin(), samples.end());
  for (double q : {0.01, 0.5, 0.9, 0.99, 1.0}) {
    const auto rank = static_cast<std::size_t>(std::ceil(q * 10'000));
    const double truth = static_cast<double>(samples[rank - 1]);
    EXPECT_NEAR(static_cast<double>(h.quantile_micros(q)), truth, truth / 16) << q;
  }
  // Adding histograms is adding their samples.
  LatencyHistogram halves, second;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    (i % 2 == 0 ? halves : second).add(microseconds(samples[i]));
  }
  halves.add(second);
  EXPECT_EQ(halves.count(), h.count());
  EXPECT_EQ(halves.sum_micros(), h.sum_micros());
  for (double q : {0.5, 0.99}) EXPECT_EQ(halves.quantile_micros(q), h.quantile_micros(q));
}

// The window's quantiles cover the last one to two halves; its count and
// sum cover everything.
TEST(LatencyWindowTest, ForgetsSamplesOlderThanTwoHalves) {
  using Clock = LatencyWindow::Clock;
  const Clock::time_point start{LatencyWindow::kHalf * 1000};  // a half's first instant
  LatencyHistogram slow, fast;
  slow.add(microseconds(50'000));
  fast.add(microseconds(1'000));
  LatencyWindow window;
  EXPECT_EQ(window.recent(start).count(), 0u);
  window.add(slow, start);
  EXPECT_NEAR(static_cast<double>(window.recent(start).quantile_micros(0.5)), 50'000, 50'000 / 16);
  // The next half: both count.
  window.add(fast, start + LatencyWindow::kHalf);
  LatencyHistogram both = window.recent(start + LatencyWindow::kHalf + seconds(1));
  EXPECT_EQ(both.count(), 2u);
  EXPECT_NEAR(static_cast<double>(both.quantile_micros(1)), 50'000, 50'000 / 16);
  // The half after: the slow sample has gone, the fast one stays.
  LatencyHistogram later = window.recent(start + 2 * LatencyWindow::kHalf);
  EXPECT_EQ(later.count(), 1u);
  EXPECT_NEAR(static_cast<double>(later.quantile_micros(1)), 1'000, 1'000 / 16);
  // Two halves with none: nothing recent; the totals remain.
  EXPECT_EQ(window.recent(start + 3 * LatencyWindow::kHalf).count(), 0u);
  EXPECT_EQ(window.count(), 2u);
  EXPECT_EQ(window.sum_micros(), 51'000u);
  // A sample after a gap does not bring old ones back.
  window.add(fast, start + 5 * LatencyWindow::kHalf);
  EXPECT_EQ(window.recent(start + 5 * LatencyWindow::kHalf).count(), 1u);
  EXPECT_EQ(window.count(), 3u);
}

}  // namespace
}  // namespace tidemark
