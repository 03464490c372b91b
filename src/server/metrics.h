// Metrics: the server's counters and histograms, rendered in the Prometheus
// text format by the server's /metrics route (Server::Impl::render_metrics,
// in metrics.cc, which adds the pools, the open shards and the sinks).
//
// Memory: one counter per (route, status) seen (routes are the fixed route
// names, not paths) and a fixed set of histogram buckets.
//
// Thread-safety: all methods are safe for concurrent use.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace tidemark {

// A histogram of seconds with fixed buckets.
class Histogram {
 public:
  static constexpr std::array<double, 12> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,   0.25,   0.5,   1,    2.5,   10};
  void observe(double seconds);
  // Appends `name`'s _bucket, _sum and _count lines.
  void render(const std::string& name, std::string* out) const;

 private:
  std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_micros_{0};
};

class Metrics {
 public:
  void count_request(const std::string& route, unsigned status);
  Histogram& commit_latency() { return commit_latency_; }
  // # TYPE lines and samples of what Metrics holds.
  void render(std::string* out) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, unsigned>, std::uint64_t> requests_;
  Histogram commit_latency_;
};

// Appends one sample line: name{labels} value.
void append_sample(std::string* out, const std::string& name, const std::string& labels,
                   double value);

}  // namespace tidemark
