// tidemark bench engine: the engine's figures for docs/benchmarks.md, on
// the embedded default (file blob + SQLite) in a scratch directory, or
// against `--blob URL --consensus URL` (S3 + PostgreSQL, say).
//
//   fsync latency        write + fsync, median of 200, on the same disk: 4 KiB
//                        overwriting one block, 4 KiB appended, and one
//                        4,120-byte SQLite WAL frame appended (what a commit
//                        of a small compare_and_append writes)
//   append throughput    100-byte records through BatchBuilder and
//                        compare_and_append, records/s and MB/s
//   compare_and_append   latency of the call alone (batch prebuilt), p50/p99,
//                        and of appends carrying no data (the consensus write)
//   small append         one record end to end: its part written, then
//                        compare_and_append, p50/p99
//   snapshot             a shard of --updates updates (default 10,000,000)
//                        read three times by a child process: the median
//                        updates/s and the largest of the child's
//                        peak RSS (its VmHWM); --blob-latency-ms L
//                        injects L ms before each of the child's blob
//                        calls (a FaultyBlob: the reads alone, not the
//                        ingest); --background-compaction off: the
//                        bench's clients do not compact, so the snapshot
//                        reads the shard as ingested (one batch per
//                        million updates) with nothing else at work
// The fsync probes measure the scratch directory's disk and are skipped
// against remote URLs.
//
// Benchmarks report figures; they never pass or fail on time.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "bench_util.h"
#include "cli/cli.h"
#include "location/faulty.h"
#include "tidemark/read.h"
#include "tidemark/write.h"
#include "util/number.h"
#include "util/try.h"

