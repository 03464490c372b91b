// Metrics and Histogram (metrics.h), and the server's whole /metrics page
// (Server::Impl::render_metrics): its pools, the requests in flight, the
// open shards and their appenders (the shard registry), the sinks and the
// request counters.
#include "server/metrics.h"

#include <cinttypes>
#include <cstdio>
#include <tuple>

#include "server/server_impl.h"

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

std::string Server::Impl::render_metrics() {
  std::string out;
  const std::pair<const char*, const MemoryPool*> pools[] = {{"server", root.get()},
                                                             {"requests", requests.get()},
                                                             {"appenders", appenders.get()},
                                                             {"reads", reads.get()},
                                                             {"sinks", sink_pool.get()}};
  const std::tuple<const char*, const char*, std::uint64_t (*)(const MemoryPool&)> gauges[] = {
      {"tidemark_pool_used_bytes", "Bytes held in the server's memory pools.",
       [](const MemoryPool& p) { return p.used(); }},
      {"tidemark_pool_capacity_bytes", "Capacity of the server's memory pools.",
       [](const MemoryPool& p) { return p.capacity(); }},
      {"tidemark_pool_peak_bytes", "The most bytes a pool has held.",
       [](const MemoryPool& p) { return p.stats().peak_used; }}};
  for (const auto& [metric, help, read] : gauges) {
    out.append("# HELP ").append(metric).append(" ").append(help).append("\n");
    out.append("# TYPE ").append(metric).append(" gauge\n");
    for (const auto& [name, pool] : pools) {
      append_sample(&out, metric, std::string("pool=\"") + name + "\"",
                    static_cast<double>(read(*pool)));
    }
  }
  out.append(
      "# HELP tidemark_http_requests_in_flight Requests read and not yet answered (open "
      "streams included).\n# TYPE tidemark_http_requests_in_flight gauge\n");
  append_sample(&out, "tidemark_http_requests_in_flight", "", in_flight.load());
  const ShardRegistry::Contents open = shards.contents();
  out.append(
      "# HELP tidemark_open_shards Shards this server has open (idle ones are closed).\n"
      "# TYPE tidemark_open_shards gauge\n");
  append_sample(&out, "tidemark_open_shards", "", static_cast<double>(open.shards.size()));
  out.append(
      "# HELP tidemark_open_appenders Shards with an open appender (managed appends).\n"
      "# TYPE tidemark_open_appenders gauge\n");
  append_sample(&out, "tidemark_open_appenders", "", static_cast<double>(open.appenders.size()));
  out.append(
      "# HELP tidemark_open_writers Shards with an open writer (explicit appends).\n"
      "# TYPE tidemark_open_writers gauge\n");
  append_sample(&out, "tidemark_open_writers", "", static_cast<double>(open.writers));
  out.append(
      "# HELP tidemark_idle_closed_total Appenders and writers closed after idle_close "
      "without a request.\n# TYPE tidemark_idle_closed_total counter\n");
  append_sample(&out, "tidemark_idle_closed_total", "", static_cast<double>(open.idle_closed));
  out.append(
      "# HELP tidemark_appenders_replaced_total Appenders an error stopped (a backend down "
      "past their retries) and a later append replaced.\n# TYPE "
      "tidemark_appenders_replaced_total counter\n");
  append_sample(&out, "tidemark_appenders_replaced_total", "",
                static_cast<double>(open.appenders_replaced));
  out.append("# HELP tidemark_appender_queue_bytes Bytes queued in a shard's appender.\n");
  out.append("# TYPE tidemark_appender_queue_bytes gauge\n");
  // The appenders' counters, one family each (name, help, field).
  struct Counter {
    const char* name;
    const char* help;
    std::uint64_t AppenderStats::*field;
    std::string samples;
  };
  Counter counters[] = {
      {"tidemark_appender_batches_committed_total",
       "Batches committed; divided by commits: batches per commit.",
       &AppenderStats::batches_committed,
       {}},
      {"tidemark_appender_commits_total",
       "compare_and_append calls that succeeded.",
       &AppenderStats::commits,
       {}},
      {"tidemark_appender_records_committed_total",
       "Records made durable.",
       &AppenderStats::records_committed,
       {}},
      {"tidemark_appender_mismatches_total",
       "compare_and_append calls that lost to another writer (another process).",
       &AppenderStats::mismatches,
       {}},
      {"tidemark_appender_retimed_batches_total",
       "Batches rebuilt at a later time after a lost compare_and_append.",
       &AppenderStats::retimed_batches,
       {}},
  };
  // The appenders' latencies, a summary each: the median and 99th
  // percentile of the last 10 to 20 s (absent when it had no commit),
  // and the sum and count since the appender opened.
  struct Latency {
    std::string name;
    const char* help;
    AppenderLatency AppenderStats::*field;
    std::string samples;
  };
  Latency latencies[] = {
      {"tidemark_appender_commit_latency_seconds",
       "From a record's enqueue to its commit being durable: what a producer waits.",
       &AppenderStats::commit_latency,
       {}},
      {"tidemark_appender_commit_call_seconds",
       "A commit's compare_and_append call alone.",
       &AppenderStats::commit_call,
       {}},
  };
  for (const auto& [name, a] : open.appenders) {
    const AppenderStats stats = a->stats();
    const std::string label = "shard=\"" + name + "\"";
    append_sample(&out, "tidemark_appender_queue_bytes", label,
                  static_cast<double>(stats.pool.used));
    for (Counter& counter : counters) {
      append_sample(&counter.samples, counter.name, label,
                    static_cast<double>(stats.*counter.field));
    }
    for (Latency& latency : latencies) {
      const AppenderLatency& figures = stats.*latency.field;
      if (figures.recent > 0) {
        append_sample(&latency.samples, latency.name, label + ",quantile=\"0.5\"",
                      static_cast<double>(figures.p50_micros) / 1e6);
        append_sample(&latency.samples, latency.name, label + ",quantile=\"0.99\"",
                      static_cast<double>(figures.p99_micros) / 1e6);
      }
      append_sample(&latency.samples, latency.name + "_sum", label,
                    static_cast<double>(figures.sum_micros) / 1e6);
      append_sample(&latency.samples, latency.name + "_count", label,
                    static_cast<double>(figures.count));
    }
  }
  for (const Counter& counter : counters) {
    out.append("# HELP ").append(counter.name).append(" ").append(counter.help).append("\n");
    out.append("# TYPE ").append(counter.name).append(" counter\n");
    out += counter.samples;
  }
  for (const Latency& latency : latencies) {
    out.append("# HELP ").append(latency.name).append(" ").append(latency.help).append("\n");
    out.append("# TYPE ").append(latency.name).append(" summary\n");
    out += latency.samples;
  }
  out.append("# HELP tidemark_shard_upper A shard's upper (absent when closed).\n");
  out.append("# TYPE tidemark_shard_upper gauge\n");
  for (const auto& [name, s] : open.shards) {
    auto upper = s->upper();
    if (upper && !upper->is_closed()) {
      append_sample(&out, "tidemark_shard_upper", "shard=\"" + name + "\"",
                    static_cast<double>(upper->time()));
    }
  }
  sinks->render_metrics(&out);
  metrics.render(&out);
  return out;
}

}  // namespace tidemark
