// tidemark: the command-line entry point.
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli.h"
#include "tidemark/version.h"
#include "util/jemalloc_conf.h"

#ifdef TIDEMARK_JEMALLOC
// The binary's allocator is jemalloc, which reads this at its start
// (util/jemalloc_conf.h says why these settings).
extern "C" {
const char* malloc_conf = tidemark::kJemallocConf;
// jemalloc's control interface (jemalloc/jemalloc.h, whose declarations of
// malloc and free would clash with glibc's).
int mallctl(const char* name, void* old, std::size_t* old_size, void* value, std::size_t size);
}
#endif

namespace {

constexpr const char* kUsage =
    R"(usage: tidemark [--data DIR] [--blob URL] [--consensus URL] COMMAND
       tidemark --server http://HOST:PORT [--server-token-file FILE] COMMAND
  shard create NAME | shard list | shard inspect NAME [--json] | shard release NAME READER
  shard delete NAME [--force]
  append NAME [--input FILE|-] [--lower T --upper T | --producer ID] [--max-record-bytes SIZE]
  snapshot NAME [--as-of T]
  listen NAME (--from T | --resume-progress P | --snapshot [--as-of T]) [--until T]
  compact NAME
  serve [--listen HOST:PORT] [--memory-limit SIZE] [--max-record-bytes SIZE]
        [--token-file FILE] [--lease MS] [--retry-deadline MS] [--producer-expiry MS]
        [--max-producers N] [--max-connections N] [--min-body-rate BYTES]
        [--shutdown-grace S] [--allow-s3-endpoints http[s]://HOST[:PORT],...]
        [--allow-kafka-brokers HOST[:PORT],...] [--log-level error|warn|info|debug]
  sink run NAME --to URL [--envelope upsert|debezium] [--format json|csv]
      [--sink-name S] [--as-of T] [--until T]
      URL: file:///DIR | s3://BUCKET/PREFIX?endpoint=http://HOST:PORT[&region=R]
           | kafka://HOST:PORT[,HOST:PORT]/TOPIC
  sink audit NAME --to kafka://HOST:PORT/TOPIC|file:///DIR [--sink-name S] [--messages]
  sink list | sink status NAME | sink delete NAME      (with --server)
  sink update NAME --shard S --to URL [--envelope upsert|debezium] [--format json|csv]
                                                      (with --server)
  bench engine|appender|compaction|sink|shards|listen [options]
  help [COMMAND]      this, or a command's options, defaults and an example
  --version

Every COMMAND takes --help. A flag's value may follow '=' (--as-of=0).
Locations: --data DIR (default ./tidemark-data, env TIDEMARK_DATA) means blob
file://DIR/blob and consensus sqlite://DIR/consensus.db; --blob and
--consensus (env TIDEMARK_BLOB, TIDEMARK_CONSENSUS) override them.
--server URL (env TIDEMARK_SERVER) sends shard, append, snapshot, listen and
sink commands to a running server instead; --server-token-file (env
TIDEMARK_SERVER_TOKEN_FILE) holds its bearer token.
s3:// URLs take credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
Exit status: 0 ok, 1 error, 2 usage, 3 upper mismatch.
)";

#ifdef TIDEMARK_JEMALLOC
// What --version says of the allocator: jemalloc's version and its decay
// settings as jemalloc itself reports them (so a build where the setting
// above did not take says so).
std::string allocator_line() {
  const char* version = nullptr;
  ssize_t dirty = -2, muzzy = -2;
  std::size_t size = sizeof version;
  mallctl("version", &version, &size, nullptr, 0);
  size = sizeof dirty;
  mallctl("opt.dirty_decay_ms", &dirty, &size, nullptr, 0);
  size = sizeof muzzy;
  mallctl("opt.muzzy_decay_ms", &muzzy, &size, nullptr, 0);
  return std::string("allocator: jemalloc ") + (version ? version : "?") + " (dirty_decay_ms " +
         std::to_string(dirty) + ", muzzy_decay_ms " + std::to_string(muzzy) + ")";
}

void tune_malloc() {}
#else
// Built without jemalloc (the sanitizers' builds, or -DTIDEMARK_JEMALLOC=OFF):
// glibc's malloc keeps what is freed for reuse, and by default that keeps
// huge records from the kernel: an allocation of at least M_MMAP_THRESHOLD
// is mmap'd and goes back on free, but each such free raises the threshold
// to that size (up to 32 MiB), after which buffers that size come from the
// arenas and stay there once freed, in each arena (up to 8 per core) whose
// threads handled one. A 16 MiB record passes through buffers of several
// threads (request, appender, part upload, compaction), so RSS kept several
// times what the heap held. Fixed values turn that adjustment off: buffers
// of 8 MiB and more (about a part, part_target_bytes, and anything a huge
// record needs) are mmap'd and returned on free; smaller ones are reused,
// from at most two arenas. The price is a page fault per page of every such
// buffer: bulk ingest (bench engine), which fills part-sized buffers, runs
// about a quarter slower. After twelve 16 MiB records, RSS is about 20 MiB
// instead of 160-360 MiB.
void tune_malloc() {
  mallopt(M_MMAP_THRESHOLD, 8 << 20);
  mallopt(M_ARENA_MAX, 2);
}

std::string allocator_line() {
  return "allocator: glibc malloc (M_MMAP_THRESHOLD 8 MiB, M_ARENA_MAX 2)";
}
#endif

}  // namespace

