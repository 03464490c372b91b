// The `tidemark` command line: argument parsing shared by every command,
// exit codes, and the commands themselves.
//
// Exit status: 0 success; 1 error (message on stderr); 2 usage; 3 upper
// mismatch (the message names the current upper).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tidemark/client.h"
#include "tidemark/error.h"

namespace tidemark::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitMismatch = 3;

// Arguments after the command words: positionals and --flag [value].
class Args {
 public:
  // `flags_with_values` take a value; `switches` do not. Anything else
  // starting with "--" is a usage error.
  static Result<Args> parse(const std::vector<std::string>& argv,
                            const std::vector<std::string>& flags_with_values,
                            const std::vector<std::string>& switches);

  const std::vector<std::string>& positionals() const { return positionals_; }
  std::optional<std::string> get(const std::string& flag) const;
  bool has(const std::string& flag) const;
  // A time flag: a u64, or nullopt when absent; "closed" when allowed.
  Result<std::optional<Frontier>> frontier(const std::string& flag, bool allow_closed) const;

 private:
  std::vector<std::string> positionals_;
  std::map<std::string, std::string> values_;
};

// `tidemark --server URL COMMAND ...` (remote.cc): the command sent to a
// running server over HTTP.
int run_remote(const std::string& server_url, const std::optional<std::string>& token_file,
               const std::string& command, const std::vector<std::string>& argv);

// A decimal integer in [least, most], the whole text (no sign, no
// trailing junk, no overflow); nullopt otherwise.
std::optional<std::uint64_t> whole_number(std::string_view text, std::uint64_t least,
                                          std::uint64_t most);

// Buffered stdout: one fwrite per 64 KiB instead of one per line.
class Output {
 public:
  ~Output() { flush(); }
  std::string& buffer() { return buffer_; }
  void maybe_flush() {
    if (buffer_.size() >= (64 << 10)) flush();
  }
  void flush();

 private:
  std::string buffer_;
};

// Where the data lives, from --data/--blob/--consensus and the environment.
struct Globals {
  std::string data_dir = "./tidemark-data";
  std::optional<std::string> blob_url;
  std::optional<std::string> consensus_url;
};

// Whether a command may create the data directory: commands that only
// read (shard list and inspect, snapshot, listen) never do, and fail
// naming a data directory that does not exist.
enum class DataDir { kCreate, kMustExist };

Result<std::shared_ptr<Client>> open_client(const Globals& globals,
                                            DataDir data_dir = DataDir::kCreate);
// The blob and consensus URLs the globals name (creating the data directory
// if asked to).
Result<std::pair<std::string, std::string>> location_urls(const Globals& globals,
                                                          DataDir data_dir = DataDir::kCreate);

// Prints the error and returns its exit code.
int report(const Error& error);
int usage_error(const std::string& message);

// A command's help (`tidemark help COMMAND`, `COMMAND --help`): its
// options, their defaults and an example; nullopt for an unknown command.
std::optional<std::string_view> command_help(std::string_view command);

int run_shard(const Globals& globals, const std::vector<std::string>& args);
int run_append(const Globals& globals, const std::vector<std::string>& args);
int run_snapshot(const Globals& globals, const std::vector<std::string>& args);
int run_listen(const Globals& globals, const std::vector<std::string>& args);
// After an append: the merges the spine needs, then garbage collection if
// any merge ran. A failure is a warning on stderr: the append is durable.
void maintain(Shard& shard);
int run_compact(const Globals& globals, const std::vector<std::string>& args);
int run_sink(const Globals& globals, const std::vector<std::string>& args);
int run_serve(const Globals& globals, const std::vector<std::string>& args);
int run_bench(const Globals& globals, const std::vector<std::string>& args);
// `bench appender`, dispatched by run_bench (bench/bench_appender.cc).
int run_bench_appender(const Globals& globals, const std::vector<std::string>& args);
// `bench compaction`, dispatched by run_bench (bench/bench_compaction.cc).
int run_bench_compaction(const Globals& globals, const std::vector<std::string>& args);
// `bench sink`, dispatched by run_bench (bench/bench_sink.cc).
int run_bench_sink(const Globals& globals, const std::vector<std::string>& args);
int run_bench_shards(const Globals& globals, const std::vector<std::string>& args);
// `bench listen`, dispatched by run_bench (bench/bench_listen.cc).
int run_bench_listen(const Globals& globals, const std::vector<std::string>& args);

}  // namespace tidemark::cli
