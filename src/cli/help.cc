// `tidemark help COMMAND` and `COMMAND --help`: each command's options,
// their defaults and an example. Kept beside the global usage (main.cc)
// and the README's command list; CliTest.EveryCommandExplainsItself runs
// each one.
#include <array>
#include <string_view>
#include <utility>

#include "cli/cli.h"

namespace tidemark::cli {
namespace {

constexpr std::string_view kShard = R"(usage: tidemark shard create NAME
       tidemark shard list
       tidemark shard inspect NAME [--json]
       tidemark shard release NAME READER
       tidemark shard delete NAME [--force]

Shards are named collections of updates ((key, value), time, diff).
  create   makes an empty shard (upper 0, since 0). NAME: letters, digits,
           '.', '_', '-', at most 128 characters. Exit 1 if it exists.
  list     prints every shard's name, one a line.
  inspect  prints upper (times below it are final), since (times at or
           above it read exactly), batches, parts, updates and bytes, then
           a line per reader (its hold on the since) and per writer;
           --json prints them as one JSON object.
  release  drops READER's hold on the since (an id inspect lists), so the
           since follows the other holds: for the hold of a sink that will
           not run again ("c-sink-<sink name>"). Run again, such a sink
           resumes only if the since has not passed its progress. Exit 1
           if there is no such reader.
  delete   deletes the shard and its data: every handle on it fails from
           then on, garbage collection removes its parts and old states,
           then its name goes (a delete cut short leaves it listed: run it
           again). Refused (exit 1) while a sink's hold remains, naming it;
           --force drops such holds too. The name can be created again,
           empty.

Example:
  tidemark shard create orders && tidemark shard inspect orders --json
)";

constexpr std::string_view kAppend = R"(usage: tidemark append NAME [--input FILE|-]
                       [--lower T --upper T | --producer ID] [--max-record-bytes SIZE]

Appends NDJSON lines {"key": K, "value": V[, "time": T][, "diff": D]} from
--input (default: stdin). D defaults to 1; K and V are any JSON.
  (neither)          managed: the records get the time of the commit (wall
                     clock milliseconds); all or nothing. Prints
                     {"time","count","upper"}.
  --lower T --upper T  explicit: every record's time is in [T_lower, T_upper),
                     committed only if the shard's upper is still T_lower
                     (else exit 3 naming the current upper). Prints
                     {"count","lower","upper"}.
  --producer ID      managed and idempotent: records are numbered after the
                     producer's last committed one, so re-running the same
                     input after a failure appends nothing twice.
  --max-record-bytes SIZE  longest line taken (default 32MiB); a longer one
                     fails by line number and nothing is appended.
A malformed line fails with its line number; nothing is appended.

Example:
  echo '{"key":"order-1","value":{"qty":2},"time":0}' |
    tidemark append orders --lower 0 --upper 1
)";

constexpr std::string_view kSnapshot = R"(usage: tidemark snapshot NAME [--as-of T]

Prints the consolidated contents at time T as NDJSON {"key","value","diff"},
sorted by key and value: every update at a time <= T, diffs summed, rows
whose diffs sum to 0 left out.
  --as-of T  default: the latest final time (upper - 1; every time once the
             shard is closed). T must be at or above the shard's since and
             below its upper (exit 1 otherwise).
Never creates the data directory.

Example:
  tidemark snapshot orders --as-of 0
)";

constexpr std::string_view kListen =
    R"(usage: tidemark listen NAME (--from T | --resume-progress P | --snapshot [--as-of T])
                       [--until T]

Prints updates in time order as NDJSON {"key","value","time","diff"}, with
{"progress": P} lines: every time below P has been printed. Waits for new
appends.
  --from T             the updates at times after T (T itself excluded).
  --resume-progress P  the updates at times P and later: pass the last
                       {"progress": P} a listen printed (null included)
                       to go on with nothing skipped and nothing twice;
                       0 is the whole history.
  --snapshot           the consolidated snapshot first, each row as an
                       update at its as-of time, then {"progress": as-of
                       + 1}, then every change after it: nothing missing
                       between the two, nothing twice.
  --as-of T            the snapshot's time (default: the latest final
                       time, upper - 1; an empty snapshot and every change
                       from 0 while the upper is 0).
  --until T            stop once progress reaches T (default: run until
                       interrupted); with --snapshot, after the as-of time.
The times read must be exact: T, or P - 1, at or above the shard's since
(exit 1 otherwise). Never creates the data directory.

Example:
  tidemark listen orders --resume-progress 0 --until 5
  tidemark listen orders --resume-progress 5   # after the line {"progress":5}
  tidemark listen orders --snapshot            # the state now, then changes
)";

constexpr std::string_view kCompact = R"(usage: tidemark compact NAME

Merges the shard's batches now, in the foreground, as far as the shard's
holds allow, and prints what it did. Servers and appenders compact in the
background by themselves; this is for shards written only by commands.

Example:
  tidemark compact orders
)";

constexpr std::string_view kSink =
    R"(usage: tidemark sink run NAME --to URL [--envelope upsert|debezium]
                         [--format json|csv] [--sink-name S] [--as-of T] [--until T]
                         [--snapshot-part-bytes N]
       tidemark sink audit NAME --to kafka://HOST:PORT/TOPIC|file:///DIR
                           [--sink-name S] [--format json|csv] [--messages]
                           [--timeout-ms MS]

