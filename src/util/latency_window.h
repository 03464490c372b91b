// LatencyWindow: how long something took, as a count and a sum since the
// start and as quantiles over the last few seconds, in fixed memory.
//
// Samples are durations in whole microseconds, counted in a
// LatencyHistogram's log-scaled buckets: one per microsecond below 8 us,
// then eight to each power of two up to kMaxMicros (about 71 minutes;
// longer samples count as kMaxMicros). A quantile is read as the middle of
// its bucket, within 1/16 of the sample's true value.
//
// The window is two histograms, one per kHalf of steady time (aligned to
// the clock's epoch): the quantiles cover the samples of the current half
// and the one before, so the last kHalf to 2 x kHalf. A half with no
// samples reads as empty, so an idle owner's quantiles say nothing rather
// than repeat old figures.
//
// Memory: a LatencyHistogram is 960 bytes of counts (kBuckets x 4) plus a
// few words whatever the number of samples; a LatencyWindow two of them.
// A bucket of one histogram saturates at 2^32 - 1 samples.
//
// Thread-safety: none; the owner serializes access. Gathering a batch's
// samples into a LatencyHistogram of its own, then adding that to the
// window, keeps the per-sample work out of the owner's lock.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace tidemark {

class LatencyHistogram {
 public:
  static constexpr std::uint64_t kMaxMicros = (std::uint64_t{1} << 32) - 1;
  static constexpr std::size_t kBuckets = 240;

  void add(std::chrono::microseconds sample);
  void add(const LatencyHistogram& other);
  void clear() { *this = LatencyHistogram(); }

  std::uint64_t count() const { return count_; }
  // Of the samples, each taken at most kMaxMicros.
  std::uint64_t sum_micros() const { return sum_micros_; }
  // The sample of rank ceil(q x count) (at least the first), as the middle
  // of its bucket; 0 when there is none. REQUIRES: 0 <= q <= 1.
  std::uint64_t quantile_micros(double q) const;

 private:
  std::array<std::uint32_t, kBuckets> counts_{};
  std::uint64_t count_ = 0;
  std::uint64_t sum_micros_ = 0;
  // The buckets in use are within [low_, high_] (none when low_ > high_):
  // adding a small histogram costs its span, not kBuckets.
  std::size_t low_ = kBuckets;
  std::size_t high_ = 0;
};

class LatencyWindow {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kHalf{10};

  // Samples taken by `now`.
  void add(const LatencyHistogram& samples, Clock::time_point now);

  // Since the window was made.
  std::uint64_t count() const { return count_; }
  std::uint64_t sum_micros() const { return sum_micros_; }
  // The samples of the last kHalf to 2 x kHalf before `now`.
  LatencyHistogram recent(Clock::time_point now) const;

 private:
  static std::int64_t half_of(Clock::time_point t) { return t.time_since_epoch() / kHalf; }

  LatencyHistogram current_;   // samples of half current_half_
  LatencyHistogram previous_;  // samples of half current_half_ - 1
  std::int64_t current_half_ = 0;
  std::uint64_t count_ = 0;
  std::uint64_t sum_micros_ = 0;
};

}  // namespace tidemark
