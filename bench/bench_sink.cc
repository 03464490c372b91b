// tidemark bench sink: issue #5's hot-key fan-out for docs/benchmarks.md.
// One update with a huge diff, sunk into a file sink or into Kafka, on the
// embedded default (file blob + SQLite) in a scratch directory.
//
//   tidemark bench sink [--diff N] [--envelope upsert|debezium] [--to file|kafka]
//                       [--dir DIR] [--json]
//
// --to kafka starts tidemark-kafka-mock (next to this binary) as a process
// of its own, so the broker's memory is not the sink's, and writes its
// address to DIR/kafka-brokers for the child. The child's KafkaDestination
// draws its 16 MiB producer queue from a 64 MiB sink pool, as `tidemark
// sink run` does. Every message has the one key, so all go to one
// partition; the mock keeps only its last ~5 MB per partition, so the
// check is the broker's acknowledgements: the committed progress record's
// offset range must hold exactly N offsets (one producer: contiguous).
//
// The parent creates the shard "sink" and appends one update
// {"key":"hot","value":1,"time":0,"diff":N} (default N = 10,000,000) in the
// batch [0, 1). A child process (`tidemark bench sink-child DIR`, or
// `sink-debezium-child` for --envelope debezium) then runs run_sink
// with as_of 0 and until 1 into DIR/out as json, so the snapshot's N pairs
// all go into one committed file, and its peak RSS is the sink's alone:
// the child reads its own VmHWM (ru_maxrss of a spawned child would count
// the parent's RSS too). It prints one line: pairs, seconds and CPU
// seconds of run_sink, output bytes, VmHWM before and after the sink.
//
//   pairs/s, MB/s     pairs and output bytes over the wall time of
//                     run_sink (open reader, snapshot, walk, write,
//                     fsync, rename); also per CPU second, since the VM's
//                     cores are shared
//   peak RSS          the child's VmHWM: binary, SQLite and sink together;
//                     and its VmHWM just before run_sink
//
// Benchmarks report figures; they never pass or fail on time. An output
// that does not hold exactly N lines (counted by streaming the file) is a
// correctness failure: the command says so and exits 1.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "bench_util.h"
#include "cli/cli.h"
#include "sink/destination_url.h"
#include "sink/kafka_destination.h"
#include "sink/kafka_reader.h"
#include "sink/sink_claim.h"
#include "testing/kafka_mock_process.h"
#include "tidemark/sink.h"
#include "tidemark/write.h"
#include "util/try.h"

