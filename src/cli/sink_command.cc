// `tidemark sink run`: a sink from a shard into a destination.
//
// Progress goes to stderr: on a terminal one status line redrawn at most
// ten times a second (a bar from the run's starting frontier to the shard's
// upper, or to --until, with the pair rate); otherwise a line per commit at
// most once a second, one every 5 s during a long interval (a snapshot),
// and a last line when the sink stops.
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/cli.h"
#include "sink/committed_name.h"
#include "sink/destination_url.h"
#include "sink/kafka_reader.h"
#include "sink/sink_claim.h"
#include "tidemark/sink.h"
#include "util/json.h"
#include "util/size.h"

namespace tidemark::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void on_interrupt(int) {
  g_interrupted = 1;
}

class ProgressReporter {
 public:
  using Clock = std::chrono::steady_clock;

  ProgressReporter(std::string sink_name, std::optional<Time> until)
      : name_(std::move(sink_name)), until_(until), tty_(::isatty(2) == 1) {}

  // After a commit (`committed`) or every SinkOptions::kTickPairs pairs.
  void update(const SinkProgress& p, bool committed) {
    const auto now = Clock::now();
    if (!start_frontier_) start_frontier_ = p.frontier;
    const auto since_line = now - last_line_;
    if (tty_) {
      if (since_line >= std::chrono::milliseconds(100)) draw(p, now);
      return;
    }
    if ((committed && since_line >= std::chrono::seconds(1)) ||
        since_line >= std::chrono::seconds(5)) {
      line(p, now);
    }
  }

  // The last word, when the sink stops.
  void finish(const SinkProgress& p) {
    const auto now = Clock::now();
    if (tty_) {
      draw(p, now);
      std::fputc('\n', stderr);
    } else if (p.pairs != printed_pairs_ || p.commits != printed_commits_ || !printed_) {
      line(p, now);
    }
  }

 private:
  double rate(const SinkProgress& p, Clock::time_point now) const {
    const double seconds = std::chrono::duration<double>(now - started_).count();
    return seconds > 0 ? static_cast<double>(p.pairs) / seconds : 0;
  }

  void line(const SinkProgress& p, Clock::time_point now) {
    last_line_ = now;
    printed_ = true;
    printed_pairs_ = p.pairs;
    printed_commits_ = p.commits;
    std::fprintf(stderr,
                 "sink %s: frontier %s, %llu pairs this run (%.0f pairs/s), %llu commits, %llu "
                 "upsert key violations%s\n",
                 name_.c_str(), p.frontier.to_string().c_str(),
                 static_cast<unsigned long long>(p.pairs), rate(p, now),
                 static_cast<unsigned long long>(p.commits),
                 static_cast<unsigned long long>(p.primary_key_violations),
                 p.snapshot ? " (writing the snapshot)" : "");
  }

  void draw(const SinkProgress& p, Clock::time_point now) {
    last_line_ = now;
    constexpr int kWidth = 24;
    // From the frontier this run started at to --until, or else to the
    // frontier being written.
    double fraction = 0;
    const Frontier goal = until_ ? Frontier::at(*until_) : p.target;
    if (!p.snapshot && start_frontier_ && !start_frontier_->is_closed() && !goal.is_closed() &&
        !p.frontier.is_closed() && goal.time() > start_frontier_->time()) {
      fraction = static_cast<double>(p.frontier.time() - start_frontier_->time()) /
                 static_cast<double>(goal.time() - start_frontier_->time());
    }
    fraction = std::clamp(fraction, 0.0, 1.0);
    const int filled = static_cast<int>(fraction * kWidth + 0.5);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(kWidth - filled), '.');
    std::fprintf(stderr, "\r\x1b[Ksink %s [%s] frontier %s%s  %llu pairs  %.2fM pairs/s",
                 name_.c_str(), bar.c_str(), p.frontier.to_string().c_str(),
                 p.snapshot ? " (snapshot)" : "", static_cast<unsigned long long>(p.pairs),
                 rate(p, now) / 1e6);
  }

  std::string name_;
  std::optional<Time> until_;
  bool tty_;
  Clock::time_point started_ = Clock::now();
  Clock::time_point last_line_{};
  std::optional<Frontier> start_frontier_;
  bool printed_ = false;  // the last line's figures, so finish() adds no copy
  std::uint64_t printed_pairs_ = 0;
  std::uint64_t printed_commits_ = 0;
};

