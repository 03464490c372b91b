// tidemark bench listen: a listen over one large multi-time batch against
// a snapshot of the same shard (issue #22), for docs/benchmarks.md.
//
//   tidemark bench listen [--updates N] [--times T] [--rounds R] [--dir DIR] [--json]
//
// The parent makes the shard "listen" on the embedded default (file blob +
// SQLite) in a scratch directory, used as a data directory, and appends N
// updates (default 4,000,000) over the times [0, T) (default 5,000) in ONE
// batch, as `tidemark append listen --lower 0 --upper T` of a file does:
// one BatchBuilder, one compare_and_append. Update i is at time i * T / N,
// with a key of its own (`"k000001234567"`, in a scrambled order) and a
// small JSON value (`{"n":i}`).
//
// Then R rounds (default 3), each running two children, one after the
// other: `tidemark bench listen-child DIR snapshot T` (the snapshot at
// T - 1) and `... listen T` (the listen `--from 0 --until T`: times 1 to
// T - 1, then the progress T). Each opens the data directory as the
// command line does (open_client: its scratch directory is DIR/scratch),
// reads every row and prints its rows, seconds, CPU seconds and peak RSS
// (its own VmHWM). Reported: the median seconds of each, their ratio, and
// the largest peak RSS of each.
//
// Benchmarks report figures; they never pass or fail on time. A listen
// that does not emit one row per update after time 0 is a correctness
// failure: the command says so and exits 1.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "cli/cli.h"
#include "tidemark/read.h"
#include "tidemark/write.h"
#include "util/number.h"
#include "util/try.h"