namespace tidemark::cli {
namespace {

using Clock = BenchClock;

constexpr const char* kSinkUsage =
    "bench sink [--diff N] [--envelope upsert|debezium] [--to file|kafka] [--dir DIR] [--json]";
constexpr const char* kShardName = "sink";
constexpr const char* kSinkName = "bench";
constexpr const char* kUpsertChild = "sink-child";
constexpr const char* kDebeziumChild = "sink-debezium-child";
constexpr const char* kBrokersFile = "kafka-brokers";  // in DIR: sink into Kafka
constexpr const char* kTopic = "bench";

// DIR/kafka-brokers, if the parent wrote one.
std::optional<std::string> kafka_brokers(const std::filesystem::path& dir) {
  FILE* file = std::fopen((dir / kBrokersFile).c_str(), "r");
  if (file == nullptr) return std::nullopt;
  char line[256] = {0};
  const bool read = std::fgets(line, sizeof line, file) != nullptr;
  std::fclose(file);
  if (!read) return std::nullopt;
  std::string brokers(line);
  while (!brokers.empty() && (brokers.back() == '\n' || brokers.back() == '\r')) brokers.pop_back();
  return brokers;
}

KafkaAddress bench_address(const std::string& brokers) {
  KafkaAddress address;
  address.brokers = brokers;
  address.topic = kTopic;
  address.progress_topic = std::string(kTopic) + "-progress";
  return address;
}

// The shard: one update of key "hot", value 1, at time 0 with diff `diff`,
// in the batch [0, 1).
Status write_hot_key(const std::filesystem::path& dir, Diff diff) {
  TM_ASSIGN(auto client, Client::open(blob_url(dir), consensus_url(dir)));
  TM_TRY(client->create_shard(kShardName));
  TM_ASSIGN(auto shard, client->open_shard(kShardName));
  TM_ASSIGN(auto writer, shard->open_writer());
  const Update update{"\"hot\"", "1", 0, diff};
  TM_ASSIGN(Batch batch, writer->batch(std::span(&update, 1), Frontier::at(0), Frontier::at(1)));
  return writer->compare_and_append(std::span(&batch, 1), Frontier::at(0), Frontier::at(1));
}

struct SinkRun {
  unsigned long long pairs = 0, files = 0, violations = 0, bytes = 0;
  double seconds = 0, cpu_seconds = 0;
  unsigned long long rss_before_kib = 0, peak_rss_kib = 0;
};

// The sink of DIR's shard into DIR/out, timed.
Result<SinkRun> sink_once(const std::filesystem::path& dir, Envelope envelope) {
  TM_ASSIGN(auto client, Client::open(blob_url(dir), consensus_url(dir)));
  TM_ASSIGN(auto shard, client->open_shard(kShardName));
  // Opened as `tidemark sink run --to URL` opens it: the same pool and queue.
  const auto brokers = kafka_brokers(dir);
  const std::string url = brokers ? "kafka://" + *brokers + "/" + kTopic
                                  : "file://" + std::filesystem::absolute(dir / "out").string();
  TM_ASSIGN(SinkUrl parsed, parse_sink_url(url, SinkFormat::kJson));
  TM_ASSIGN(auto claim, SinkClaim::acquire(client->location().consensus, kShardName, kSinkName,
                                           parsed, SinkRunner{"tidemark bench sink", ""}));
  TM_ASSIGN(auto destination,
            open_sink_destination(parsed, envelope, SinkFormat::kJson, kShardName, kSinkName,
                                  MemoryPool::create("sink", kSinkPoolBytes), claim));
  SinkOptions options;
  options.sink_name = kSinkName;
  options.as_of = 0;
  options.until = 1;
  SinkRun run;
  run.rss_before_kib = peak_rss_kib();
  const double cpu_before = cpu_seconds();
  const auto start = Clock::now();
  TM_ASSIGN(SinkProgress progress, run_sink(*shard, *destination, options));
  run.seconds = seconds_since(start);
  run.cpu_seconds = cpu_seconds() - cpu_before;
  run.peak_rss_kib = peak_rss_kib();
  run.pairs = progress.pairs;
  run.files = progress.commits;
  run.violations = progress.primary_key_violations;
  if (!brokers) {
    for (const auto& entry : std::filesystem::directory_iterator(dir / "out")) {
      if (entry.is_regular_file()) run.bytes += entry.file_size();
    }
  }
  return run;
}

// `tidemark bench sink-child DIR` (and sink-debezium-child): sink_once in a
// process of its own, its figures on one line.
int sink_child(const std::string& dir, Envelope envelope) {
  auto run = sink_once(dir, envelope);
  if (!run) return report(run.error());
  std::printf("%llu %llu %llu %llu %.6f %.6f %llu %llu\n", run->pairs, run->files, run->violations,
              run->bytes, run->seconds, run->cpu_seconds, run->rss_before_kib, run->peak_rss_kib);
  return kExitOk;
}

Result<SinkRun> run_sink_child(const std::filesystem::path& dir, Envelope envelope) {
  TM_ASSIGN(std::string text,
            run_bench_child(envelope == Envelope::kUpsert ? kUpsertChild : kDebeziumChild, dir));
  SinkRun run;
  if (std::sscanf(text.c_str(), "%llu %llu %llu %llu %lf %lf %llu %llu", &run.pairs, &run.files,
                  &run.violations, &run.bytes, &run.seconds, &run.cpu_seconds, &run.rss_before_kib,
                  &run.peak_rss_kib) != 8) {
    return determinate("the sink child printed \"" + text + "\"");
  }
  return run;
}

// What the committed output holds: its lines, counted streaming, and the
// first of them.
struct Output {
  std::uint64_t files = 0, lines = 0;
  std::string first_line;
};

Result<Output> read_output(const std::filesystem::path& directory) {
  Output out;
  std::vector<char> buffer(1 << 20);
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name.starts_with(".")) continue;
    ++out.files;
    FILE* file = std::fopen(entry.path().c_str(), "rb");
    if (file == nullptr) return determinate("cannot open " + entry.path().string());
    bool first = out.first_line.empty();
    for (std::size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), file)) > 0;) {
      const char* begin = buffer.data();
      const char* end = begin + n;
      if (first) {
        const char* newline = static_cast<const char*>(std::memchr(begin, '\n', n));
        out.first_line.append(begin, newline ? newline : end);
        first = newline == nullptr;
      }
      out.lines += std::count(begin, end, '\n');
    }
    const bool failed = std::ferror(file) != 0;
    std::fclose(file);
    if (failed) return determinate("cannot read " + entry.path().string());
  }
  return out;
}