// `sink audit NAME --to kafka://...`: what a Kafka sink has committed,
// read back with read_committed (sink/kafka_reader.h): with --messages
// each committed message as a line, then a summary line. One message in
// memory at a time.
// A file sink's committed output, read back: its files' names are its
// progress (they must tile [first lower, frontier) with no gap or
// overlap), and every line's time must be in its file's range. One line
// in memory at a time.
// Files of both formats count (a sink whose format was changed goes on in
// the same directory); each is read as its extension says. A snapshot's
// parts are read first, each checked to end at the pair its name counts;
// while the snapshot is in progress the summary says how far it got.
int audit_file_sink(const std::string& sink_name, const std::string& directory, bool messages) {
  namespace fs = std::filesystem;
  ListedOutputs outputs;
  std::error_code ec;
  for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (auto added = outputs.add(directory, name); !added) return report(added.error());
  }
  if (ec) {
    return report(make_error(ErrorKind::kDeterminate,
                             "cannot list sink directory " + directory + ": " + ec.message())
                      .error());
  }
  std::vector<CommittedRange>& committed = outputs.committed;
  std::vector<SnapshotPart>& parts = outputs.parts;
  auto frontier = committed_progress(directory, committed);  // sorts; overlaps are Corruption
  if (!frontier) return report(frontier.error());
  // Sorts the parts by their pairs; a snapshot in progress when the
  // directory has no committed progress yet.
  auto in_progress = snapshot_in_progress(directory, parts, *frontier);
  if (!in_progress) return report(in_progress.error());
  for (std::size_t i = 1; i < committed.size(); ++i) {
    if (committed[i].lower != committed[i - 1].upper) {
      return report(make_error(ErrorKind::kCorruption,
                               "sink directory " + directory +
                                   ": nothing is committed for the times [" +
                                   std::to_string(committed[i - 1].upper) + ", " +
                                   std::to_string(committed[i].lower) + ") between " +
                                   committed[i - 1].name + " and " + committed[i].name)
                        .error());
    }
  }
  // A snapshot's parts come first (name order is the order written), each
  // read as the range [0, its upper); each must end at the pair its name
  // counts.
  std::vector<CommittedRange> files;
  for (const SnapshotPart& part : parts) files.push_back({0, part.upper, part.name});
  files.insert(files.end(), committed.begin(), committed.end());
  Output out;
  std::uint64_t lines = 0, outside = 0;
  std::size_t part_index = 0;
  for (const CommittedRange& range : files) {
    std::ifstream in(fs::path(directory) / range.name, std::ios::binary);
    if (!in) {
      return report(
          make_error(ErrorKind::kDeterminate, "cannot read " + directory + "/" + range.name)
              .error());
    }
    const bool csv = range.name.ends_with(".csv");
    bool header = csv;
    for (std::string line; std::getline(in, line);) {
      if (header) {
        header = false;
        continue;
      }
      ++lines;
      // The time: json's "time" member (written first), csv's first cell.
      std::string_view text = line;
      if (!csv) {
        constexpr std::string_view kTime = "{\"time\":";
        text.remove_prefix(text.starts_with(kTime) ? kTime.size() : text.size());
      }
      Time time = 0;
      auto [end, parse_ec] = std::from_chars(text.data(), text.data() + text.size(), time);
      if (parse_ec != std::errc{} || time < range.lower || time >= range.upper) ++outside;
      if (messages) {
        out.buffer().append(line).push_back('\n');
        out.maybe_flush();
      }
    }
    if (part_index < parts.size()) {
      const SnapshotPart& part = parts[part_index++];
      if (part.pairs != lines) {
        out.flush();
        return report(make_error(ErrorKind::kCorruption,
                                 "sink directory " + directory + ": snapshot part " + part.name +
                                     " ends at pair " + std::to_string(part.pairs) +
                                     " but the parts up to it hold " + std::to_string(lines) +
                                     " lines")
                          .error());
      }
    }
  }
  std::string& b = out.buffer();
  b.append("{\"sink\":");
  append_json_string(&b, sink_name);
  b.append(",\"frontier\":").append(*frontier ? (*frontier)->to_json() : "null");
  if (*in_progress) {
    b.append(",\"snapshot\":{\"as_of\":").append(std::to_string((*in_progress)->as_of));
    b.append(",\"pairs\":").append(std::to_string((*in_progress)->pairs)).append("}");
  }
  b.append(",\"files\":").append(std::to_string(files.size()));
  b.append(",\"committed\":").append(std::to_string(lines));
  b.append(",\"outside\":").append(std::to_string(outside)).append("}\n");
  out.flush();
  return outside == 0 ? kExitOk : kExitError;
}

