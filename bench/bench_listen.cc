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
// Then, over HTTP (--idle S, default 10,000; 0 skips it): a child
// `tidemark bench listen-child DIR serve` runs a server on the embedded
// default in DIR/wake on a free port with the shard "wake", and this
// process is its client (the streams open 200 at a time, 50 ms apart).
// Write-to-listen: --appends N (default 200)
// managed appends of one record, one at a time, each timed from its
// request's send to its update line's arrival on one open listen stream
// (p50/p90/p99). Idle listeners: S more listen streams open and idle; the
// server's CPU (user + system, /proc) over --window W seconds (default
// 10) with nothing appended, in % of one core, and its RSS before and
// after opening them; then one append, and the time until every stream
// has its line (streams still without it after 60 s are counted).
//
// Benchmarks report figures; they never pass or fail on time. A listen
// that does not emit one row per update after time 0, or a stream that
// never sees the append, is a correctness failure: the command says so
// and exits 1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "cli/cli.h"
#include "tidemark/read.h"
#include "tidemark/server.h"
#include "tidemark/write.h"
#include "util/number.h"
#include "util/try.h"

namespace tidemark::cli {
namespace {

using Clock = BenchClock;

constexpr const char* kListenChild = "listen-child";
constexpr const char* kUsage =
    "bench listen [--updates N] [--times T] [--rounds R] [--appends N] [--idle S] [--window W] "
    "[--dir DIR] [--json]";
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

// --- Over HTTP: write-to-listen and idle listeners -----------------------

constexpr const char* kWakeShard = "wake";

// The server child: serves DIR/wake on a free port with the shard "wake",
// prints the port, and stops when its standard input closes.
int serve_child(const std::string& dir) {
  struct rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;  // one descriptor per stream
    setrlimit(RLIMIT_NOFILE, &files);
  }
  auto client = open_client(data_directory(dir));
  if (!client) return report(client.error());
  if (auto created = (*client)->create_shard(kWakeShard); !created) {
    return report(created.error());
  }
  ServerOptions options;
  options.port = 0;
  options.max_connections = files.rlim_cur > 200 ? files.rlim_cur - 100 : 100;
  auto server = Server::start(*client, options);
  if (!server) return report(server.error());
  std::printf("%u\n", static_cast<unsigned>((*server)->port()));
  std::fflush(stdout);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  return kExitOk;
}

// A connection to the server child, closed with the object.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

Result<Socket> connect_to(std::uint16_t port) {
  Socket s(socket(AF_INET, SOCK_STREAM, 0));
  if (s.fd() < 0) return determinate("socket failed (too many open files?)");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    return determinate("cannot connect to the server child on port " + std::to_string(port));
  }
  return s;
}