// What the broker acknowledged: the offsets the committed progress records
// cover, and the last frontier.
Result<Output> read_kafka_output(const std::string& brokers) {
  Output out;
  const KafkaAddress address = bench_address(brokers);
  std::optional<Frontier> frontier;
  TM_TRY(consume_topic(address.brokers, address.progress_topic, std::chrono::seconds(30),
                       [&](const KafkaMessageView& m) -> Status {
                         if (!m.value) return {};
                         TM_ASSIGN(auto record, KafkaProgressRecord::parse(*m.value));
                         ++out.files;
                         // A part of the snapshot is no frontier yet.
                         if (!record.snapshot) frontier = record.frontier;
                         for (const auto& range : record.offsets) {
                           out.lines += static_cast<std::uint64_t>(range.last - range.first + 1);
                         }
                         return {};
                       }));
  out.first_line = frontier ? "progress frontier " + frontier->to_string() : "no progress";
  return out;
}

struct Figures {
  std::uint64_t diff = 0;
  bool kafka = false;
  Envelope envelope = Envelope::kUpsert;
  double append_seconds = 0;   // creating the shard and the one append
  double process_seconds = 0;  // the child, spawn to exit
  SinkRun sink;
  Output output;
  double count_seconds = 0;  // counting the output's lines
};

Result<Figures> run_sink_bench(const std::filesystem::path& dir, std::uint64_t diff,
                               Envelope envelope, bool kafka) {
  Figures f;
  f.diff = diff;
  f.envelope = envelope;
  f.kafka = kafka;
  auto start = Clock::now();
  TM_TRY(write_hot_key(dir, static_cast<Diff>(diff)));
  f.append_seconds = seconds_since(start);
  std::unique_ptr<KafkaMockProcess> broker;
  if (kafka) {
    const auto mock =
        std::filesystem::read_symlink("/proc/self/exe").parent_path() / "tidemark-kafka-mock";
    TM_ASSIGN(broker, KafkaMockProcess::start(mock.string(),
                                              {"--topic", std::string(kTopic) + ":1", "--topic",
                                               std::string(kTopic) + "-progress:1"}));
    FILE* file = std::fopen((dir / kBrokersFile).c_str(), "w");
    if (file == nullptr) return determinate("cannot write " + (dir / kBrokersFile).string());
    std::fprintf(file, "%s\n", broker->brokers().c_str());
    std::fclose(file);
  }
  start = Clock::now();
  TM_ASSIGN(f.sink, run_sink_child(dir, envelope));
  f.process_seconds = seconds_since(start);
  start = Clock::now();
  if (kafka) {
    TM_ASSIGN(f.output, read_kafka_output(broker->brokers()));
  } else {
    TM_ASSIGN(f.output, read_output(dir / "out"));
  }
  f.count_seconds = seconds_since(start);
  return f;
}

double per_second(double amount, double seconds) {
  return seconds > 0 ? amount / seconds : 0;
}

void print_json(const Figures& f) {
  const SinkRun& s = f.sink;
  std::printf(
      "{\"diff\":%llu,\"envelope\":\"%s\",\"to\":\"%s\",\"pairs\":%llu,\"commits\":%llu,"
      "\"primary_key_violations\":%llu,\"output_bytes\":%llu,\"output_lines\":%llu,"
      "\"sink_seconds\":%.3f,\"sink_cpu_seconds\":%.3f,\"pairs_per_s\":%.0f,"
      "\"pairs_per_cpu_s\":%.0f,\"mb_per_s\":%.1f,\"peak_rss_mib\":%.1f,"
      "\"rss_before_sink_mib\":%.1f,\"child_process_seconds\":%.3f,\"append_seconds\":%.3f,"
      "\"count_seconds\":%.3f}\n",
      static_cast<unsigned long long>(f.diff),
      f.envelope == Envelope::kUpsert ? "upsert" : "debezium", f.kafka ? "kafka" : "file", s.pairs,
      s.files, s.violations, s.bytes, static_cast<unsigned long long>(f.output.lines), s.seconds,
      s.cpu_seconds, per_second(s.pairs, s.seconds), per_second(s.pairs, s.cpu_seconds),
      per_second(s.bytes / 1e6, s.seconds), s.peak_rss_kib / 1024.0, s.rss_before_kib / 1024.0,
      f.process_seconds, f.append_seconds, f.count_seconds);
}

