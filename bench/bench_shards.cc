// tidemark bench shards: what open and idle shards and sinks cost a server
// (issue #18): threads, memory and CPU, for docs/benchmarks.md.
//
//   tidemark bench shards [--shards N] [--sinks M] [--idle-close S] [--dir DIR] [--json]
//
// In this process, on the embedded default (file blob + SQLite) in a
// scratch directory, a Server on a free port (--idle-close S seconds,
// default 5) gets, over HTTP: N shards created, one managed append each
// (which opens the shard's appender and its writer), and M file sinks on
// the first M shards. Then it measures, from /proc/self/status and
// getrusage:
//
//   open       right after the appends: threads, RSS; then CPU over 5 s
//              with nothing appended (the writers' heartbeats, the
//              sinks' polls)
//   idle       once the idle appenders, writers and shards are closed
//              (tidemark_open_shards 0, or M while sinks hold theirs):
//              threads, RSS, then (5 s later) CPU over 20 s
//
// and reports per-shard figures as (open - baseline) / N, where baseline
// is the process before the first shard. Benchmarks report figures; they
// never pass or fail on them. An append that is not acknowledged is an
// error (exit 1).
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include "bench_util.h"
#include "cli/cli.h"
#include "testing/server_client.h"
#include "tidemark/server.h"
#include "util/proc_status.h"

namespace tidemark::cli {
namespace {

using Clock = BenchClock;
namespace http = boost::beast::http;

using ProcessFigures = ProcStatus;

ProcessFigures process_now() {
  return proc_status();
}

// The share of one core this process used over `seconds` of doing nothing.
double idle_cpu_share(double seconds) {
  const double cpu = cpu_seconds();
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return (cpu_seconds() - cpu) / seconds_since(start);
}

// A whole number in [least, most], nothing else.
std::optional<std::uint64_t> whole_number(const std::string& text, std::uint64_t least,
                                          std::uint64_t most) {
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < least || n > most) {
    return std::nullopt;
  }
  return n;
}

double metric(const std::string& text, const std::string& name) {
  std::size_t at = 0;
  while ((at = text.find(name + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + name.size() + 1));
    at += name.size();
  }
  return -1;
}

}  // namespace