Status send_all(const Socket& s, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(s.fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return determinate("send to the server child failed");
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// Reads what `s` has into `*into` until it holds `needle`, waiting at most
// `wait`. False if it did not come.
bool read_until(const Socket& s, std::string* into, std::string_view needle,
                std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  char buffer[65536];
  while (into->find(needle) == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{s.fd(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = recv(s.fd(), buffer, sizeof buffer, 0);
    if (n <= 0) return false;
    into->append(buffer, static_cast<std::size_t>(n));
    // Keep only the tail a needle could straddle.
    if (into->size() > (1 << 20)) into->erase(0, into->size() - 4096);
  }
  return true;
}

// A managed append of one record with key `key`, sent on its own
// connection; the connection is returned for its answer to be read later.
Result<Socket> send_append(std::uint16_t port, const std::string& key) {
  TM_ASSIGN(Socket s, connect_to(port));
  const std::string body = "{\"key\":\"" + key + "\",\"value\":1}\n";
  TM_TRY(send_all(s, "POST /v1/shards/" + std::string(kWakeShard) +
                         "/append HTTP/1.1\r\nHost: bench\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body));
  return s;
}

Status finish_append(const Socket& s) {
  std::string answer;
  if (!read_until(s, &answer, "\r\n\r\n", std::chrono::seconds(30)) ||
      !answer.starts_with("HTTP/1.1 200")) {
    return determinate("an append to the server child failed: " + answer.substr(0, 200));
  }
  return {};
}

Result<Socket> open_listen_stream(std::uint16_t port) {
  TM_ASSIGN(Socket s, connect_to(port));
  TM_TRY(send_all(s, "GET /v1/shards/" + std::string(kWakeShard) +
                         "/listen?from=0 HTTP/1.1\r\nHost: bench\r\n\r\n"));
  return s;
}

// /proc/PID/stat's user + system time, in seconds.
double process_cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) {
      stime = std::stoull(field);
      break;
    }
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double process_rss_mib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("VmRSS:")) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// Reads every stream until each has `needle`, for at most `wait`; the
// number that did not get it (a stream closed early among them).
std::uint64_t wait_for_all(const std::vector<Socket>& streams, std::string_view needle,
                           std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  std::vector<std::string> tails(streams.size());
  std::vector<std::size_t> pending(streams.size());
  for (std::size_t i = 0; i < streams.size(); ++i) pending[i] = i;
  char buffer[65536];
  std::uint64_t closed = 0;
  while (!pending.empty() && Clock::now() < deadline) {
    std::vector<pollfd> fds;
    fds.reserve(pending.size());
    for (std::size_t i : pending) fds.push_back(pollfd{streams[i].fd(), POLLIN, 0});
    if (poll(fds.data(), fds.size(), 1000) <= 0) continue;
    std::vector<std::size_t> still;
    for (std::size_t j = 0; j < fds.size(); ++j) {
      const std::size_t i = pending[j];
      if (!(fds[j].revents & (POLLIN | POLLHUP | POLLERR))) {
        still.push_back(i);
        continue;
      }
      const ssize_t n = recv(streams[i].fd(), buffer, sizeof buffer, 0);
      if (n <= 0) {
        ++closed;  // it never will
        continue;
      }
      tails[i].append(buffer, static_cast<std::size_t>(n));
      if (tails[i].find(needle) != std::string::npos) {
        tails[i].clear();
        continue;
      }
      if (tails[i].size() > 4096) tails[i].erase(0, tails[i].size() - needle.size());
      still.push_back(i);
    }
    pending.swap(still);
  }
  return pending.size() + closed;
}

struct WakeFigures {
  std::uint64_t appends = 0, idle = 0;
  double window_seconds = 0;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0;
  double idle_cpu_percent = 0;
  double rss_before_mib = 0, rss_with_streams_mib = 0;
  double all_woken_seconds = 0;
  std::uint64_t not_woken = 0;
};

// The server child, stopped (its standard input closed) and waited for
// when destroyed.
class ServeChild {
 public:
  static Result<std::unique_ptr<ServeChild>> start(const std::filesystem::path& dir) {
    TM_ASSIGN(const BenchChild spawned,
              spawn_bench_child(kListenChild, {dir.string(), "serve"}, /*with_stdin=*/true));
    auto child = std::make_unique<ServeChild>();
    child->pid_ = spawned.pid;
    child->stdin_ = spawned.stdin_fd;
    const int out = spawned.stdout_fd;
    std::string line;
    char c;
    while (read(out, &c, 1) == 1 && c != '\n') line.push_back(c);
    close(out);
    auto port = parse_decimal(line, 1, 65535);
    if (!port) return determinate("the server child printed \"" + line + "\", not its port");
    child->port_ = static_cast<std::uint16_t>(*port);
    return child;
  }
  ~ServeChild() {
    if (stdin_ >= 0) close(stdin_);
    if (pid_ > 0) {
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::uint16_t port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  std::uint16_t port_ = 0;
};

Result<WakeFigures> run_wake_bench(const std::filesystem::path& dir, std::uint64_t appends,
                                   std::uint64_t idle, std::uint64_t window) {
  struct rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_cur < idle + 100) {
      return invalid_usage("--idle " + std::to_string(idle) + " needs " +
                           std::to_string(idle + 100) + " open files; the limit is " +
                           std::to_string(files.rlim_cur));
    }
  }
  WakeFigures f;
  f.appends = appends;
  f.idle = idle;
  f.window_seconds = static_cast<double>(window);
  TM_ASSIGN(auto child, ServeChild::start(dir / "wake"));
  const std::uint16_t port = child->port();
  // Write-to-listen on one stream.
  TM_ASSIGN(Socket stream, open_listen_stream(port));
  std::string seen;
  std::vector<double> latencies_ms;
  for (std::uint64_t i = 0; i < appends; ++i) {
    const std::string key = "w" + std::to_string(i);
    const auto sent = Clock::now();
    TM_ASSIGN(Socket append, send_append(port, key));
    if (!read_until(stream, &seen, "\"" + key + "\"", std::chrono::seconds(60))) {
      return determinate("correctness failure: append " + key +
                         " never reached the open listen stream");
    }
    latencies_ms.push_back(seconds_since(sent) * 1000);
    TM_TRY(finish_append(append));
  }
  f.p50_ms = percentile(latencies_ms, 0.5);
  f.p90_ms = percentile(latencies_ms, 0.9);
  f.p99_ms = percentile(latencies_ms, 0.99);
  // Idle listeners.
  f.rss_before_mib = process_rss_mib(child->pid());
  std::vector<Socket> streams;
  streams.reserve(idle);
  for (std::uint64_t i = 0; i < idle; ++i) {
    TM_ASSIGN(Socket s, open_listen_stream(port));
    streams.push_back(std::move(s));
    // 200 at a time, as clients arrive, not 10,000 in one burst (whose
    // history reads would all hold a chunk at once: a high-water mark of
    // the allocator, not what an idle stream holds).
    if (i % 200 == 199) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Every stream has read the history up to the last append, and is idle.
  const std::string last = "\"w" + std::to_string(appends - 1) + "\"";
  if (wait_for_all(streams, last, std::chrono::seconds(120)) > 0) {
    return determinate("correctness failure: idle listen streams never read the history");
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double cpu_before = process_cpu_seconds(child->pid());
  std::this_thread::sleep_for(std::chrono::seconds(window));
  f.idle_cpu_percent =
      (process_cpu_seconds(child->pid()) - cpu_before) * 100.0 / static_cast<double>(window);
  f.rss_with_streams_mib = process_rss_mib(child->pid());
  // One append wakes them all.
  const auto sent = Clock::now();
  TM_ASSIGN(Socket append, send_append(port, "wake-all"));
  const std::uint64_t waiting = wait_for_all(streams, "\"wake-all\"", std::chrono::seconds(60));
  f.all_woken_seconds = seconds_since(sent);
  f.not_woken = waiting;
  TM_TRY(finish_append(append));
  return f;
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
  if (argv.size() == 3 && argv[0] == kListenChild && argv[2] == "serve") {
    return serve_child(argv[1]);
  }
  auto args = Args::parse(
      argv, {"--updates", "--times", "--rounds", "--appends", "--idle", "--window", "--dir"},
      {"--json"});
  if (!args) return usage_error(args.error().message);
  if (args->positionals() != std::vector<std::string>{"listen"}) return usage_error(kUsage);
  if (globals.blob_url || globals.consensus_url) {
    return usage_error("bench listen runs on the embedded default only (no --blob, --consensus)");
  }
  std::uint64_t updates = 4'000'000, times = 5'000, rounds = 3;
  std::uint64_t appends = 200, idle = 10'000, window = 10;
  for (auto [flag, out, least, most] : {std::tuple{"--updates", &updates, 1ull, 1'000'000'000ull},
                                        std::tuple{"--times", &times, 1ull, 1'000'000'000ull},
                                        std::tuple{"--rounds", &rounds, 1ull, 100ull},
                                        std::tuple{"--appends", &appends, 1ull, 1'000'000ull},
                                        std::tuple{"--idle", &idle, 0ull, 1'000'000ull},
                                        std::tuple{"--window", &window, 1ull, 3'600ull}}) {
    if (auto text = args->get(flag)) {
      auto n = parse_decimal(*text, least, most);
      if (!n) {
        return usage_error(std::string(flag) + " takes " + std::to_string(least) + " to " +
                           std::to_string(most));
      }
      *out = *n;
    }
  }
  if (updates % 7919 == 0) return usage_error("--updates must not be a multiple of 7919");
  auto dir = BenchDirectory::create("listen", args->get("--dir"));
  if (!dir) return report(dir.error());
  auto figures = run_listen_bench(dir->path(), updates, times, static_cast<int>(rounds));
  if (!figures) return report(figures.error());
  const Figures& f = *figures;
  std::optional<WakeFigures> wake;
  if (idle > 0) {
    auto measured = run_wake_bench(dir->path(), appends, idle, window);
    if (!measured) return report(measured.error());
    wake = *measured;
  }
  if (args->has("--json")) {
    std::printf(
        "{\"updates\":%llu,\"times\":%llu,\"rounds\":%d,\"parts\":%llu,\"bytes\":%llu,"
        "\"ingest_seconds\":%.3f,\"snapshot_rows\":%llu,\"snapshot_seconds\":%.3f,"
        "\"snapshot_cpu_seconds\":%.3f,\"snapshot_peak_rss_mib\":%.1f,\"listen_rows\":%llu,"
        "\"listen_seconds\":%.3f,\"listen_cpu_seconds\":%.3f,\"listen_peak_rss_mib\":%.1f,"
        "\"listen_over_snapshot\":%.2f",
        static_cast<unsigned long long>(f.updates), static_cast<unsigned long long>(f.times),
        f.rounds, static_cast<unsigned long long>(f.parts),
        static_cast<unsigned long long>(f.bytes), f.ingest_seconds,
        static_cast<unsigned long long>(f.snapshot_rows), f.snapshot_seconds,
        f.snapshot_cpu_seconds, f.snapshot_peak_rss_mib,
        static_cast<unsigned long long>(f.listen_rows), f.listen_seconds, f.listen_cpu_seconds,
        f.listen_peak_rss_mib, ratio(f.listen_seconds, f.snapshot_seconds));
    if (wake) {
      std::printf(
          ",\"appends\":%llu,\"write_to_listen_ms\":{\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f},"
          "\"idle_streams\":%llu,\"idle_window_seconds\":%.0f,\"idle_cpu_percent_of_a_core\":%.2f,"
          "\"rss_mib_before\":%.1f,\"rss_mib_with_streams\":%.1f,\"all_woken_seconds\":%.3f,"
          "\"not_woken\":%llu",
          static_cast<unsigned long long>(wake->appends), wake->p50_ms, wake->p90_ms, wake->p99_ms,
          static_cast<unsigned long long>(wake->idle), wake->window_seconds, wake->idle_cpu_percent,
          wake->rss_before_mib, wake->rss_with_streams_mib, wake->all_woken_seconds,
          static_cast<unsigned long long>(wake->not_woken));
    }
    std::printf("}\n");
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
    if (wake) {
      std::printf(
          "write-to-listen over HTTP   p50 %.2f ms, p90 %.2f ms, p99 %.2f ms (%llu appends)\n",
          wake->p50_ms, wake->p90_ms, wake->p99_ms, static_cast<unsigned long long>(wake->appends));
      std::printf(
          "%llu idle listen streams   %.2f%% of a core over %.0f s, RSS %.1f -> %.1f MiB "
          "(%.1f KiB each)\n",
          static_cast<unsigned long long>(wake->idle), wake->idle_cpu_percent, wake->window_seconds,
          wake->rss_before_mib, wake->rss_with_streams_mib,
          (wake->rss_with_streams_mib - wake->rss_before_mib) * 1024.0 /
              static_cast<double>(wake->idle));
      std::printf("one append woke them all in %.3f s (%llu not woken)\n", wake->all_woken_seconds,
                  static_cast<unsigned long long>(wake->not_woken));
    }
  }
  if (wake && wake->not_woken > 0) {
    std::fprintf(stderr, "correctness failure: %llu idle listen streams never saw the append\n",
                 static_cast<unsigned long long>(wake->not_woken));
    return kExitError;
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