void print_table(const Figures& f) {
  const SinkRun& s = f.sink;
  std::printf("one update with diff %llu, %s envelope, %s\n",
              static_cast<unsigned long long>(f.diff),
              f.envelope == Envelope::kUpsert ? "upsert" : "debezium",
              f.kafka ? "Kafka sink (tidemark-kafka-mock)" : "json file sink");
  std::printf("sink                     %llu pairs in %.3f s: %.0f pairs/s", s.pairs, s.seconds,
              per_second(s.pairs, s.seconds));
  if (!f.kafka) std::printf(", %.1f MB/s", per_second(s.bytes / 1e6, s.seconds));
  std::printf("; %.0f pairs per CPU second (%.3f CPU s)\n", per_second(s.pairs, s.cpu_seconds),
              s.cpu_seconds);
  if (f.kafka) {
    std::printf(
        "output                   %llu committed transactions, %llu acknowledged "
        "offsets; %s\n",
        static_cast<unsigned long long>(f.output.files),
        static_cast<unsigned long long>(f.output.lines), f.output.first_line.c_str());
  } else {
    std::printf("output                   %llu files, %llu bytes, %llu lines; first line %s\n",
                static_cast<unsigned long long>(f.output.files), s.bytes,
                static_cast<unsigned long long>(f.output.lines), f.output.first_line.c_str());
  }
  std::printf("upsert key violations    %llu\n", s.violations);
  std::printf("peak RSS of the child    %.1f MiB (%.1f MiB before run_sink)\n",
              s.peak_rss_kib / 1024.0, s.rss_before_kib / 1024.0);
  std::printf("child process            %.3f s spawn to exit; the append took %.3f s\n",
              f.process_seconds, f.append_seconds);
}

}  // namespace

int run_bench_sink(const Globals& globals, const std::vector<std::string>& argv) {
  if (argv.size() == 2 && argv[0] == kUpsertChild) return sink_child(argv[1], Envelope::kUpsert);
  if (argv.size() == 2 && argv[0] == kDebeziumChild) {
    return sink_child(argv[1], Envelope::kDebezium);
  }
  auto args = Args::parse(argv, {"--diff", "--envelope", "--to", "--dir"}, {"--json"});
  if (!args) return usage_error(args.error().message);
  if (args->positionals() != std::vector<std::string>{"sink"}) return usage_error(kSinkUsage);
  std::uint64_t diff = 10'000'000;
  if (auto v = args->get("--diff")) {
    try {
      std::size_t used = 0;
      diff = std::stoull(*v, &used);
      if (used != v->size() || v->front() == '-') throw std::invalid_argument(*v);
    } catch (...) {
      return usage_error("--diff takes a positive integer, got \"" + *v + "\"");
    }
  }
  if (diff == 0 || diff > static_cast<std::uint64_t>(INT64_MAX)) {
    return usage_error("--diff must be in [1, 2^63 - 1]");
  }
  auto envelope = parse_envelope(args->get("--envelope").value_or("upsert"));
  if (!envelope) return usage_error(envelope.error().message);
  const std::string to = args->get("--to").value_or("file");
  if (to != "file" && to != "kafka") return usage_error("--to takes file or kafka");
  // A fresh scratch directory; under --dir DIR it is kept, so the sink can
  // be profiled (`perf record -g tidemark bench sink-child PATH` after
  // removing PATH/out, PATH the directory it prints).
  auto dir = BenchDirectory::create("sink", args->get("--dir"));
  if (!dir) return report(dir.error());
  auto figures = run_sink_bench(dir->path(), diff, *envelope, to == "kafka");
  if (!figures) return report(figures.error());
  const Figures& f = *figures;
  if (args->has("--json")) {
    print_json(f);
  } else {
    print_table(f);
  }
  if (f.output.lines != diff || f.sink.pairs != diff) {
    std::fprintf(stderr,
                 "correctness failure: the sink emitted %llu pairs and its output holds %llu "
                 "lines (Kafka: acknowledged offsets), not the %llu of the update's diff\n",
                 f.sink.pairs, static_cast<unsigned long long>(f.output.lines),
                 static_cast<unsigned long long>(diff));
    return kExitError;
  }
  return kExitOk;
}

}  // namespace tidemark::cli