int run_bench_shards(const Globals& globals, const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--shards", "--sinks", "--idle-close", "--dir"}, {"--json"});
  if (!args) return usage_error(args.error().message);
  constexpr const char* kUsage =
      "bench shards [--shards N] [--sinks M] [--idle-close S] [--dir DIR] [--json]";
  if (args->positionals() != std::vector<std::string>{"shards"}) return usage_error(kUsage);
  std::uint64_t shards = 1000, sinks = 0, idle_close = 5;
  for (auto [flag, out, most] :
       {std::tuple{"--shards", &shards, 100'000ull}, std::tuple{"--sinks", &sinks, 10'000ull},
        std::tuple{"--idle-close", &idle_close, 3600ull}}) {
    if (auto text = args->get(flag)) {
      auto n = whole_number(*text, 1, most);
      if (!n) return usage_error(std::string(flag) + " takes 1 to " + std::to_string(most));
      *out = *n;
    }
  }
  if (sinks > shards) return usage_error("--sinks must be at most --shards");
  (void)globals;
  auto dir = BenchDirectory::create("shards", args->get("--dir"));
  if (!dir) return report(dir.error());
  auto place = bench_place(std::nullopt, std::nullopt, dir->path());
  if (!place) return report(place.error());
  auto client = Client::open(place->blob, place->consensus, ClientOptions{});
  if (!client) return report(client.error());
  ServerOptions options;
  options.port = 0;
  options.idle_close = std::chrono::seconds(idle_close);
  options.file_sink_root = (dir->path() / "sinks").string();
  const ProcessFigures baseline = process_now();
  auto server = Server::start(*client, options);
  if (!server) return report(server.error());
  const std::uint16_t port = (*server)->port();
  auto call = [&](http::verb verb, const std::string& target, const std::string& body = "") {
    return testing::http_call(port, verb, target, body);
  };

  const auto opening = Clock::now();
  for (std::uint64_t i = 0; i < shards; ++i) {
    const std::string name = "s" + std::to_string(i);
    auto created = call(http::verb::post, "/v1/shards", "{\"name\": \"" + name + "\"}");
    auto appended = call(http::verb::post, "/v1/shards/" + name + "/append",
                         "{\"key\": \"k\", \"value\": " + std::to_string(i) + "}\n");
    if (created.status != 201 || appended.status != 200) {
      return report(make_error(ErrorKind::kDeterminate,
                               "shard " + name + ": create " + std::to_string(created.status) +
                                   ", append " + std::to_string(appended.status) + ": " +
                                   appended.body)
                        .error());
    }
  }
  for (std::uint64_t i = 0; i < sinks; ++i) {
    const std::string name = "s" + std::to_string(i);
    auto sink = call(http::verb::post, "/v1/sinks",
                     "{\"name\": \"k" + name + "\", \"shard\": \"" + name +
                         "\", \"to\": \"file://" + (dir->path() / "sinks" / name).string() + "\"}");
    if (sink.status != 201) {
      return report(
          make_error(ErrorKind::kDeterminate, "sink on " + name + ": " + sink.body).error());
    }
  }
  const double open_seconds = seconds_since(opening);
  const ProcessFigures open = process_now();
  const double open_cpu = idle_cpu_share(5);

  // Idle: wait for the sweeper (a shard a sink holds stays open).
  const auto waiting = Clock::now();
  std::string metrics;
  while (seconds_since(waiting) < static_cast<double>(idle_close) * 4 + 30) {
    metrics = call(http::verb::get, "/metrics").body;
    if (metric(metrics, "tidemark_open_appenders") == 0 &&
        metric(metrics, "tidemark_open_shards") <= static_cast<double>(sinks)) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // Settled (the closes' own writes done), then over two lease renewal
  // periods, as renewals come in waves.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const ProcessFigures idle = process_now();
  const double idle_cpu = idle_cpu_share(20);
  const double open_shards = metric(metrics, "tidemark_open_shards");
  // Idle figures count only if every sink still runs (a failed sink costs
  // nothing).
  const std::string listed = call(http::verb::get, "/v1/sinks").body;
  std::uint64_t running = 0;
  for (std::size_t at = listed.find("\"status\":\"running\""); at != std::string::npos;
       at = listed.find("\"status\":\"running\"", at + 1)) {
    ++running;
  }
  (*server)->stop();
  if (running != sinks) {
    std::size_t failed = listed.find("\"error\":\"");
    return report(make_error(ErrorKind::kDeterminate,
                             std::to_string(running) + " of " + std::to_string(sinks) +
                                 " sinks running when idle; first error: " +
                                 (failed == std::string::npos ? std::string("none")
                                                              : listed.substr(failed, 300)))
                      .error());
  }

  const double n = static_cast<double>(shards);
  if (args->has("--json")) {
    std::printf(
        "{\"shards\":%llu,\"sinks\":%llu,\"open_seconds\":%.2f,\"baseline_threads\":%d,"
        "\"open_threads\":%d,\"idle_threads\":%d,\"baseline_rss_mib\":%.1f,\"open_rss_mib\":%.1f,"
        "\"idle_rss_mib\":%.1f,\"open_kib_per_shard\":%.1f,\"idle_kib_per_shard\":%.1f,"
        "\"open_cpu\":%.4f,\"idle_cpu\":%.4f,\"idle_open_shards\":%.0f}\n",
        static_cast<unsigned long long>(shards), static_cast<unsigned long long>(sinks),
        open_seconds, baseline.threads, open.threads, idle.threads, baseline.rss_mib, open.rss_mib,
        idle.rss_mib, (open.rss_mib - baseline.rss_mib) * 1024 / n,
        (idle.rss_mib - baseline.rss_mib) * 1024 / n, open_cpu, idle_cpu, open_shards);
    return kExitOk;
  }
  std::printf(
      "bench shards: %llu shards (one managed append each), %llu file sinks, "
      "idle_close %llu s; opened in %.1f s\n",
      static_cast<unsigned long long>(shards), static_cast<unsigned long long>(sinks),
      static_cast<unsigned long long>(idle_close), open_seconds);
  std::printf("  %-9s %8s %10s %14s %12s\n", "", "threads", "RSS MiB", "KiB per shard", "idle CPU");
  std::printf("  %-9s %8d %10.1f %14s %12s\n", "baseline", baseline.threads, baseline.rss_mib, "",
              "");
  std::printf("  %-9s %8d %10.1f %14.1f %11.2f%%\n", "open", open.threads, open.rss_mib,
              (open.rss_mib - baseline.rss_mib) * 1024 / n, open_cpu * 100);
  std::printf("  %-9s %8d %10.1f %14.1f %11.2f%%   (%.0f shards still open)\n", "idle",
              idle.threads, idle.rss_mib, (idle.rss_mib - baseline.rss_mib) * 1024 / n,
              idle_cpu * 100, open_shards);
  return kExitOk;
}

}  // namespace tidemark::cli
