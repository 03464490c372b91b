// tidemark bench appender: the background appender
// under a closed loop of producers, on the embedded default (file blob +
// SQLite) in a scratch directory, with latency injected into the blob or
// the consensus (FaultyBlob / FaultyConsensus, latency only, no errors), or
// against `--blob URL --consensus URL` (S3 + PostgreSQL, say; latency can
// still be injected on top).
//
//   tidemark bench appender [--producers N] [--record-bytes B]
//       [--queue bytes[:SIZE]|records[:N]] [--batch-appends on|off]
//       [--blob-latency-ms L] [--consensus-latency-ms L] [--duration S]
//       [--blob URL --consensus URL] [--json]
//
// N producer threads, each with its own AppendSender, loop until the
// deadline: enqueue one record of B bytes (a unique JSON string key such
// as "p12-345" and a JSON string value padded to the size) with a token,
// waiting for capacity and retrying when the queue is Full, then wait for
// the token. A record's latency runs from its first enqueue attempt to its
// token's resolution.
//
// The first second is a warm-up (when --duration is at least 2 s): records
// resolved in it, and commits made in it, are left out of the figures.
// The figures cover the window from the end of the warm-up to the
// deadline: records whose tokens resolved in the window, their latencies
// (p50/p90/p99), and the appender's commits and batches in the window.
//
//   throughput         records resolved in the window / the window's length
//   ideal              with latency injected: N / (blob + consensus latency).
//                      Every record waits for at least one blob write (its
//                      part) and then one consensus write (the commit), so a
//                      closed loop of N producers cannot beat N records per
//                      that round trip; with blob latency alone it is the
//                      issue's "N / 200 ms"
//   batches per commit batches committed / compare_and_append calls
//   commit call        each compare_and_append that succeeded, p50/p99 over
//                      the last seconds before the deadline
//                      (AppenderStats::commit_call), and the whole run's
//                      write stall (stall_ms: the committer waiting for
//                      compaction)
//   peak pool use      the appender's pool, sampled every 1 ms, and the
//                      pool's own peak_used; shown against the capacity and
//                      "capacity + one enqueue call" (capacity plus one
//                      record's charge: B + kRecordOverheadBytes). In records
//                      mode the pool is unlimited and only measures.
//
// Afterwards the appender is closed and a snapshot of the shard (read
// without injected latency) must hold exactly the records whose tokens
// reported a commit; otherwise that is a correctness failure: the command
// says so and exits 1. So does a token that failed although no error was
// injected. Benchmarks report figures; they never pass or fail on time.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <latch>
#include <mutex>
#include <thread>

#include "bench_util.h"
#include "cli/cli.h"
#include "location/faulty.h"
#include "tidemark/appender.h"
#include "tidemark/read.h"
#include "util/size.h"
#include "util/try.h"

namespace tidemark::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kAppenderUsage =
    "bench appender [--producers N] [--record-bytes B] [--queue bytes[:SIZE]|records[:N]] "
    "[--batch-appends on|off] [--blob-latency-ms L] [--consensus-latency-ms L] "
    "[--duration S] [--blob URL --consensus URL] [--json]";

// Room for the longest key ("p" + producer + "-" + sequence, quoted) and
// the quotes of the value.
constexpr std::uint64_t kMinRecordBytes = 40;

struct Options {
  std::size_t producers = 1000;
  std::uint64_t record_bytes = 100;
  std::uint64_t queue_bytes = 64ull << 20;
  std::optional<std::size_t> queue_records;
  bool batch_appends = true;
  double blob_latency_ms = 0;
  double consensus_latency_ms = 0;
  double duration_s = 10;
  bool json = false;
};

// What one producer saw.
struct ProducerResult {
  std::vector<float> latencies_ms;  // records resolved in the window
  std::uint64_t committed = 0;      // every record whose token reported a commit
  std::uint64_t failed = 0;         // tokens that failed, enqueues refused other than Full
  std::optional<Error> first_error;
};

