// `tidemark sink run`: a sink from a shard into a destination (DESIGN.md 8).
#include <csignal>
#include <cstdio>

#include "cli/cli.h"
#include "sink/file_destination.h"
#include "sink/runner.h"

namespace tidemark::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void on_interrupt(int) {
  g_interrupted = 1;
}

constexpr const char* kSinkUsage =
    "sink run NAME --to URL [--envelope upsert|debezium] [--format json|csv] [--sink-name S] "
    "[--as-of T] [--until T]";

}  // namespace

int run_sink(const Globals& globals, const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] != "run") return usage_error(kSinkUsage);
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  auto args = Args::parse(
      rest, {"--to", "--envelope", "--format", "--sink-name", "--as-of", "--until"}, {});
  if (!args) return usage_error(args.error().message);
  if (args->positionals().size() != 1) return usage_error(kSinkUsage);
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
  constexpr std::string_view kFile = "file://";
  if (!to->starts_with(kFile)) {
    return usage_error("sink destination " + *to +
                       ": only file:///dir is built so far (kafka:// and s3:// are not yet)");
  }
  const std::string directory = to->substr(kFile.size());
  if (directory.empty() || directory[0] != '/') {
    return usage_error("sink destination " + *to + ": the directory must be absolute");
  }

  auto client = open_client(globals);
  if (!client) return report(client.error());
  auto shard = (*client)->open_shard(shard_name);
  if (!shard) return report(shard.error());
  auto destination = FileDestination::open(directory, *envelope, *format);
  if (!destination) return report(destination.error());

  SinkOptions options;
  options.sink_name = args->get("--sink-name").value_or(shard_name);
  if (*as_of) options.as_of = (*as_of)->time();
  if (*until) options.until = (*until)->time();
  options.on_progress = [&](const SinkProgress& p) {
    std::fprintf(stderr,
                 "sink %s: frontier %s, %llu pairs and %llu files this run, %llu upsert "
                 "key violations\n",
                 options.sink_name.c_str(), p.frontier.to_string().c_str(),
                 static_cast<unsigned long long>(p.pairs), static_cast<unsigned long long>(p.commits),
                 static_cast<unsigned long long>(p.primary_key_violations));
  };
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  options.stop = [] { return g_interrupted != 0; };
  auto ran = tidemark::run_sink(**shard, **destination, options);
  if (!ran) return report(ran.error());
  return kExitOk;
}

}  // namespace tidemark::cli