int run_sink_audit(const std::vector<std::string>& argv) {
  auto args =
      Args::parse(argv, {"--to", "--sink-name", "--timeout-ms", "--format"}, {"--messages"});
  if (!args) return usage_error(args.error().message);
  if (args->positionals().size() != 1)
    return usage_error("sink audit takes one NAME (tidemark sink --help)");
  const std::string shard_name = args->positionals()[0];
  auto to = args->get("--to");
  if (!to) return usage_error("sink audit needs --to kafka://HOST:PORT/TOPIC or file:///DIR");
  auto format = parse_sink_format(args->get("--format").value_or("json"));
  if (!format) return usage_error(format.error().message);
  auto url = parse_sink_url(*to, *format);
  if (!url) return usage_error(url.error().message);
  const std::string sink_name = args->get("--sink-name").value_or(shard_name);
  const bool messages = args->has("--messages");
  if (url->directory) return audit_file_sink(sink_name, *url->directory, messages);
  if (!url->kafka) {
    return usage_error(
        "sink audit reads Kafka and file destinations (an S3 sink's objects are "
        "named as a file sink's files)");
  }
  std::uint64_t timeout_ms = 30'000;
  if (auto text = args->get("--timeout-ms")) {
    auto n = whole_number(*text, 1, 3'600'000);
    if (!n) return usage_error("--timeout-ms takes 1 to 3600000, got " + *text);
    timeout_ms = *n;
  }
  Output out;
  auto audit = audit_kafka_sink(
      *url->kafka, "tidemark/" + shard_name + "/" + sink_name,
      std::chrono::milliseconds(timeout_ms), [&](const KafkaMessageView& m) -> Status {
        if (!messages) return {};
        std::string& b = out.buffer();
        b.append("{\"partition\":").append(std::to_string(m.partition));
        b.append(",\"offset\":").append(std::to_string(m.offset));
        b.append(",\"time\":").append(m.time ? std::string(*m.time) : std::string("null"));
        b.append(",\"key\":").append(m.key);
        b.append(",\"value\":").append(m.value ? std::string(*m.value) : std::string("null"));
        b.append("}\n");
        out.maybe_flush();
        return {};
      });
  if (!audit) {
    out.flush();
    return report(audit.error());
  }
  std::string& b = out.buffer();
  b.append("{\"sink\":");
  append_json_string(&b, sink_name);
  b.append(",\"frontier\":").append(audit->frontier ? audit->frontier->to_json() : "null");
  if (audit->snapshot) {
    b.append(",\"snapshot\":{\"as_of\":").append(std::to_string(audit->snapshot->as_of));
    b.append(",\"pairs\":").append(std::to_string(audit->snapshot->pairs)).append("}");
  }
  b.append(",\"transactions\":").append(std::to_string(audit->transactions));
  b.append(",\"committed\":").append(std::to_string(audit->committed));
  b.append(",\"outside\":").append(std::to_string(audit->outside)).append("}\n");
  out.flush();
  return kExitOk;
}

}  // namespace

int run_sink(const Globals& globals, const std::vector<std::string>& argv) {
  if (!argv.empty() && argv[0] == "audit") {
    return run_sink_audit(std::vector<std::string>(argv.begin() + 1, argv.end()));
  }
  if (argv.empty() || argv[0] != "run") {
    return usage_error(
        "sink run NAME --to URL [options] | sink audit NAME --to kafka://... (tidemark sink "
        "--help)");
  }
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  auto args = Args::parse(rest,
                          {"--to", "--envelope", "--format", "--sink-name", "--as-of", "--until",
                           "--snapshot-part-bytes"},
                          {});
  if (!args) return usage_error(args.error().message);
  if (args->positionals().size() != 1)
    return usage_error("sink run takes one NAME (tidemark sink --help)");
  const std::string shard_name = args->positionals()[0];
  auto to = args->get("--to");
  if (!to) return usage_error("sink run needs --to URL");
  auto envelope = parse_envelope(args->get("--envelope").value_or("upsert"));
  if (!envelope) return usage_error(envelope.error().message);
  auto format = parse_sink_format(args->get("--format").value_or("json"));
  if (!format) return usage_error(format.error().message);
  auto as_of = args->frontier("--as-of", false);
  if (!as_of) return usage_error(as_of.error().message);
  auto until = args->frontier("--until", false);
  if (!until) return usage_error(until.error().message);
  const std::string sink_name = args->get("--sink-name").value_or(shard_name);
  auto checked = check_sink_destination(*to, *format);
  if (!checked) return usage_error(checked.error().message);

  auto client = open_client(globals);
  if (!client) return report(client.error());
  auto shard = (*client)->open_shard(shard_name);
  if (!shard) return report(shard.error());
  // One runner per sink and one sink per destination: a live holder of
  // either is named and this run exits 1 at once.
  SinkTarget target{*to, *envelope, *format, "tidemark sink run", nullptr};

  SinkOptions options;
  options.sink_name = sink_name;
  if (*as_of) options.as_of = (*as_of)->time();
  if (*until) options.until = (*until)->time();
  if (auto text = args->get("--snapshot-part-bytes")) {
    auto bytes = parse_size(*text);
    if (!bytes || *bytes == 0) {
      return usage_error("--snapshot-part-bytes takes a size above 0 (1048576, 64MiB), got " +
                         *text);
    }
    options.snapshot_part_bytes = *bytes;
  }
  ProgressReporter reporter(sink_name, options.until);
  options.on_progress = [&](const SinkProgress& p) { reporter.update(p, true); };
  options.on_tick = [&](const SinkProgress& p) { reporter.update(p, false); };
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  options.stop = [] { return g_interrupted != 0; };
  auto ran = tidemark::run_sink(**client, **shard, target, options);
  if (!ran) return report(ran.error());
  reporter.finish(*ran);
  return kExitOk;
}

}  // namespace tidemark::cli