struct Figures {
  double warmup_s = 0, window_s = 0;
  std::uint64_t window_records = 0;
  double throughput = 0;
  std::optional<double> ideal;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0;
  std::uint64_t window_commits = 0, window_batches = 0;
  std::uint64_t commits = 0, batches = 0;  // whole run
  std::uint64_t mismatches = 0, retimed_batches = 0;
  std::uint64_t committed_tokens = 0, failed = 0;
  std::optional<Error> first_error;
  std::uint64_t peak_sampled = 0, peak_stats = 0;
  std::optional<std::uint64_t> capacity;  // nullopt: unlimited (records mode)
  std::uint64_t record_charge = 0;
  std::uint64_t pool_waits = 0;
  // The compare_and_append calls of the last seconds before the deadline
  // (AppenderStats::commit_call), and the whole run's write stall.
  double call_p50_ms = 0, call_p99_ms = 0;
  std::uint64_t stall_ms = 0;
  std::uint64_t snapshot_rows = 0;
  std::int64_t snapshot_diffs = 0;
};

double percentile_sorted(const std::vector<float>& sorted, double p) {
  if (sorted.empty()) return 0;
  std::size_t index = static_cast<std::size_t>(p * (sorted.size() - 1) + 0.5);
  return sorted[std::min(index, sorted.size() - 1)];
}

Result<double> parse_number(const std::string& flag, const std::string& text) {
  try {
    std::size_t used = 0;
    double v = std::stod(text, &used);
    if (used != text.size() || !(v >= 0)) throw std::invalid_argument(text);
    return v;
  } catch (...) {
    return invalid_usage(flag + " takes a non-negative number, got \"" + text + "\"");
  }
}

Result<std::uint64_t> parse_count(const std::string& flag, const std::string& text) {
  try {
    std::size_t used = 0;
    unsigned long long v = std::stoull(text, &used);
    if (used != text.size() || v == 0 || text.front() == '-') throw std::invalid_argument(text);
    return static_cast<std::uint64_t>(v);
  } catch (...) {
    return invalid_usage(flag + " takes a positive integer, got \"" + text + "\"");
  }
}

