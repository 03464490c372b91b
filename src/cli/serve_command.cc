// `tidemark serve`: the HTTP server on the configured location.
#include <sys/resource.h>

#include <charconv>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/cli.h"
#include "location/faulty.h"
#include "location/file_lock.h"
#include "shard/random_config.h"
#include "sink/destination_url.h"
#include "tidemark/server.h"
#include "util/ids.h"
#include "util/log.h"
#include "util/number.h"
#include "util/process_identity.h"
#include "util/size.h"
#include "util/thread.h"

namespace tidemark::cli {
namespace {

// The data directory is one server's: <data>/server.lock, flocked for the
// server's life (the kernel releases it when the process dies, however it
// dies), and naming it for a second server, which exits at once. Taken
// before anything in the directory is touched. Other commands do not take
// it: shards may be shared (SQLite and file blobs are safe for many
// processes), and what is the server's alone, its sinks, is claimed sink
// by sink (sink/sink_claim.h).
constexpr const char* kDataLockName = "server.lock";
// SIGTERM: requests in flight and sinks get the grace (--shutdown-grace,
// default kShutdownGrace); the process exits regardless kShutdownSlack
// later.
constexpr std::chrono::seconds kShutdownGrace{10};
constexpr std::chrono::seconds kShutdownSlack{10};

std::string lock_holder_line(const ProcessIdentity& process, const std::string& listening) {
  return "tidemark serve (" + describe(process) + ", " + listening + ")";
}

Result<FileLock> lock_data_directory(const std::string& data_dir) {
  std::error_code error;
  std::filesystem::create_directories(data_dir, error);
  if (error) return determinate("create " + data_dir + ": " + error.message());
  const std::string path = std::filesystem::absolute(data_dir).lexically_normal().string();
  auto lock = FileLock::acquire(path + "/" + kDataLockName,
                                lock_holder_line(this_process(), "not listening yet"));
  if (!lock && lock.error().is(ErrorKind::kHeld)) {
    return make_error(ErrorKind::kHeld, "data directory " + path + " is used by " +
                                            lock.error().message +
                                            ": stop it first, or give this server another --data");
  }
  return lock;
}

// This server's id among servers sharing a blob store (it owns the sinks
// it creates): <data>/server-id, made on first start.
Result<std::string> server_id(const std::string& data_dir) {
  const std::filesystem::path path = std::filesystem::path(data_dir) / "server-id";
  std::ifstream in(path);
  std::string id;
  if (in && std::getline(in, id) && !id.empty()) return id;
  std::error_code error;
  std::filesystem::create_directories(data_dir, error);
  if (error) return determinate("create " + data_dir + ": " + error.message());
  id = random_id();
  std::ofstream out(path, std::ios::trunc);
  out << id << "\n";
  out.close();
  if (!out) return determinate("write " + path.string());
  return id;
}

// The client's buffers, sized from the server's memory limit so that a
// small --memory-limit shrinks them too: each batch builder holds
// part_target_bytes x (1 + uploads in flight), which no pool accounts for,
// and each listen or sink reading a batch of many times orders it in
// listen_buffer_bytes, plus merge buffers of at most the same again (up
// to 4 MiB) when it spills, charged to its read memory (the reads pool
// for an HTTP listen, the sinks' pool for a sink). Each takes at most
// limit / 32 (8 MiB at the default 256 MiB; 2 MiB at 64 MiB), never less
// than 64 KiB.
ClientOptions fit_to_memory_limit(ClientOptions client, std::uint64_t memory_limit) {
  const std::uint64_t share = std::max<std::uint64_t>(memory_limit / 32, 64 << 10);
  const std::uint64_t builders = 1 + std::max<std::size_t>(client.max_uploads_in_flight, 1);
  client.part_target_bytes = std::min(client.part_target_bytes, share / builders);
  client.listen_buffer_bytes = std::min(client.listen_buffer_bytes, share);
  return client;
}

}  // namespace

int run_serve(const Globals& globals, const std::vector<std::string>& argv) {
  auto args = Args::parse(
      argv,
      {"--listen", "--memory-limit", "--token-file", "--max-record-bytes", "--lease",
       "--producer-expiry", "--max-producers", "--retry-deadline", "--max-connections",
       "--min-body-rate", "--shutdown-grace", "--allow-s3-endpoints", "--allow-kafka-brokers",
       "--inject-blob-latency-ms", "--appender-queue", "--log-level", "--sink-snapshot-part-bytes"},
      {});
  if (!args) return usage_error(args.error().message);
  if (!args->positionals().empty())
    return usage_error("serve takes no arguments but its options (tidemark serve --help)");
  ServerOptions options;
  if (auto listen = args->get("--listen")) {
    const auto colon = listen->rfind(':');
    if (colon == std::string::npos) return usage_error("--listen takes HOST:PORT");
    options.host = listen->substr(0, colon);
    const auto port = parse_decimal(std::string_view(*listen).substr(colon + 1), 0, 65535);
    if (!port) return usage_error("--listen takes HOST:PORT, got " + *listen);
    options.port = static_cast<std::uint16_t>(*port);
  }
  if (auto limit = args->get("--memory-limit")) {
    auto bytes = parse_size(*limit);
    if (!bytes) return usage_error("--memory-limit: " + bytes.error().message);
    options.memory_limit = *bytes;
  }
  if (auto limit = args->get("--max-record-bytes")) {
    auto bytes = parse_size(*limit);
    if (!bytes) return usage_error("--max-record-bytes: " + bytes.error().message);
    options.max_record_bytes = *bytes;
  }
  if (auto file = args->get("--token-file")) {
    std::ifstream in(*file);
    if (!in) {
      std::fprintf(stderr, "tidemark: cannot read token file %s\n", file->c_str());
      return kExitError;
    }
    std::stringstream text;
    text << in.rdbuf();
    std::string token = text.str();
    while (!token.empty() &&
           (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
      token.pop_back();
    }
    if (token.empty()) {
      std::fprintf(stderr, "tidemark: token file %s is empty\n", file->c_str());
      return kExitError;
    }
    options.token = std::move(token);
  }

  double blob_latency_ms = 0;
  if (auto latency = args->get("--inject-blob-latency-ms")) {
    try {
      std::size_t used = 0;
      blob_latency_ms = std::stod(*latency, &used);
      if (used != latency->size() || blob_latency_ms < 0) throw std::invalid_argument(*latency);
    } catch (...) {
      return usage_error("--inject-blob-latency-ms takes milliseconds, got " + *latency);
    }
  }
  if (auto queue = args->get("--appender-queue")) {
    if (queue->starts_with("records:")) {
      // The whole rest, a count from 1: not "12x" as 12, nor "-1" wrapped.
      const auto n = parse_decimal(std::string_view(*queue).substr(8), 1, 1'000'000'000);
      if (!n) {
        return usage_error("--appender-queue records:N takes N from 1 to 1000000000, got " +
                           *queue);
      }
      options.appender_queue_records = static_cast<std::size_t>(*n);
    } else if (*queue != "bytes") {
      return usage_error("--appender-queue takes bytes or records:N");
    }
  }

  // --lease: how long this server's writers and readers keep their leases
  // without a heartbeat (a paused or cut-off server's are dropped then).
  std::optional<std::chrono::milliseconds> lease;
  if (auto text = args->get("--lease")) {
    const auto ms = parse_decimal(*text, 100, 24ull * 3600 * 1000);
    if (!ms) return usage_error("--lease takes milliseconds from 100 to a day, got " + *text);
    lease = std::chrono::milliseconds(*ms);
  }
  // Idempotent producers: how long a shard remembers one that commits
  // nothing, and how many it keeps.
  std::optional<std::chrono::milliseconds> producer_expiry;
  if (auto text = args->get("--producer-expiry")) {
    auto ms = whole_number(*text, 1000, 365ull * 24 * 3600 * 1000);
    if (!ms)
      return usage_error("--producer-expiry takes milliseconds from 1000 to a year, got " + *text);
    producer_expiry = std::chrono::milliseconds(*ms);
  }
  // How long a read (a snapshot, a listen, a sink) goes on retrying a
  // backend that fails before it gives up (503, or an error line).
  std::optional<std::chrono::milliseconds> retry_deadline;
  if (auto text = args->get("--retry-deadline")) {
    auto ms = whole_number(*text, 0, 24ull * 3600 * 1000);
    if (!ms) return usage_error("--retry-deadline takes milliseconds up to a day, got " + *text);
    retry_deadline = std::chrono::milliseconds(*ms);
  }
  std::optional<std::size_t> max_producers;
  if (auto text = args->get("--min-body-rate")) {
    auto bytes = parse_size(*text);
    if (!bytes) return usage_error("--min-body-rate takes bytes a second (0: none), got " + *text);
    options.min_body_rate = *bytes;
  }
  if (auto text = args->get("--sink-snapshot-part-bytes")) {
    auto bytes = parse_size(*text);
    if (!bytes || *bytes == 0) {
      return usage_error("--sink-snapshot-part-bytes takes a size above 0 (1048576, 64MiB), got " +
                         *text);
    }
    options.sink_snapshot_part_bytes = *bytes;
  }
  if (auto text = args->get("--log-level")) {
    auto level = parse_log_level(*text);
    if (!level) return usage_error("--log-level takes error, warn, info or debug, got " + *text);
    set_log_level(*level);
  }
  std::chrono::seconds grace = kShutdownGrace;
  if (auto text = args->get("--shutdown-grace")) {
    auto n = whole_number(*text, 0, 3600);
    if (!n) return usage_error("--shutdown-grace takes 0 to 3600 seconds, got " + *text);
    grace = std::chrono::seconds(*n);
  }
  if (auto text = args->get("--max-connections")) {
    auto n = whole_number(*text, 0, 1'000'000);
    if (!n) return usage_error("--max-connections takes 0 (no limit) to 1000000, got " + *text);
    options.max_connections = *n;
  }
  // Connections, backends and sinks all take file descriptors: the soft
  // limit is raised to the hard one, and the connection limit kept below
  // what is left, so the server refuses a connection (503) before it runs
  // out of descriptors.
  if (rlimit files{}; ::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    if (files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      (void)::setrlimit(RLIMIT_NOFILE, &files);
      (void)::getrlimit(RLIMIT_NOFILE, &files);
    }
    constexpr rlim_t kReservedFiles = 256;
    const rlim_t room = files.rlim_cur > kReservedFiles + 16 ? files.rlim_cur - kReservedFiles : 16;
    if (files.rlim_cur != RLIM_INFINITY &&
        (options.max_connections == 0 || options.max_connections > room)) {
      std::fprintf(stderr, "tidemark: at most %llu connections (open files are limited to %llu)\n",
                   static_cast<unsigned long long>(room),
                   static_cast<unsigned long long>(files.rlim_cur));
      options.max_connections = static_cast<std::size_t>(room);
    }
  }
  // The S3 endpoints and Kafka brokers sinks created over HTTP may reach:
  // none unless listed.
  options.allowed_s3_endpoints = args->get("--allow-s3-endpoints").value_or("");
  options.allowed_kafka_brokers = args->get("--allow-kafka-brokers").value_or("");
  auto allowed =
      DestinationAllowList::parse(options.allowed_s3_endpoints, options.allowed_kafka_brokers);
  if (!allowed) return usage_error(allowed.error().message);
  if (auto text = args->get("--max-producers")) {
    auto n = whole_number(*text, 1, 1'000'000);
    if (!n) return usage_error("--max-producers takes 1 to 1000000, got " + *text);
    max_producers = *n;
  }

  // TIDEMARK_RANDOM_CONFIG (testing): client, appender and fault knobs
  // drawn from a seed, printed first so a failing run can be repeated.
  auto random_seed = random_config_seed_from_env();
  if (!random_seed) return report(random_seed.error());
  std::optional<RandomConfig> random;
  if (*random_seed) {
    random = draw_random_config(**random_seed);
    std::fprintf(stderr, "tidemark: random configuration %s\n", random->describe().c_str());
    std::fflush(stderr);
    options.appender = random->appender;  // the server sets its pool and queue bound
  }

  // SIGTERM and SIGINT stop the server gracefully: blocked here, waited for.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before any thread starts

  auto data_lock = lock_data_directory(globals.data_dir);
  if (!data_lock) return report(data_lock.error());
  auto urls = location_urls(globals);
  if (!urls) return report(urls.error());
  // File sinks write under the data directory only.
  options.file_sink_root = std::filesystem::absolute(globals.data_dir).string() + "/sinks";
  auto id = server_id(globals.data_dir);
  if (!id) return report(id.error());
  options.sink_owner = *id;
  auto blob = open_blob(urls->first);
  if (!blob) return report(blob.error());
  auto consensus = open_consensus(urls->second);
  if (!consensus) return report(consensus.error());
  FaultConfig blob_faults = random ? random->blob_faults : FaultConfig{};
  if (blob_latency_ms > 0) {  // the flag's latency over a drawn one
    blob_faults.latency =
        std::chrono::microseconds(static_cast<std::int64_t>(blob_latency_ms * 1000));
  }
  std::shared_ptr<Blob> served_blob = *blob;
  if (injects_faults(blob_faults)) served_blob = std::make_shared<FaultyBlob>(*blob, blob_faults);
  std::shared_ptr<Consensus> served_consensus = *consensus;
  if (random && injects_faults(random->consensus_faults)) {
    served_consensus = std::make_shared<FaultyConsensus>(*consensus, random->consensus_faults);
  }
  // A long-running server compacts in the background (unless a random
  // configuration drew otherwise).
  ClientOptions client_options =
      fit_to_memory_limit(random ? random->client : ClientOptions{}, options.memory_limit);
  // A server always compacts in the background (nothing else would: no
  // flag turns it off), and its reads' memory relies on it: a snapshot
  // holds a block per input, and compaction keeps the inputs few. A drawn
  // "off" applies to the engine's own tests.
  client_options.background_compaction = true;
  client_options.scratch_directory =
      (std::filesystem::absolute(globals.data_dir).lexically_normal() / "scratch").string();
  if (lease) client_options.writer_lease = client_options.reader_lease = *lease;
  if (producer_expiry) client_options.producer_expiry = *producer_expiry;
  if (max_producers) client_options.max_producers = *max_producers;
  if (retry_deadline) {
    client_options.read_retry.deadline = *retry_deadline;
    if (retry_deadline->count() == 0) client_options.read_retry.max_attempts = 1;
  }
  auto client = Client::open(Location{served_blob, served_consensus}, client_options);
  if (!client) return report(client.error());
  auto server = Server::start(*client, options);
  if (!server) return report(server.error());
  const std::string listening =
      "listening on " + options.host + ":" + std::to_string((*server)->port());
  if (auto described = data_lock->describe(lock_holder_line(this_process(), listening));
      !described) {
    std::fprintf(stderr, "tidemark: warning: %s\n", described.error().message.c_str());
  }
  std::fprintf(stderr, "tidemark: serving on http://%s:%u (memory limit %s)%s\n",
               options.host.c_str(), static_cast<unsigned>((*server)->port()),
               format_size(options.memory_limit).c_str(),
               options.token ? ", bearer token required" : "");
  std::fflush(stderr);
  int signal = 0;
  sigwait(&signals, &signal);
  std::fprintf(stderr, "tidemark: signal %d: stopping (finishing commits in flight)\n", signal);
  std::fflush(stderr);
  // The stop is bounded by the grace plus cancellations, except where a
  // backend of the shards themselves (the blob store, consensus) never
  // answers a flush: past grace + kShutdownSlack the process exits as if
  // killed, which loses nothing acknowledged.
  if (auto watchdog = start_thread("the shutdown watchdog", [grace] {
        std::this_thread::sleep_for(grace + kShutdownSlack);
        std::fprintf(stderr,
                     "tidemark: still stopping %lld s after the signal (a backend not "
                     "answering?): exiting now; every acknowledged write is durable, requests "
                     "in flight were cut\n",
                     static_cast<long long>((grace + kShutdownSlack).count()));
        std::fflush(stderr);
        std::_Exit(kExitError);
      })) {
    watchdog->detach();
  }
  (*server)->stop(grace);
  std::fprintf(stderr, "tidemark: stopped\n");
  return kExitOk;
}

}  // namespace tidemark::cli