namespace tidemark::cli {
namespace {

using Clock = BenchClock;

constexpr const char* kListenChild = "listen-child";
constexpr const char* kUsage =
    "bench listen [--updates N] [--times T] [--rounds R] [--dir DIR] [--json]";
constexpr const char* kShardName = "listen";

// The data directory as the command line opens it.
Globals data_directory(const std::filesystem::path& dir) {
  Globals globals;
  globals.data_dir = dir.string();
  return globals;
}

// Update i of n over `times` times: its own key, scrambled so the builder
// really sorts (7919 is prime, so i -> i * 7919 mod n is a bijection
// unless n is a multiple of it).
void make_update(std::uint64_t i, std::uint64_t n, std::string* key, std::string* value) {
  char k[40];
  std::snprintf(k, sizeof k, "\"k%012llu\"", static_cast<unsigned long long>(i * 7919 % n));
  key->assign(k);
  char v[40];
  std::snprintf(v, sizeof v, "{\"n\":%llu}", static_cast<unsigned long long>(i));
  value->assign(v);
}

// One batch of `updates` updates over [0, times). Returns seconds taken.
Result<double> ingest(const std::filesystem::path& dir, std::uint64_t updates, Time times) {
  TM_ASSIGN(auto client, open_client(data_directory(dir)));
  TM_TRY(client->create_shard(kShardName));
  TM_ASSIGN(auto shard, client->open_shard(kShardName));
  TM_ASSIGN(auto writer, shard->open_writer());
  const auto start = Clock::now();
  BatchBuilder builder = writer->builder(Frontier::at(0));
  std::string key, value;
  for (std::uint64_t i = 0; i < updates; ++i) {
    make_update(i, updates, &key, &value);
    const Time time = static_cast<Time>(static_cast<unsigned __int128>(i) * times / updates);
    TM_TRY(builder.add(key, value, time, 1));
  }
  TM_ASSIGN(Batch batch, builder.finish(Frontier::at(times)));
  std::vector<Batch> batches;
  batches.push_back(std::move(batch));
  TM_TRY(writer->compare_and_append(batches, Frontier::at(0), Frontier::at(times)));
  return seconds_since(start);
}

struct ChildRun {
  unsigned long long rows = 0, peak_rss_kib = 0;
  double seconds = 0, cpu_seconds = 0;
};

// The child: reads the shard once (`snapshot` at times - 1, or `listen`
// from 0 until times) and prints "<rows> <seconds> <CPU seconds> <peak
// RSS KiB>".
int listen_child(const std::string& dir, const std::string& what, const std::string& times_text) {
  const auto times = parse_decimal(times_text, 1, UINT64_MAX - 1);
  if (!times || (what != "snapshot" && what != "listen")) {
    return usage_error("bench listen-child DIR snapshot|listen TIMES");
  }
  auto client = open_client(data_directory(dir), DataDir::kMustExist);
  if (!client) return report(client.error());
  auto shard = (*client)->open_shard(kShardName);
  if (!shard) return report(shard.error());
  std::uint64_t rows = 0;
  const double cpu_before = cpu_seconds();
  const auto start = Clock::now();
  if (what == "snapshot") {
    auto cursor = (*shard)->snapshot(*times - 1);
    if (!cursor) return report(cursor.error());
    for (;;) {
      auto row = cursor->next();
      if (!row) return report(row.error());
      if (!*row) break;
      ++rows;
    }
  } else {
    auto listener = (*shard)->listen(ListenStart::after(0), *times);
    if (!listener) return report(listener.error());
    for (;;) {
      auto event = (*listener)->next();
      if (!event) return report(event.error());
      if (!*event) break;
      if ((*event)->kind == ListenEvent::Kind::kUpdate) ++rows;
    }
  }
  const double seconds = seconds_since(start);
  const double cpu = cpu_seconds() - cpu_before;
  std::printf("%llu %.6f %.6f %llu\n", static_cast<unsigned long long>(rows), seconds, cpu,
              peak_rss_kib());
  return kExitOk;
}

Result<ChildRun> run_child(const std::filesystem::path& dir, const std::string& what, Time times) {
  TM_ASSIGN(std::string text,
            run_bench_child(kListenChild, {dir.string(), what, std::to_string(times)}));
  ChildRun run;
  if (std::sscanf(text.c_str(), "%llu %lf %lf %llu", &run.rows, &run.seconds, &run.cpu_seconds,
                  &run.peak_rss_kib) != 4) {
    return determinate("bench listen-child " + what + " printed \"" + text + "\"");
  }
  return run;
}

struct Figures {
  std::uint64_t updates = 0;
  Time times = 0;
  int rounds = 0;
  double ingest_seconds = 0;
  std::uint64_t parts = 0, bytes = 0;
  std::uint64_t snapshot_rows = 0, listen_rows = 0;
  double snapshot_seconds = 0, listen_seconds = 0;            // medians
  double snapshot_cpu_seconds = 0, listen_cpu_seconds = 0;    // medians
  double snapshot_peak_rss_mib = 0, listen_peak_rss_mib = 0;  // the largest
  std::uint64_t expected_listen_rows = 0;                     // the updates after time 0
};

Result<Figures> run_listen_bench(const std::filesystem::path& dir, std::uint64_t updates,
                                 Time times, int rounds) {
  Figures f;
  f.updates = updates;
  f.times = times;
  f.rounds = rounds;
  TM_ASSIGN(f.ingest_seconds, ingest(dir, updates, times));
  {
    TM_ASSIGN(auto client, open_client(data_directory(dir), DataDir::kMustExist));
    TM_ASSIGN(auto shard, client->open_shard(kShardName));
    TM_ASSIGN(ShardInfo info, shard->inspect());
    f.parts = info.parts;
    f.bytes = info.bytes;
  }
  // Update i is at time 0 while i * times < updates.
  f.expected_listen_rows = updates - (updates + times - 1) / times;
  std::vector<double> snapshot_s, listen_s, snapshot_cpu, listen_cpu;
  for (int round = 0; round < rounds; ++round) {
    TM_ASSIGN(ChildRun snapshot, run_child(dir, "snapshot", times));
    TM_ASSIGN(ChildRun listen, run_child(dir, "listen", times));
    f.snapshot_rows = snapshot.rows;
    f.listen_rows = listen.rows;
    snapshot_s.push_back(snapshot.seconds);
    listen_s.push_back(listen.seconds);
    snapshot_cpu.push_back(snapshot.cpu_seconds);
    listen_cpu.push_back(listen.cpu_seconds);
    f.snapshot_peak_rss_mib = std::max(f.snapshot_peak_rss_mib, snapshot.peak_rss_kib / 1024.0);
    f.listen_peak_rss_mib = std::max(f.listen_peak_rss_mib, listen.peak_rss_kib / 1024.0);
  }
  f.snapshot_seconds = percentile(snapshot_s, 0.5);
  f.listen_seconds = percentile(listen_s, 0.5);
  f.snapshot_cpu_seconds = percentile(snapshot_cpu, 0.5);
  f.listen_cpu_seconds = percentile(listen_cpu, 0.5);
  return f;
}

double ratio(double a, double b) {
  return b > 0 ? a / b : 0;
}

}  // namespace

int run_bench_listen(const Globals& globals, const std::vector<std::string>& argv) {
  if (argv.size() == 4 && argv[0] == kListenChild) return listen_child(argv[1], argv[2], argv[3]);
  auto args = Args::parse(argv, {"--updates", "--times", "--rounds", "--dir"}, {"--json"});
  if (!args) return usage_error(args.error().message);
  if (args->positionals() != std::vector<std::string>{"listen"}) return usage_error(kUsage);
  if (globals.blob_url || globals.consensus_url) {
    return usage_error("bench listen runs on the embedded default only (no --blob, --consensus)");
  }
  std::uint64_t updates = 4'000'000, times = 5'000, rounds = 3;
  for (auto [flag, out, most] :
       {std::tuple{"--updates", &updates, 1'000'000'000ull},
        std::tuple{"--times", &times, 1'000'000'000ull}, std::tuple{"--rounds", &rounds, 100ull}}) {
    if (auto text = args->get(flag)) {
      auto n = parse_decimal(*text, 1, most);
      if (!n) return usage_error(std::string(flag) + " takes 1 to " + std::to_string(most));
      *out = *n;
    }
  }
  if (updates % 7919 == 0) return usage_error("--updates must not be a multiple of 7919");
  auto dir = BenchDirectory::create("listen", args->get("--dir"));
  if (!dir) return report(dir.error());
  auto figures = run_listen_bench(dir->path(), updates, times, static_cast<int>(rounds));
  if (!figures) return report(figures.error());
  const Figures& f = *figures;
  if (args->has("--json")) {
    std::printf(
        "{\"updates\":%llu,\"times\":%llu,\"rounds\":%d,\"parts\":%llu,\"bytes\":%llu,"
        "\"ingest_seconds\":%.3f,\"snapshot_rows\":%llu,\"snapshot_seconds\":%.3f,"
        "\"snapshot_cpu_seconds\":%.3f,\"snapshot_peak_rss_mib\":%.1f,\"listen_rows\":%llu,"
        "\"listen_seconds\":%.3f,\"listen_cpu_seconds\":%.3f,\"listen_peak_rss_mib\":%.1f,"
        "\"listen_over_snapshot\":%.2f}\n",
        static_cast<unsigned long long>(f.updates), static_cast<unsigned long long>(f.times),
        f.rounds, static_cast<unsigned long long>(f.parts),
        static_cast<unsigned long long>(f.bytes), f.ingest_seconds,
        static_cast<unsigned long long>(f.snapshot_rows), f.snapshot_seconds,
        f.snapshot_cpu_seconds, f.snapshot_peak_rss_mib,
        static_cast<unsigned long long>(f.listen_rows), f.listen_seconds, f.listen_cpu_seconds,
        f.listen_peak_rss_mib, ratio(f.listen_seconds, f.snapshot_seconds));
  } else {
    std::printf(
        "one batch of %llu updates over %llu times: %llu parts, %llu bytes; ingest %.2f s\n",
        static_cast<unsigned long long>(f.updates), static_cast<unsigned long long>(f.times),
        static_cast<unsigned long long>(f.parts), static_cast<unsigned long long>(f.bytes),
        f.ingest_seconds);
    std::printf("snapshot at %llu            %llu rows in %.3f s (%.3f CPU s), peak RSS %.1f MiB\n",
                static_cast<unsigned long long>(f.times - 1),
                static_cast<unsigned long long>(f.snapshot_rows), f.snapshot_seconds,
                f.snapshot_cpu_seconds, f.snapshot_peak_rss_mib);
    std::printf(
        "listen --from 0 --until %llu %llu rows in %.3f s (%.3f CPU s), peak RSS %.1f MiB\n",
        static_cast<unsigned long long>(f.times), static_cast<unsigned long long>(f.listen_rows),
        f.listen_seconds, f.listen_cpu_seconds, f.listen_peak_rss_mib);
    std::printf("listen / snapshot           %.2fx (medians of %d rounds)\n",
                ratio(f.listen_seconds, f.snapshot_seconds), f.rounds);
  }
  if (f.listen_rows != f.expected_listen_rows) {
    std::fprintf(stderr,
                 "correctness failure: the listen emitted %llu rows, not the %llu updates "
                 "after time 0\n",
                 static_cast<unsigned long long>(f.listen_rows),
                 static_cast<unsigned long long>(f.expected_listen_rows));
    return kExitError;
  }
  return kExitOk;
}

}  // namespace tidemark::cli
