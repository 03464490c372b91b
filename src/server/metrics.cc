#include "server/metrics.h"

#include <cinttypes>
#include <cstdio>

namespace tidemark {

void append_sample(std::string* out, const std::string& name, const std::string& labels,
                   double value) {
  char number[64];
  std::snprintf(number, sizeof number, "%.17g", value);
  out->append(name);
  if (!labels.empty()) out->append("{").append(labels).append("}");
  out->append(" ").append(number).append("\n");
}

void Histogram::observe(double seconds) {
  std::size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(static_cast<std::uint64_t>(seconds * 1e6), std::memory_order_relaxed);
}

void Histogram::render(const std::string& name, std::string* out) const {
  std::uint64_t cumulative = 0;
  char bound[32];
  for (std::size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    if (i < kBounds.size()) {
      std::snprintf(bound, sizeof bound, "%g", kBounds[i]);
    } else {
      std::snprintf(bound, sizeof bound, "+Inf");
    }
    append_sample(out, name + "_bucket", std::string("le=\"") + bound + "\"",
                  static_cast<double>(cumulative));
  }
  append_sample(out, name + "_sum", "",
                static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6);
  append_sample(out, name + "_count", "",
                static_cast<double>(count_.load(std::memory_order_relaxed)));
}

void Metrics::count_request(const std::string& route, unsigned status) {
  std::lock_guard lock(mutex_);
  ++requests_[{route, status}];
}

void Metrics::render(std::string* out) const {
  out->append("# HELP tidemark_http_requests_total HTTP requests answered, by route and status.\n");
  out->append("# TYPE tidemark_http_requests_total counter\n");
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, count] : requests_) {
      append_sample(out, "tidemark_http_requests_total",
                    "route=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"",
                    static_cast<double>(count));
    }
  }
  out->append(
      "# HELP tidemark_append_commit_seconds From the end of a managed append's body to its "
      "records being durable.\n");
  out->append("# TYPE tidemark_append_commit_seconds histogram\n");
  commit_latency_.render("tidemark_append_commit_seconds", out);
}

}  // namespace tidemark