int main(int argc, char** argv) {
  using namespace tidemark::cli;
  tune_malloc();
  Globals globals;
  if (const char* env = std::getenv("TIDEMARK_DATA")) globals.data_dir = env;
  if (const char* env = std::getenv("TIDEMARK_BLOB")) globals.blob_url = env;
  if (const char* env = std::getenv("TIDEMARK_CONSENSUS")) globals.consensus_url = env;
  std::optional<std::string> server, server_token_file;
  if (const char* env = std::getenv("TIDEMARK_SERVER")) server = env;
  if (const char* env = std::getenv("TIDEMARK_SERVER_TOKEN_FILE")) server_token_file = env;

  // The global flags also come as --flag=value.
  std::vector<std::string> words;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    bool split = false;
    for (std::string_view flag :
         {"--data=", "--blob=", "--consensus=", "--server=", "--server-token-file="}) {
      if (arg.starts_with(flag)) {
        words.emplace_back(flag.substr(0, flag.size() - 1));
        words.emplace_back(arg.substr(flag.size()));
        split = true;
      }
    }
    if (!split) words.emplace_back(arg);
  }
  std::vector<std::string> rest;
  bool location_given = false;  // --data, --blob or --consensus on the command line
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::string arg = words[i];
    auto take = [&](std::string* into) {
      if (i + 1 >= words.size()) return false;
      *into = words[++i];
      return true;
    };
    std::string value;
    if ((arg == "--help" || arg == "-h") && rest.empty()) {  // after a command: its own
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else if (arg == "--data") {
      location_given = true;
      if (!take(&globals.data_dir)) return usage_error("--data needs a directory");
    } else if (arg == "--blob") {
      location_given = true;
      if (!take(&value)) return usage_error("--blob needs a URL");
      globals.blob_url = value;
    } else if (arg == "--consensus") {
      location_given = true;
      if (!take(&value)) return usage_error("--consensus needs a URL");
      globals.consensus_url = value;
    } else if (arg == "--server") {
      if (!take(&value)) return usage_error("--server needs a URL (http://HOST:PORT)");
      server = value;
    } else if (arg == "--server-token-file") {
      if (!take(&value)) return usage_error("--server-token-file needs a file");
      server_token_file = value;
    } else {
      rest.push_back(std::move(arg));
    }
  }
  if (rest.empty()) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  std::string command = rest.front();
  rest.erase(rest.begin());
  if (command == "--version" || command == "version") {
    std::printf("tidemark %s\n%s\n", tidemark::version(), allocator_line().c_str());
    return kExitOk;
  }
  if (command == "help") {
    if (rest.empty()) {
      std::fputs(kUsage, stdout);
      return kExitOk;
    }
    auto text = command_help(rest.front());
    if (!text || rest.size() > 1) {
      return usage_error(
          "help takes one COMMAND of: shard append snapshot listen compact sink "
          "serve bench");
    }
    std::fwrite(text->data(), 1, text->size(), stdout);
    return kExitOk;
  }
  // COMMAND --help (or -h) anywhere after the command: its help, nothing run.
  for (const std::string& word : rest) {
    if (word != "--help" && word != "-h") continue;
    if (auto text = command_help(command)) {
      std::fwrite(text->data(), 1, text->size(), stdout);
      return kExitOk;
    }
  }
  if (server) {
    if (location_given) {
      return usage_error(
          "--server sends the command to a server; --data, --blob and --consensus name a "
          "location to run it on: one or the other");
    }
    return run_remote(*server, server_token_file, command, rest);
  }
  if (command == "shard") return run_shard(globals, rest);
  if (command == "append") return run_append(globals, rest);
  if (command == "snapshot") return run_snapshot(globals, rest);
  if (command == "listen") return run_listen(globals, rest);
  if (command == "compact") return run_compact(globals, rest);
  if (command == "sink") return run_sink(globals, rest);
  if (command == "serve") return run_serve(globals, rest);
  if (command == "bench") return run_bench(globals, rest);
  return usage_error("unknown command \"" + command + "\" (see tidemark --help)");
}