Writes the shard's contents, then every change, to a destination, exactly
once across restarts: progress is committed with the output, and a rerun
resumes where the last commit left off.
  --to URL        file:///DIR, s3://BUCKET/PREFIX?endpoint=http://HOST:PORT
                  [&region=R], or kafka://HOST:PORT[,HOST:PORT]/TOPIC
  --envelope E    upsert (default: key and new value, null for a delete) or
                  debezium ({"before","after"})
  --format F      json (default) or csv (file and s3 only)
  --sink-name S   the name its progress is kept under (default: NAME)
  --as-of T       the snapshot's time (default: the latest final time,
                  upper - 1, when it first starts)
  --until T       stop once the output is complete up to T (default: run
                  until interrupted)
  --snapshot-part-bytes N
                  commit the snapshot in parts of about N bytes (default
                  64MiB; also one every 60 s), each with its progress: a
                  Kafka transaction, or a file or S3 object named
                  <0>-<T+1>-<pairs>-<check>, so a snapshot of any size
                  commits and a rerun resumes it where the last one ended
s3:// takes credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.

audit reads back what a sink has committed and checks it against its
progress. Kafka: read_committed, counting the messages inside its progress
records' offset ranges; prints {"sink","frontier","transactions",
"committed","outside"} (and "snapshot": {"as_of","pairs"} while a snapshot
is committed in part only), after each committed message {"partition","offset",
"time","key","value"} with --messages. File: the files' names must tile
the progress with no gap and each line's time lie in its file's range;
prints {"sink","frontier","files","committed","outside"}, after each line
with --messages; a gap, an overlap or a line outside exits 1.

Example:
  tidemark sink run orders --to file:///tmp/orders-out --until 5
)";

constexpr std::string_view kServe = R"(usage: tidemark serve [options]

Serves the HTTP API (README, "The server") on the data directory; one
server per directory (the second exits naming the first).
  --listen HOST:PORT          default 127.0.0.1:6875; HOST may be a name;
                              PORT 0 picks a free one (printed on stderr)
  --memory-limit SIZE         one budget for requests, appender queues,
                              reads and sinks (default 256MiB)
  --max-record-bytes SIZE     longest record line (default min(32MiB,
                              limit / 8); at most limit / 4)
  --token-file FILE           require "Authorization: Bearer <token>"
  --lease MS                  writers' and readers' lease (default 60000)
  --retry-deadline MS         how long reads retry a failing backend
                              (default 30000)
  --producer-expiry MS        how long a shard remembers an idle producer
                              (default 7 days)
  --max-producers N           producers remembered per shard (default 1000)
  --max-connections N         default 1000; 0: no limit
  --min-body-rate BYTES       a body's slowest pace (default 1024 a second)
  --shutdown-grace S          on SIGTERM/SIGINT, time to finish (default 10)
  --allow-s3-endpoints URLS   S3 endpoints sinks may name (comma-separated)
  --allow-kafka-brokers HOSTS Kafka brokers sinks may name (comma-separated)
  --sink-snapshot-part-bytes SIZE
                              sinks commit their snapshots in parts of about
                              SIZE (default 64MiB; also one every 60 s)
  --log-level LEVEL           what is logged on stderr, one line per event:
                              error, warn (failed sinks, 5xx answers), info
                              (default: also sinks starting and stopping,
                              4xx answers) or debug (every request)
Benchmarks only: --inject-blob-latency-ms L, --appender-queue bytes|records:N.

Example:
  tidemark --data ./tidemark-data serve --listen localhost:6875
)";

constexpr std::string_view kBench = R"(usage: tidemark bench MODE [options]

Benchmarks that print figures (docs/benchmarks.md has them, with the
command beside each row); --json prints them as JSON. Each works in a
fresh temporary directory, removed after; engine, compaction, sink,
shards and listen take --dir DIR to work in DIR and keep it.
  engine      [--updates N] [--appends N] [--blob-latency-ms L]
              [--background-compaction on|off]: ingest, snapshot (its reads
              L ms slower each), listen, sizes
  appender    [--producers N] [--record-bytes B] [--queue bytes:SIZE|records:N]
              [--batch-appends on|off] [--blob-latency-ms L]
              [--consensus-latency-ms L] [--duration S]: concurrent producers
  compaction  [--appends N] [--background-compaction on|off]: batches, parts
              and bytes rewritten
  sink        [--diff N] [--envelope upsert|debezium] [--to file|kafka]:
              messages a second, memory
  shards      [--shards N] [--sinks M] [--idle-close S]: threads and CPU of
              many open, idle shards and sinks
  listen      [--updates N] [--times T] [--rounds R]: a listen over one
              batch of N updates over T times against a snapshot of it;
              then over HTTP [--appends N] [--idle S] [--window W]:
              write-to-listen latency, the CPU of S idle listen streams
              (default 10,000; 0 skips it) and the time one append takes
              to wake them all

Example:
  tidemark bench engine --updates 1000000
)";

constexpr std::array<std::pair<std::string_view, std::string_view>, 8> kHelp = {{
    {"shard", kShard},
    {"append", kAppend},
    {"snapshot", kSnapshot},
    {"listen", kListen},
    {"compact", kCompact},
    {"sink", kSink},
    {"serve", kServe},
    {"bench", kBench},
}};

}  // namespace

std::optional<std::string_view> command_help(std::string_view command) {
  for (const auto& [name, text] : kHelp) {
    if (name == command) return text;
  }
  return std::nullopt;
}

}  // namespace tidemark::cli
