#include "util/latency_window.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace tidemark {
namespace {

// Buckets 0..7 hold 0..7 us; from 8 us on, a power of two [2^o, 2^(o+1))
// is cut in eight buckets of 2^(o-3) us each.
std::size_t bucket_of(std::uint64_t micros) {
  if (micros < 8) return static_cast<std::size_t>(micros);
  const int octave = std::bit_width(micros) - 1;
  const std::uint64_t sub = (micros >> (octave - 3)) & 7;
  return static_cast<std::size_t>(8 * (octave - 2)) + static_cast<std::size_t>(sub);
}

std::uint64_t middle_of(std::size_t bucket) {
  if (bucket < 8) return bucket;
  const int shift = static_cast<int>(bucket / 8) - 1;  // the octave less 3
  const std::uint64_t lower = (8 + bucket % 8) << shift;
  return lower + ((std::uint64_t{1} << shift) >> 1);
}

std::uint32_t saturating_sum(std::uint32_t a, std::uint64_t b) {
  return static_cast<std::uint32_t>(
      std::min<std::uint64_t>(std::numeric_limits<std::uint32_t>::max(), a + b));
}

static_assert(LatencyHistogram::kBuckets == 8 * (31 - 2) + 8);  // kMaxMicros' octave is 31

}  // namespace

void LatencyHistogram::add(std::chrono::microseconds sample) {
  const std::uint64_t micros = std::min<std::uint64_t>(
      kMaxMicros, static_cast<std::uint64_t>(std::max<std::int64_t>(0, sample.count())));
  const std::size_t bucket = bucket_of(micros);
  counts_[bucket] = saturating_sum(counts_[bucket], 1);
  ++count_;
  sum_micros_ += micros;
  low_ = std::min(low_, bucket);
  high_ = std::max(high_, bucket);
}

void LatencyHistogram::add(const LatencyHistogram& other) {
  if (other.count_ == 0) return;
  for (std::size_t b = other.low_; b <= other.high_; ++b) {
    counts_[b] = saturating_sum(counts_[b], other.counts_[b]);
  }
  count_ += other.count_;
  sum_micros_ += other.sum_micros_;
  low_ = std::min(low_, other.low_);
  high_ = std::max(high_, other.high_);
}

std::uint64_t LatencyHistogram::quantile_micros(double q) const {
  if (count_ == 0) return 0;
  const auto rank = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(count_))));
  std::uint64_t seen = 0;
  for (std::size_t b = low_; b <= high_; ++b) {
    seen += counts_[b];
    if (seen >= rank) return middle_of(b);
  }
  return middle_of(high_);  // a saturated bucket counted fewer than count_
}

void LatencyWindow::add(const LatencyHistogram& samples, Clock::time_point now) {
  if (samples.count() == 0) return;
  const std::int64_t half = half_of(now);
  if (half > current_half_) {
    if (half == current_half_ + 1) {
      previous_ = current_;
    } else {
      previous_.clear();
    }
    current_.clear();
    current_half_ = half;
  }
  // A sample taken a moment before the current half began (by a thread
  // that read the clock earlier) counts in it.
  current_.add(samples);
  count_ += samples.count();
  sum_micros_ += samples.sum_micros();
}

LatencyHistogram LatencyWindow::recent(Clock::time_point now) const {
  const std::int64_t half = half_of(now);
  LatencyHistogram out;
  if (half <= current_half_) {
    out = previous_;
    out.add(current_);
  } else if (half == current_half_ + 1) {
    out = current_;
  }
  return out;
}

}  // namespace tidemark