namespace tidemark::cli {
namespace {

using Clock = BenchClock;

// Milliseconds of injected latency: a non-negative number.
Result<double> parse_latency_ms(const std::string& flag, const std::string& text) {
  try {
    std::size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size() || !(v >= 0)) throw std::invalid_argument(text);
    return v;
  } catch (...) {
    return invalid_usage(flag + " takes a non-negative number of milliseconds, got \"" + text +
                         "\"");
  }
}

// A 100-byte record: a 16-byte key and an 84-byte JSON string value.
void make_record(std::uint64_t i, std::string* key, std::string* value) {
  char k[32];
  std::snprintf(k, sizeof k, "\"k%013llu\"", static_cast<unsigned long long>(i));
  key->assign(k);
  value->assign("\"");
  value->append(std::to_string(i * 2654435761u % 1000000007u));
  value->resize(83, 'x');
  value->push_back('"');
}

// Writes `bytes` and fsyncs it, over the start of a file (`append` false)
// or at the end of a growing one (`append` true). SQLite's WAL appends one
// 4,120-byte frame (a 24-byte header and a 4 KiB page) and fsyncs it per
// small commit: that is the fsync a compare_and_append needs.
class FsyncProbe {
 public:
  FsyncProbe(const std::filesystem::path& dir, const std::string& name, bool append,
             std::size_t bytes)
      : path_((dir / name).string()), append_(append), block_(bytes, 'f') {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  ~FsyncProbe() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  FsyncProbe(const FsyncProbe&) = delete;
  FsyncProbe& operator=(const FsyncProbe&) = delete;

  // One sample in milliseconds, or -1 on an I/O error.
  double sample() {
    auto start = Clock::now();
    off_t offset = append_ ? static_cast<off_t>(writes_++) * static_cast<off_t>(block_.size()) : 0;
    if (fd_ < 0 || ::pwrite(fd_, block_.data(), block_.size(), offset) < 0 || ::fsync(fd_) != 0) {
      return -1;
    }
    return seconds_since(start) * 1e3;
  }

 private:
  std::string path_;
  bool append_;
  std::string block_;
  int fd_ = -1;
  std::uint64_t writes_ = 0;
};

// Whether the bench's clients compact in the background (--background-compaction).
bool g_background_compaction = true;

Result<std::shared_ptr<Shard>> fresh_shard(const BenchPlace& place, const std::string& name) {
  ClientOptions options;
  options.background_compaction = g_background_compaction;
  TM_ASSIGN(auto client, Client::open(place.blob, place.consensus, options));
  TM_TRY(client->create_shard(place.shard(name)));
  return client->open_shard(place.shard(name));
}

// Appends `total` records in appends of `per_append`, keys in a scrambled
// order so the builder really sorts. Returns seconds taken.
Result<double> ingest(Shard& shard, std::uint64_t total, std::uint64_t per_append) {
  TM_ASSIGN(auto writer, shard.open_writer());
  std::string key, value;
  auto start = Clock::now();
  Time t = writer->upper().time();
  for (std::uint64_t done = 0; done < total; ++t) {
    BatchBuilder builder = writer->builder(Frontier::at(t));
    std::uint64_t n = std::min(per_append, total - done);
    for (std::uint64_t i = 0; i < n; ++i) {
      make_record((done + i) * 7919 % total, &key, &value);
      TM_TRY(builder.add(key, value, t, 1));
    }
    TM_ASSIGN(Batch batch, builder.finish(Frontier::at(t + 1)));
    std::vector<Batch> batches;
    batches.push_back(std::move(batch));
    TM_TRY(writer->compare_and_append(batches, Frontier::at(t), Frontier::at(t + 1)));
    done += n;
  }
  return seconds_since(start);
}

struct Figures {
  double fsync_ms = 0, fsync_append_ms = 0, fsync_wal_frame_ms = 0;
  double cas_empty_p50_ms = 0, cas_empty_p99_ms = 0;
  double append_records_per_s = 0, append_mb_per_s = 0;
  double cas_p50_ms = 0, cas_p99_ms = 0;
  double small_append_p50_ms = 0, small_append_p99_ms = 0;
  std::uint64_t snapshot_updates = 0;
  double snapshot_updates_per_s = 0, snapshot_seconds = 0, snapshot_updates_per_cpu_s = 0;
  double snapshot_peak_rss_mib = 0;
  double ingest_seconds = 0;
};

// The child half of the snapshot figure: reads the shard, prints
// "<rows> <seconds> <bytes> <peak RSS KiB> <CPU seconds>". With
// blob_latency_ms > 0 every blob call of the child sleeps that long first.
int snapshot_child(const std::string& blob, const std::string& consensus, const std::string& name,
                   double blob_latency_ms) {
  auto real_blob = open_blob(blob);
  if (!real_blob) return report(real_blob.error());
  auto real_consensus = open_consensus(consensus);
  if (!real_consensus) return report(real_consensus.error());
  std::shared_ptr<Blob> read_blob = *real_blob;
  if (blob_latency_ms > 0) {
    FaultConfig config;
    config.latency = std::chrono::microseconds(static_cast<std::int64_t>(blob_latency_ms * 1000));
    read_blob = std::make_shared<FaultyBlob>(read_blob, config);
  }
  auto client = Client::open(Location{read_blob, *real_consensus});
  if (!client) return report(client.error());
  auto shard = (*client)->open_shard(name);
  if (!shard) return report(shard.error());
  auto upper = (*shard)->upper();
  if (!upper) return report(upper.error());
  const double cpu_before = cpu_seconds();
  auto start = Clock::now();
  auto cursor = (*shard)->snapshot(upper->time() - 1);
  if (!cursor) return report(cursor.error());
  std::uint64_t rows = 0, bytes = 0;
  for (;;) {
    auto row = cursor->next();
    if (!row) return report(row.error());
    if (!*row) break;
    ++rows;
    bytes += (*row)->key.size() + (*row)->value.size();
  }
  double secs = seconds_since(start);
  // CPU time too: on a shared VM, wall time includes time the core was
  // given to someone else.
  const unsigned long long hwm_kib = peak_rss_kib();
  const double cpu = cpu_seconds() - cpu_before;
  std::printf("%llu %.6f %llu %llu %.6f\n", static_cast<unsigned long long>(rows), secs,
              static_cast<unsigned long long>(bytes), hwm_kib, cpu);
  return kExitOk;
}

struct SnapshotRun {
  unsigned long long rows = 0, bytes = 0, peak_rss_kib = 0;
  double seconds = 0;
  double cpu_seconds = 0;
};

// Runs `tidemark bench snapshot-child BLOB CONSENSUS SHARD [LATENCY_MS]`
// and reads its figures.
Result<SnapshotRun> run_snapshot_child(const BenchPlace& place, double blob_latency_ms) {
  char latency[32];
  std::snprintf(latency, sizeof latency, "%g", blob_latency_ms);
  TM_ASSIGN(std::string text,
            run_bench_child("snapshot-child",
                            {place.blob, place.consensus, place.shard("snapshot"), latency}));
  SnapshotRun run;
  std::sscanf(text.c_str(), "%llu %lf %llu %llu %lf", &run.rows, &run.seconds, &run.bytes,
              &run.peak_rss_kib, &run.cpu_seconds);
  return run;
}

Result<Figures> run_engine(const std::filesystem::path& dir, const BenchPlace& place,
                           std::uint64_t updates, int cas_appends, double blob_latency_ms) {
  Figures f;
  // Latency first, before the bulk phases leave the disk busy with
  // writeback. The disk's speed drifts on a shared VM, so every round takes
  // one sample of each: the three fsync probes, a one-record
  // compare_and_append (batch prebuilt), and one carrying no data (the
  // consensus write alone), each on its own shard.
  {
    TM_ASSIGN(auto data_shard, fresh_shard(place, "cas"));
    TM_ASSIGN(auto empty_shard, fresh_shard(place, "cas-empty"));
    TM_ASSIGN(auto small_shard, fresh_shard(place, "small"));
    TM_ASSIGN(auto data_writer, data_shard->open_writer());
    TM_ASSIGN(auto empty_writer, empty_shard->open_writer());
    TM_ASSIGN(auto small_writer, small_shard->open_writer());
    std::vector<Batch> prebuilt;
    std::string key, value;
    for (int i = 0; i < cas_appends; ++i) {
      Time t = static_cast<Time>(i);
      make_record(i, &key, &value);
      std::vector<Update> one{Update{key, value, t, 1}};
      TM_ASSIGN(Batch batch, data_writer->batch(one, Frontier::at(t), Frontier::at(t + 1)));
      prebuilt.push_back(std::move(batch));
    }
    FsyncProbe overwrite(dir, "probe-overwrite", false, 4096);
    FsyncProbe append(dir, "probe-append", true, 4096);
    FsyncProbe wal_frame(dir, "probe-wal-frame", true, 4096 + 24);
    std::vector<double> s_overwrite, s_append, s_frame, s_data, s_empty, s_small;
    for (int i = 0; i < cas_appends; ++i) {
      Time t = static_cast<Time>(i);
      if (!place.remote()) {
        s_overwrite.push_back(overwrite.sample());
        s_append.push_back(append.sample());
        s_frame.push_back(wal_frame.sample());
      }
      // Alternate which append goes first after the probes, so neither
      // always pays for following the probes' fsyncs.
      auto append_data = [&]() -> Status {
        auto start = Clock::now();
        TM_TRY(data_writer->compare_and_append(std::span<Batch>(&prebuilt[i], 1), Frontier::at(t),
                                               Frontier::at(t + 1)));
        s_data.push_back(seconds_since(start) * 1e3);
        return {};
      };
      auto append_empty = [&]() -> Status {
        std::vector<Batch> none;
        auto start = Clock::now();
        TM_TRY(empty_writer->compare_and_append(none, Frontier::at(t), Frontier::at(t + 1)));
        s_empty.push_back(seconds_since(start) * 1e3);
        return {};
      };
      if (i % 2 == 0) {
        TM_TRY(append_data());
        TM_TRY(append_empty());
      } else {
        TM_TRY(append_empty());
        TM_TRY(append_data());
      }
      // One record end to end: its part written, then committed.
      make_record(i, &key, &value);
      std::vector<Update> one{Update{key, value, t, 1}};
      auto start = Clock::now();
      TM_ASSIGN(Batch small, small_writer->batch(one, Frontier::at(t), Frontier::at(t + 1)));
      TM_TRY(small_writer->compare_and_append(std::span<Batch>(&small, 1), Frontier::at(t),
                                              Frontier::at(t + 1)));
      s_small.push_back(seconds_since(start) * 1e3);
    }
    f.fsync_ms = percentile(s_overwrite, 0.5);
    f.fsync_append_ms = percentile(s_append, 0.5);
    f.fsync_wal_frame_ms = percentile(s_frame, 0.5);
    f.cas_p50_ms = percentile(s_data, 0.5);
    f.cas_p99_ms = percentile(s_data, 0.99);
    f.cas_empty_p50_ms = percentile(s_empty, 0.5);
    f.cas_empty_p99_ms = percentile(s_empty, 0.99);
    f.small_append_p50_ms = percentile(s_small, 0.5);
    f.small_append_p99_ms = percentile(s_small, 0.99);
  }

  // Append throughput: 1,000,000 records in appends of 100,000.
  {
    TM_ASSIGN(auto shard, fresh_shard(place, "append"));
    const std::uint64_t total = 1'000'000;
    TM_ASSIGN(double secs, ingest(*shard, total, 100'000));
    f.append_records_per_s = total / secs;
    f.append_mb_per_s = total * 100.0 / secs / 1e6;
  }

  // Snapshot of a large shard, read by a child so its peak RSS is its own.
  {
    TM_ASSIGN(auto shard, fresh_shard(place, "snapshot"));
    TM_ASSIGN(f.ingest_seconds, ingest(*shard, updates, 1'000'000));
    // Three runs: the median throughput and the largest peak RSS.
    std::vector<double> rates, cpu_rates;
    for (int run = 0; run < 3; ++run) {
      TM_ASSIGN(SnapshotRun r, run_snapshot_child(place, blob_latency_ms));
      f.snapshot_updates = r.rows;
      rates.push_back(r.seconds > 0 ? r.rows / r.seconds : 0);
      cpu_rates.push_back(r.cpu_seconds > 0 ? r.rows / r.cpu_seconds : 0);
      f.snapshot_peak_rss_mib = std::max(f.snapshot_peak_rss_mib, r.peak_rss_kib / 1024.0);
    }
    f.snapshot_updates_per_s = percentile(rates, 0.5);
    f.snapshot_updates_per_cpu_s = percentile(cpu_rates, 0.5);
    f.snapshot_seconds =
        f.snapshot_updates_per_s > 0 ? f.snapshot_updates / f.snapshot_updates_per_s : 0;
  }
  return f;
}

}  // namespace

int run_bench(const Globals& globals, const std::vector<std::string>& argv) {
  if ((argv.size() == 4 || argv.size() == 5) && argv[0] == "snapshot-child") {
    double latency = 0;
    if (argv.size() == 5) {
      auto parsed = parse_latency_ms("the blob latency", argv[4]);
      if (!parsed) return usage_error(parsed.error().message);
      latency = *parsed;
    }
    return snapshot_child(argv[1], argv[2], argv[3], latency);
  }
  if (!argv.empty() && argv[0] == "appender") return run_bench_appender(globals, argv);
  if (!argv.empty() && argv[0] == "shards") return run_bench_shards(globals, argv);
  if (!argv.empty() && (argv[0] == "listen" || argv[0] == "listen-child")) {
    return run_bench_listen(globals, argv);
  }
  if (!argv.empty() && (argv[0] == "compaction" || argv[0] == "compaction-child")) {
    return run_bench_compaction(globals, argv);
  }
  if (!argv.empty() &&
      (argv[0] == "sink" || argv[0] == "sink-child" || argv[0] == "sink-debezium-child")) {
    return run_bench_sink(globals, argv);
  }
  auto args = Args::parse(
      argv, {"--updates", "--appends", "--dir", "--blob-latency-ms", "--background-compaction"},
      {"--json"});
  if (!args) return usage_error(args.error().message);
  if (args->positionals() != std::vector<std::string>{"engine"}) {
    return usage_error(
        "bench engine [--json] [--updates N] [--appends N] [--dir DIR] [--blob-latency-ms L] "
        "[--background-compaction on|off] [--blob URL --consensus URL] | bench appender "
        "[--producers N] [--record-bytes B] [--queue bytes:SIZE|records:N] [--batch-appends "
        "on|off] [--blob-latency-ms L] [--consensus-latency-ms L] [--duration S] [--blob URL "
        "--consensus URL] [--json] | bench "
        "compaction [--appends N] [--background-compaction on|off] [--dir DIR] [--json] | bench "
        "sink [--diff N] [--envelope upsert|debezium] [--dir DIR] [--json] | bench shards "
        "[--shards "
        "N] [--sinks M] [--idle-close S] [--dir DIR] [--json] | bench listen [--updates N] "
        "[--times T] [--rounds R] [--dir DIR] [--json]");
  }
  std::uint64_t updates = 10'000'000;
  int appends = 200;
  if (auto v = args->get("--updates")) {
    auto parsed = parse_decimal(*v, 1);
    if (!parsed) return usage_error("--updates takes a positive integer, got \"" + *v + "\"");
    updates = *parsed;
  }
  if (auto v = args->get("--appends")) {
    auto parsed = parse_decimal(*v, 1, 1'000'000);
    if (!parsed) {
      return usage_error("--appends takes an integer from 1 to 1000000, got \"" + *v + "\"");
    }
    appends = static_cast<int>(*parsed);
  }
  if (auto v = args->get("--background-compaction")) {
    if (*v != "on" && *v != "off") return usage_error("--background-compaction takes on or off");
    g_background_compaction = *v == "on";
  }
  double blob_latency_ms = 0;
  if (auto v = args->get("--blob-latency-ms")) {
    auto parsed = parse_latency_ms("--blob-latency-ms", *v);
    if (!parsed) return usage_error(parsed.error().message);
    blob_latency_ms = *parsed;
  }
  // A usage error before any directory is made.
  if (auto checked = bench_place(globals.blob_url, globals.consensus_url, {}); !checked) {
    return usage_error(checked.error().message);
  }
  // A fresh scratch directory; under --dir DIR it is kept, so the shards
  // can be profiled (`tidemark bench snapshot-child BLOB CONSENSUS SHARD`).
  auto dir = BenchDirectory::create("engine", args->get("--dir"));
  if (!dir) return report(dir.error());
  auto place = bench_place(globals.blob_url, globals.consensus_url, dir->path());
  if (!place) return report(place.error());
  auto figures = run_engine(dir->path(), *place, updates, appends, blob_latency_ms);
  if (!figures) return report(figures.error());
  const Figures& f = *figures;
  if (args->has("--json")) {
    std::printf(
        "{\"fsync_ms\":%.3f,\"fsync_append_ms\":%.3f,\"fsync_wal_frame_ms\":%.3f,\"append_records_"
        "per_s\":%.0f,"
        "\"append_mb_per_s\":%.1f,\"cas_p50_ms\":%.3f,\"cas_p99_ms\":%.3f,"
        "\"cas_empty_p50_ms\":%.3f,\"cas_empty_p99_ms\":%.3f,\"small_append_p50_ms\":%.3f,"
        "\"small_append_p99_ms\":%.3f,\"snapshot_updates\":%llu,"
        "\"snapshot_seconds\":%.3f,\"snapshot_updates_per_s\":%.0f,"
        "\"snapshot_updates_per_cpu_s\":%.0f,"
        "\"snapshot_peak_rss_mib\":%.1f,\"ingest_seconds\":%.2f}\n",
        f.fsync_ms, f.fsync_append_ms, f.fsync_wal_frame_ms, f.append_records_per_s,
        f.append_mb_per_s, f.cas_p50_ms, f.cas_p99_ms, f.cas_empty_p50_ms, f.cas_empty_p99_ms,
        f.small_append_p50_ms, f.small_append_p99_ms,
        static_cast<unsigned long long>(f.snapshot_updates), f.snapshot_seconds,
        f.snapshot_updates_per_s, f.snapshot_updates_per_cpu_s, f.snapshot_peak_rss_mib,
        f.ingest_seconds);
  } else {
    std::printf("location                          %s\n", place->describe().c_str());
    if (!place->remote()) {
      std::printf(
          "fsync latency (median)            4 KiB overwrite %.3f ms, 4 KiB append %.3f ms, "
          "WAL frame append %.3f ms\n",
          f.fsync_ms, f.fsync_append_ms, f.fsync_wal_frame_ms);
    }
    std::printf("append throughput (100 B records) %10.0f records/s  %.1f MB/s\n",
                f.append_records_per_s, f.append_mb_per_s);
    std::printf(
        "compare_and_append latency        p50 %.3f ms  p99 %.3f ms  (%d one-record appends)\n",
        f.cas_p50_ms, f.cas_p99_ms, appends);
    std::printf("compare_and_append, no data       p50 %.3f ms  p99 %.3f ms\n", f.cas_empty_p50_ms,
                f.cas_empty_p99_ms);
    std::printf("small append (part + commit)      p50 %.3f ms  p99 %.3f ms\n",
                f.small_append_p50_ms, f.small_append_p99_ms);
    std::printf(
        "snapshot of %llu updates (median of 3) %.0f updates/s (%.2f s), %.0f updates per CPU "
        "second, peak RSS %.1f MiB\n",
        static_cast<unsigned long long>(f.snapshot_updates), f.snapshot_updates_per_s,
        f.snapshot_seconds, f.snapshot_updates_per_cpu_s, f.snapshot_peak_rss_mib);
  }
  return kExitOk;
}

}  // namespace tidemark::cli