Result<Options> parse_options(const Args& args) {
  Options o;
  if (auto v = args.get("--producers")) {
    TM_ASSIGN(std::uint64_t n, parse_count("--producers", *v));
    if (n > 100'000) return invalid_usage("--producers is at most 100000");
    o.producers = static_cast<std::size_t>(n);
  }
  if (auto v = args.get("--record-bytes")) {
    TM_ASSIGN(o.record_bytes, parse_count("--record-bytes", *v));
    if (o.record_bytes < kMinRecordBytes) {
      return invalid_usage("--record-bytes is at least " + std::to_string(kMinRecordBytes) +
                           " (a unique key and a JSON string value)");
    }
  }
  if (auto v = args.get("--queue")) {
    if (v->starts_with("bytes:")) {
      TM_ASSIGN(o.queue_bytes, parse_size(std::string_view(*v).substr(6)));
      if (o.queue_bytes == 0) return invalid_usage("--queue bytes:SIZE must be positive");
    } else if (v->starts_with("records:")) {
      TM_ASSIGN(std::uint64_t n, parse_count("--queue records:N", v->substr(8)));
      o.queue_records = static_cast<std::size_t>(n);
    } else if (*v == "records") {
      o.queue_records = kDefaultQueueRecords;
    } else if (*v == "bytes") {
      o.queue_bytes = AppenderOptions{}.queue_bytes;
    } else {
      return invalid_usage("--queue takes bytes:SIZE or records:N, got \"" + *v + "\"");
    }
  }
  if (auto v = args.get("--batch-appends")) {
    if (*v != "on" && *v != "off") return invalid_usage("--batch-appends takes on or off");
    o.batch_appends = *v == "on";
  }
  if (auto v = args.get("--blob-latency-ms")) {
    TM_ASSIGN(o.blob_latency_ms, parse_number("--blob-latency-ms", *v));
  }
  if (auto v = args.get("--consensus-latency-ms")) {
    TM_ASSIGN(o.consensus_latency_ms, parse_number("--consensus-latency-ms", *v));
  }
  if (auto v = args.get("--duration")) {
    TM_ASSIGN(o.duration_s, parse_number("--duration", *v));
    if (o.duration_s <= 0) return invalid_usage("--duration must be positive");
  }
  if (!o.queue_records && o.record_bytes + kRecordOverheadBytes > o.queue_bytes) {
    return invalid_usage("--queue bytes:SIZE must hold one record (" +
                         std::to_string(o.record_bytes + kRecordOverheadBytes) + " bytes)");
  }
  o.json = args.has("--json");
  return o;
}

FaultConfig latency_only(double ms) {
  FaultConfig config;
  config.latency = std::chrono::microseconds(static_cast<std::int64_t>(ms * 1000));
  return config;
}

// The record producer `p` sends `seq`-th: `bytes` of key and value.
AppendRecord make_record(std::size_t p, std::uint64_t seq, std::uint64_t bytes) {
  AppendRecord r;
  r.key = "\"p" + std::to_string(p) + "-" + std::to_string(seq) + "\"";
  r.value.assign("\"");
  r.value.resize(bytes - r.key.size() - 1, 'x');
  r.value.push_back('"');
  return r;
}

std::string queue_text(const Options& o) {
  return o.queue_records ? "records:" + std::to_string(*o.queue_records)
                         : "bytes:" + std::to_string(o.queue_bytes);
}

// Counts the rows and sums the diffs of the shard's snapshot at upper - 1,
// read through a client without injected latency.
Status verify_snapshot(const BenchPlace& place, Figures* f) {
  TM_ASSIGN(auto client, Client::open(place.blob, place.consensus));
  TM_ASSIGN(auto shard, client->open_shard(place.shard("appender")));
  TM_ASSIGN(Frontier upper, shard->upper());
  if (upper.is_closed()) return determinate("the shard's upper is closed");
  if (upper.time() == 0) return {};  // nothing was ever committed
  TM_ASSIGN(SnapshotCursor cursor, shard->snapshot(upper.time() - 1));
  for (;;) {
    TM_ASSIGN(auto row, cursor.next());
    if (!row) break;
    ++f->snapshot_rows;
    f->snapshot_diffs += row->diff;
  }
  return {};
}

Result<Figures> run(const Options& o, const BenchPlace& place) {
  Figures f;
  TM_ASSIGN(auto real_blob, open_blob(place.blob));
  TM_ASSIGN(auto real_consensus, open_consensus(place.consensus));
  auto blob = std::make_shared<FaultyBlob>(real_blob, latency_only(o.blob_latency_ms));
  auto consensus =
      std::make_shared<FaultyConsensus>(real_consensus, latency_only(o.consensus_latency_ms));
  TM_ASSIGN(auto client, Client::open(Location{blob, consensus}));
  TM_TRY(client->create_shard(place.shard("appender")));
  TM_ASSIGN(auto shard, client->open_shard(place.shard("appender")));

  AppenderOptions options;
  options.queue_bytes = o.queue_bytes;
  options.queue_records = o.queue_records;
  options.batch_appends = o.batch_appends;
  TM_ASSIGN(auto appender, Appender::open(shard, options));
  f.record_charge = o.record_bytes + kRecordOverheadBytes;
  if (!o.queue_records) f.capacity = appender->pool()->capacity();

  // The schedule, written before `go` opens and read by the producers after.
  f.warmup_s = o.duration_s >= 2 ? 1.0 : 0.0;
  Clock::time_point start, warm_end, deadline;
  std::latch go(1);
  std::vector<ProducerResult> results(o.producers);
  std::mutex done_mu;
  std::condition_variable done_cv;
  std::size_t done = 0;

  std::vector<std::thread> producers;
  producers.reserve(o.producers);
  for (std::size_t p = 0; p < o.producers; ++p) {
    producers.emplace_back([&, p, sender = appender->sender()]() mutable {
      ProducerResult& out = results[p];
      go.wait();
      for (std::uint64_t seq = 0; Clock::now() < deadline; ++seq) {
        AppendRecord record = make_record(p, seq, o.record_bytes);
        const auto attempt = Clock::now();
        std::optional<CommitToken> token;
        for (;;) {
          auto queued = sender.enqueue_with_token(record);  // a copy: Full refuses it
          if (queued) {
            token = *queued;
            break;
          }
          if (!queued.error().is(ErrorKind::kFull)) {
            ++out.failed;
            if (!out.first_error) out.first_error = queued.error();
            break;
          }
          sender.wait_for_capacity();
        }
        if (!token) break;
        auto time = token->wait();
        const auto resolved = Clock::now();
        if (!time) {
          ++out.failed;
          if (!out.first_error) out.first_error = time.error();
          break;
        }
        ++out.committed;
        if (resolved >= warm_end && resolved < deadline) {
          out.latencies_ms.push_back(
              std::chrono::duration<float, std::milli>(resolved - attempt).count());
        }
      }
      {
        std::lock_guard lock(done_mu);
        ++done;
      }
      done_cv.notify_all();
    });
  }

  std::atomic<bool> sampling{true};
  std::atomic<std::uint64_t> peak_sampled{0};
  std::thread sampler([&] {
    std::uint64_t peak = 0;
    while (sampling.load(std::memory_order_relaxed)) {
      peak = std::max(peak, appender->pool()->used());
      peak_sampled.store(peak, std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  start = Clock::now();
  warm_end = start +
             std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(f.warmup_s));
  deadline = start + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(o.duration_s));
  go.count_down();

  std::this_thread::sleep_until(warm_end);
  AppenderStats at_warm_end = appender->stats();
  std::this_thread::sleep_until(deadline);
  AppenderStats at_deadline = appender->stats();

  // Every producer finishes its last record after the deadline. One that
  // is still waiting long after is a hang: say so, with the appender's
  // state, and stop here.
  const double grace_s = std::max(60.0, 50 * (o.blob_latency_ms + o.consensus_latency_ms) / 1000.0);
  {
    std::unique_lock lock(done_mu);
    bool finished = done_cv.wait_for(lock, std::chrono::duration<double>(grace_s),
                                     [&] { return done == o.producers; });
    if (!finished) {
      AppenderStats s = appender->stats();
      std::fprintf(stderr,
                   "tidemark: bench appender: %zu of %zu producers still wait %.0f s after the "
                   "deadline (a hang): commits %llu, batches %llu, records committed %llu, "
                   "queued records %llu, pool used %llu\n",
                   o.producers - done, o.producers, grace_s,
                   static_cast<unsigned long long>(s.commits),
                   static_cast<unsigned long long>(s.batches_committed),
                   static_cast<unsigned long long>(s.records_committed),
                   static_cast<unsigned long long>(s.queued_records),
                   static_cast<unsigned long long>(s.pool.used));
      std::fflush(stderr);
      std::_Exit(kExitError);
    }
  }
  for (auto& t : producers) t.join();
  sampling = false;
  sampler.join();
  appender->close();
  AppenderStats final_stats = appender->stats();

  std::vector<float> latencies;
  for (ProducerResult& r : results) {
    latencies.insert(latencies.end(), r.latencies_ms.begin(), r.latencies_ms.end());
    f.committed_tokens += r.committed;
    f.failed += r.failed;
    if (!f.first_error && r.first_error) f.first_error = r.first_error;
  }
  std::sort(latencies.begin(), latencies.end());
  f.window_s = o.duration_s - f.warmup_s;
  f.window_records = latencies.size();
  f.throughput = f.window_records / f.window_s;
  if (o.blob_latency_ms + o.consensus_latency_ms > 0) {
    f.ideal = o.producers * 1000.0 / (o.blob_latency_ms + o.consensus_latency_ms);
  }
  f.p50_ms = percentile_sorted(latencies, 0.50);
  f.p90_ms = percentile_sorted(latencies, 0.90);
  f.p99_ms = percentile_sorted(latencies, 0.99);
  f.window_commits = at_deadline.commits - at_warm_end.commits;
  f.window_batches = at_deadline.batches_committed - at_warm_end.batches_committed;
  f.commits = final_stats.commits;
  f.batches = final_stats.batches_committed;
  f.mismatches = final_stats.mismatches;
  f.retimed_batches = final_stats.retimed_batches;
  f.peak_sampled = peak_sampled.load();
  f.peak_stats = final_stats.pool.peak_used;
  f.pool_waits = final_stats.pool.waits;
  f.call_p50_ms = at_deadline.commit_call.p50_micros / 1000.0;
  f.call_p99_ms = at_deadline.commit_call.p99_micros / 1000.0;
  f.stall_ms = final_stats.stall_ms;

  appender.reset();
  shard.reset();
  client.reset();
  TM_TRY(verify_snapshot(place, &f));
  return f;
}

std::string json_number(std::optional<std::uint64_t> v) {
  return v ? std::to_string(*v) : "null";
}

void print(const Options& o, const BenchPlace& place, const Figures& f) {
  const double batches_per_commit =
      f.window_commits ? static_cast<double>(f.window_batches) / f.window_commits : 0;
  const std::optional<std::uint64_t> bound =
      f.capacity ? std::optional<std::uint64_t>(*f.capacity + f.record_charge) : std::nullopt;
  if (o.json) {
    char ideal[64] = "null", fraction[64] = "null";
    if (f.ideal) {
      std::snprintf(ideal, sizeof ideal, "%.0f", *f.ideal);
      std::snprintf(fraction, sizeof fraction, "%.3f", f.throughput / *f.ideal);
    }
    std::printf(
        "{\"producers\":%zu,\"record_bytes\":%llu,\"queue\":\"%s\",\"batch_appends\":%s,"
        "\"blob_latency_ms\":%g,\"consensus_latency_ms\":%g,\"duration_s\":%g,"
        "\"warmup_s\":%g,\"window_s\":%g,\"window_records\":%llu,"
        "\"throughput_records_per_s\":%.0f,\"ideal_records_per_s\":%s,"
        "\"fraction_of_ideal\":%s,\"latency_p50_ms\":%.1f,\"latency_p90_ms\":%.1f,"
        "\"latency_p99_ms\":%.1f,\"window_commits\":%llu,\"window_batches\":%llu,"
        "\"batches_per_commit\":%.2f,\"commits\":%llu,\"batches\":%llu,\"mismatches\":%llu,"
        "\"retimed_batches\":%llu,\"commit_call_p50_ms\":%.3f,\"commit_call_p99_ms\":%.3f,"
        "\"stall_ms\":%llu,\"records_committed\":%llu,\"failed\":%llu,"
        "\"pool_peak_sampled_bytes\":%llu,\"pool_peak_used_bytes\":%llu,"
        "\"pool_capacity_bytes\":%s,\"record_charge_bytes\":%llu,"
        "\"capacity_plus_one_enqueue_bytes\":%s,\"pool_waits\":%llu,\"snapshot_rows\":%llu,"
        "\"snapshot_diffs\":%lld}\n",
        o.producers, static_cast<unsigned long long>(o.record_bytes), queue_text(o).c_str(),
        o.batch_appends ? "true" : "false", o.blob_latency_ms, o.consensus_latency_ms, o.duration_s,
        f.warmup_s, f.window_s, static_cast<unsigned long long>(f.window_records), f.throughput,
        ideal, fraction, f.p50_ms, f.p90_ms, f.p99_ms,
        static_cast<unsigned long long>(f.window_commits),
        static_cast<unsigned long long>(f.window_batches), batches_per_commit,
        static_cast<unsigned long long>(f.commits), static_cast<unsigned long long>(f.batches),
        static_cast<unsigned long long>(f.mismatches),
        static_cast<unsigned long long>(f.retimed_batches), f.call_p50_ms, f.call_p99_ms,
        static_cast<unsigned long long>(f.stall_ms),
        static_cast<unsigned long long>(f.committed_tokens),
        static_cast<unsigned long long>(f.failed), static_cast<unsigned long long>(f.peak_sampled),
        static_cast<unsigned long long>(f.peak_stats), json_number(f.capacity).c_str(),
        static_cast<unsigned long long>(f.record_charge), json_number(bound).c_str(),
        static_cast<unsigned long long>(f.pool_waits),
        static_cast<unsigned long long>(f.snapshot_rows), static_cast<long long>(f.snapshot_diffs));
    return;
  }
  std::printf(
      "appender on %s: %zu producers, %llu-byte records, queue %s, batch appends %s, blob "
      "latency %g ms, consensus latency %g ms\n",
      place.describe().c_str(), o.producers, static_cast<unsigned long long>(o.record_bytes),
      queue_text(o).c_str(), o.batch_appends ? "on" : "off", o.blob_latency_ms,
      o.consensus_latency_ms);
  std::printf("window              %.1f s after a %.1f s warm-up, %llu records\n", f.window_s,
              f.warmup_s, static_cast<unsigned long long>(f.window_records));
  if (f.ideal) {
    std::printf(
        "throughput          %.0f records/s (%.0f%% of the ideal %.0f = N / (blob + consensus "
        "latency))\n",
        f.throughput, 100 * f.throughput / *f.ideal, *f.ideal);
  } else {
    std::printf("throughput          %.0f records/s\n", f.throughput);
  }
  std::printf("latency             p50 %.1f ms  p90 %.1f ms  p99 %.1f ms\n", f.p50_ms, f.p90_ms,
              f.p99_ms);
  std::printf(
      "batches per commit  %.2f (%llu batches in %llu commits in the window; %llu in %llu "
      "overall)\n",
      batches_per_commit, static_cast<unsigned long long>(f.window_batches),
      static_cast<unsigned long long>(f.window_commits), static_cast<unsigned long long>(f.batches),
      static_cast<unsigned long long>(f.commits));
  std::printf("commit call         p50 %.3f ms  p99 %.3f ms; write stall %llu ms\n", f.call_p50_ms,
              f.call_p99_ms, static_cast<unsigned long long>(f.stall_ms));
  if (f.capacity) {
    std::printf(
        "peak pool use       %llu bytes sampled, %llu peak_used; capacity %llu, capacity + one "
        "enqueue call %llu\n",
        static_cast<unsigned long long>(f.peak_sampled),
        static_cast<unsigned long long>(f.peak_stats), static_cast<unsigned long long>(*f.capacity),
        static_cast<unsigned long long>(*bound));
  } else {
    std::printf(
        "peak pool use       %llu bytes sampled, %llu peak_used; unlimited pool (records mode, "
        "bound %zu records = %llu bytes of charges)\n",
        static_cast<unsigned long long>(f.peak_sampled),
        static_cast<unsigned long long>(f.peak_stats), *o.queue_records,
        static_cast<unsigned long long>(*o.queue_records * f.record_charge));
  }
  std::printf(
      "records committed   %llu (tokens), snapshot %llu rows, sum of diffs %lld; mismatches "
      "%llu, pool waits %llu\n",
      static_cast<unsigned long long>(f.committed_tokens),
      static_cast<unsigned long long>(f.snapshot_rows), static_cast<long long>(f.snapshot_diffs),
      static_cast<unsigned long long>(f.mismatches), static_cast<unsigned long long>(f.pool_waits));
}

}  // namespace

int run_bench_appender(const Globals& globals, const std::vector<std::string>& argv) {
  auto args = Args::parse(argv,
                          {"--producers", "--record-bytes", "--queue", "--batch-appends",
                           "--blob-latency-ms", "--consensus-latency-ms", "--duration"},
                          {"--json"});
  if (!args) return usage_error(args.error().message);
  if (args->positionals() != std::vector<std::string>{"appender"}) {
    return usage_error(kAppenderUsage);
  }
  auto options = parse_options(*args);
  if (!options) return usage_error(options.error().message);
  const Options& o = *options;

  // A fresh scratch directory, removed afterwards.
  auto dir = BenchDirectory::create("appender", std::nullopt);
  if (!dir) return report(dir.error());
  auto place = bench_place(globals.blob_url, globals.consensus_url, dir->path());
  if (!place) return usage_error(place.error().message);
  auto figures = run(o, *place);
  if (!figures) return report(figures.error());
  const Figures& f = *figures;
  print(o, *place, f);

  int status = kExitOk;
  if (f.failed > 0) {
    std::fprintf(stderr,
                 "tidemark: bench appender: %llu records failed although no error was injected; "
                 "the first: %s\n",
                 static_cast<unsigned long long>(f.failed),
                 f.first_error ? f.first_error->to_string().c_str() : "?");
    status = kExitError;
  }
  if (f.snapshot_diffs != static_cast<std::int64_t>(f.committed_tokens)) {
    std::fprintf(stderr,
                 "tidemark: bench appender: the snapshot holds %lld records (sum of diffs, %llu "
                 "rows) but %llu tokens reported a commit\n",
                 static_cast<long long>(f.snapshot_diffs),
                 static_cast<unsigned long long>(f.snapshot_rows),
                 static_cast<unsigned long long>(f.committed_tokens));
    status = kExitError;
  }
  return status;
}

}  // namespace tidemark::cli
