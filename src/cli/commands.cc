// The shard, append, snapshot and listen commands.
#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>

#include "cli/cli.h"
#include "cli/line_reader.h"
#include "part/part_format.h"
#include "shard/state.h"
#include "tidemark/appender.h"
#include "tidemark/read.h"
#include "tidemark/write.h"
#include "util/clock.h"
#include "util/json.h"
#include "util/ndjson_rows.h"
#include "util/number.h"
#include "util/size.h"
#include "util/try.h"

namespace tidemark::cli {

// --- Args -------------------------------------------------------------------

Result<Args> Args::parse(const std::vector<std::string>& argv,
                         const std::vector<std::string>& flags_with_values,
                         const std::vector<std::string>& switches) {
  Args args;
  auto known = [](const std::vector<std::string>& list, const std::string& s) {
    return std::find(list.begin(), list.end(), s) != list.end();
  };
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() > 2 && a.starts_with("--")) {
      // --flag=value, as most tools take it, is --flag value.
      if (const auto eq = a.find('='); eq != std::string::npos) {
        const std::string flag = a.substr(0, eq);
        if (known(switches, flag)) return invalid_usage(flag + " takes no value");
        if (!known(flags_with_values, flag)) return invalid_usage("unknown option " + flag);
        args.values_[flag] = a.substr(eq + 1);
      } else if (known(switches, a)) {
        args.values_[a] = "";
      } else if (known(flags_with_values, a)) {
        if (i + 1 >= argv.size()) return invalid_usage(a + " needs a value");
        args.values_[a] = argv[++i];
      } else {
        return invalid_usage("unknown option " + a);
      }
    } else {
      args.positionals_.push_back(a);
    }
  }
  return args;
}

std::optional<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

bool Args::has(const std::string& flag) const {
  return values_.contains(flag);
}

Result<std::optional<Frontier>> Args::frontier(const std::string& flag, bool allow_closed) const {
  auto text = get(flag);
  if (!text) return std::optional<Frontier>{};
  if (allow_closed && *text == "closed") return std::optional<Frontier>{Frontier::closed()};
  const auto t = parse_decimal(*text);
  if (!t) {
    return invalid_usage(flag + " must be a time (a non-negative integer)" +
                         std::string(allow_closed ? " or \"closed\"" : "") + ", got \"" + *text +
                         "\"");
  }
  return std::optional<Frontier>{Frontier::at(*t)};
}

// --- Shared -----------------------------------------------------------------

int report(const Error& error) {
  std::fprintf(stderr, "tidemark: %s\n", error.to_string().c_str());
  if (error.is(ErrorKind::kUpperMismatch)) return kExitMismatch;
  return kExitError;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "tidemark: usage: %s\n", message.c_str());
  return kExitUsage;
}

Result<std::pair<std::string, std::string>> location_urls(const Globals& globals,
                                                          DataDir data_dir) {
  std::string blob_url, consensus_url;
  if (!globals.blob_url || !globals.consensus_url) {
    std::error_code ec;
    if (data_dir == DataDir::kMustExist && !std::filesystem::is_directory(globals.data_dir, ec)) {
      return make_error(ErrorKind::kNotFound,
                        "data directory " + globals.data_dir +
                            " does not exist (tidemark shard create makes it)");
    }
    std::filesystem::create_directories(globals.data_dir, ec);
    if (ec) {
      return determinate("cannot create data directory " + globals.data_dir + ": " + ec.message());
    }
    std::string dir = std::filesystem::canonical(globals.data_dir, ec).string();
    if (ec) return determinate("cannot resolve data directory " + globals.data_dir);
    blob_url = "file://" + dir + "/blob";
    consensus_url = "sqlite://" + dir + "/consensus.db";
  }
  if (globals.blob_url) blob_url = *globals.blob_url;
  if (globals.consensus_url) consensus_url = *globals.consensus_url;
  return std::pair{blob_url, consensus_url};
}

std::optional<std::uint64_t> whole_number(std::string_view text, std::uint64_t least,
                                          std::uint64_t most) {
  return parse_decimal(text, least, most);
}

void Output::flush() {
  if (!buffer_.empty()) std::fwrite(buffer_.data(), 1, buffer_.size(), stdout);
  buffer_.clear();
  std::fflush(stdout);
}

Result<std::shared_ptr<Client>> open_client(const Globals& globals, DataDir data_dir) {
  TM_ASSIGN(auto urls, location_urls(globals, data_dir));
  // A command is a short-lived process: it compacts in the foreground
  // (after an append, or as `compact`) instead of leaving a merge half
  // done when it exits.
  ClientOptions options;
  options.background_compaction = false;
  // A listen's scratch files go in the data directory, when there is one.
  if (!globals.blob_url || !globals.consensus_url) {
    options.scratch_directory =
        (std::filesystem::absolute(globals.data_dir).lexically_normal() / "scratch").string();
  }
  return Client::open(urls.first, urls.second, options);
}

namespace {

Result<std::shared_ptr<Shard>> open_named_shard(const Globals& globals, const std::string& name,
                                                DataDir data_dir = DataDir::kCreate) {
  TM_ASSIGN(auto client, open_client(globals, data_dir));
  return client->open_shard(name);
}

}  // namespace

// --- shard ------------------------------------------------------------------

int run_shard(const Globals& globals, const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {}, {"--json", "--force"});
  if (!args) return usage_error(args.error().message);
  const auto& pos = args->positionals();
  if (pos.empty()) {
    return usage_error(
        "shard create NAME | shard list | shard inspect NAME [--json] | shard release NAME "
        "READER | shard delete NAME [--force]");
  }
  const std::string& sub = pos[0];
  if (args->has("--force") && sub != "delete") return usage_error("--force is for shard delete");
  if (args->has("--json") && sub != "inspect") return usage_error("--json is for shard inspect");
  if (sub == "create" || sub == "inspect" || sub == "delete") {
    if (pos.size() != 2) return usage_error("shard " + sub + " takes one NAME");
  } else if (sub == "release") {
    if (pos.size() != 3) return usage_error("shard release takes NAME and READER");
  } else if (sub == "list") {
    if (pos.size() != 1) return usage_error("shard list takes no arguments");
  } else {
    return usage_error("unknown shard command \"" + sub + "\"");
  }
  auto client = open_client(globals, sub == "create" ? DataDir::kCreate : DataDir::kMustExist);
  if (!client) return report(client.error());
  if (sub == "create") {
    auto created = (*client)->create_shard(pos[1]);
    if (!created) {
      return created.error().is(ErrorKind::kInvalidUsage) ? usage_error(created.error().message)
                                                          : report(created.error());
    }
    std::printf("created shard %s\n", pos[1].c_str());
    return kExitOk;
  }
  if (sub == "list") {
    auto names = (*client)->list_shards();
    if (!names) return report(names.error());
    for (const std::string& name : *names) std::printf("%s\n", name.c_str());
    return kExitOk;
  }
  if (sub == "delete") {
    auto deleted = (*client)->delete_shard(pos[1], args->has("--force"));
    if (!deleted) {
      return deleted.error().is(ErrorKind::kInvalidUsage) ? usage_error(deleted.error().message)
                                                          : report(deleted.error());
    }
    std::printf("deleted shard %s (%llu objects and %llu state versions removed)\n", pos[1].c_str(),
                static_cast<unsigned long long>(deleted->objects_deleted),
                static_cast<unsigned long long>(deleted->versions_truncated));
    return kExitOk;
  }
  auto shard = (*client)->open_shard(pos[1]);
  if (!shard) return report(shard.error());
  if (sub == "release") {
    auto released = (*shard)->release_reader(pos[2]);
    if (!released) return report(released.error());
    std::printf("released reader %s of shard %s\n", pos[2].c_str(), pos[1].c_str());
    return kExitOk;
  }
  auto info = (*shard)->inspect();
  if (!info) return report(info.error());
  if (args->has("--json")) {
    std::printf("%s\n", info->to_json().c_str());
  } else {
    std::printf(
        "name:    %s\nupper:   %s\nsince:   %s\nseqno:   %llu\nbatches: %llu\n"
        "parts:   %llu\nupdates: %llu\nbytes:   %llu\n",
        info->name.c_str(), info->upper.to_string().c_str(), info->since.to_string().c_str(),
        static_cast<unsigned long long>(info->seqno),
        static_cast<unsigned long long>(info->batches),
        static_cast<unsigned long long>(info->parts),
        static_cast<unsigned long long>(info->updates),
        static_cast<unsigned long long>(info->bytes));
    // Who holds the since, and who writes: one line each.
    const std::uint64_t now = wall_clock_millis();
    auto expires = [now](std::uint64_t at) {
      return at > now ? "lease ends in " + std::to_string((at - now + 999) / 1000) + " s"
                      : std::string("lease ended");
    };
    auto owner = [](const std::string& who) {
      return who.empty() ? std::string() : ", owner " + who;
    };
    for (const ReaderInfo& r : info->readers) {
      std::printf(
          "reader:  %s since %s, %s%s\n", r.id.c_str(), r.since.to_string().c_str(),
          r.critical ? "critical (held until released)" : expires(r.lease_expires_ms).c_str(),
          owner(r.owner).c_str());
    }
    for (const WriterInfo& w : info->writers) {
      std::printf("writer:  %s, %s%s\n", w.id.c_str(), expires(w.lease_expires_ms).c_str(),
                  owner(w.owner).c_str());
    }
  }
  return kExitOk;
}

// --- append -----------------------------------------------------------------

namespace {

// The longest record line `append` reads unless --max-record-bytes says
// otherwise: a server's default too.
constexpr std::uint64_t kDefaultMaxRecordBytes = 32ull << 20;

// An --input that names a directory opens, and reads as nothing: refused.
Status check_input_path(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return invalid_usage("input " + path +
                         " is a directory; --input takes a file (or - for "
                         "standard input)");
  }
  return {};
}

// Managed append: records without times. Every line is validated first (a
// first pass over the input; standard input is spooled to an unnamed
// temporary file), so a malformed line appends nothing. Then:
//   - without --producer, all records are committed at once: one batch at
//     one time, max(now, upper), built in bounded memory (parts upload as
//     they fill) and appended with one compare_and_append, rebuilt at the
//     new upper if another writer moved it. Interrupted, it appended nothing
//     (or, killed in the instant after its commit, everything).
//   - with --producer ID, record i of the input (counting records, not
//     lines) is the producer's record i: the records the shard has
//     committed for ID already are skipped, and the rest stream through the
//     background appender, which commits them in order, a prefix at a time.
//     Interrupted, running it again appends exactly the rest.
int run_managed_append(const Globals& globals, const Args& args, std::uint64_t max_record_bytes) {
  std::optional<std::string> producer = args.get("--producer");
  if (producer) {
    if (auto valid = validate_producer_id(*producer); !valid) {
      return usage_error(valid.error().message);
    }
  }
  std::string input_name = args.get("--input").value_or("-");
  std::FILE* input = nullptr;
  if (input_name == "-") {
    input = std::tmpfile();
    if (!input) {
      std::fprintf(stderr, "tidemark: cannot create a temporary file for standard input\n");
      return kExitError;
    }
    char buffer[1 << 16];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, stdin)) > 0;) {
      if (std::fwrite(buffer, 1, n, input) != n) {
        std::fprintf(stderr, "tidemark: cannot spool standard input\n");
        std::fclose(input);
        return kExitError;
      }
    }
  } else {
    if (auto readable = check_input_path(input_name); !readable) {
      std::fprintf(stderr, "tidemark: %s\n", readable.error().message.c_str());
      return kExitError;
    }
    input = std::fopen(input_name.c_str(), "rb");
    if (!input) {
      std::fprintf(stderr, "tidemark: cannot open input %s\n", input_name.c_str());
      return kExitError;
    }
  }
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{input};

  // Reads the records one at a time; `visit` returns false to stop.
  auto for_each_record = [&](const std::function<bool(std::uint64_t, Record &&)>& visit,
                             std::string* failure) {
    std::rewind(input);
    LineReader lines(input, "input " + input_name, max_record_bytes, "--max-record-bytes");
    for (;;) {
      auto text = lines.next();
      if (!text) {
        *failure = text.error().message;
        return false;
      }
      if (!*text) return true;
      if (is_blank_line(**text)) continue;
      auto record = parse_record_line(**text, RecordMode::kManaged);
      if (!record) {
        *failure = "line " + std::to_string(lines.number()) + ": " + record.error().message;
        return false;
      }
      if (!visit(lines.number(), std::move(*record))) return false;
    }
  };

  std::string failure;
  std::uint64_t count = 0;
  if (!for_each_record([&](std::uint64_t, Record&&) { return ++count, true; }, &failure)) {
    std::fprintf(stderr, "tidemark: %s; nothing was appended\n", failure.c_str());
    return kExitError;
  }

  auto shard = open_named_shard(globals, args.positionals()[0]);
  if (!shard) return report(shard.error());

  if (!producer && count == 0) {
    auto upper = (*shard)->upper();
    if (!upper) return report(upper.error());
    std::printf("{\"count\":0,\"upper\":%s}\n", upper->to_json().c_str());
    return kExitOk;
  }
  if (!producer) {
    auto writer = (*shard)->open_writer();
    if (!writer) return report(writer.error());
    // A few tries when other writers keep moving the upper.
    constexpr int kMaxMismatches = 100;
    for (int mismatches = 0;; ++mismatches) {
      const Frontier upper = (*writer)->upper();
      if (upper.is_closed()) return report(invalid_usage("the shard is closed to appends").error());
      const Time time = std::max<Time>(wall_clock_millis(), upper.time());
      BatchBuilder builder = (*writer)->builder(upper);
      std::optional<Error> error;
      for_each_record(
          [&](std::uint64_t, Record&& record) {
            auto added = builder.add(record.key, record.value, time, record.diff);
            if (!added) error = added.error();
            return added.has_value();
          },
          &failure);
      if (!failure.empty()) error = corruption(failure + " (the input changed)").error();
      if (error) return report(*error);
      auto batch = builder.finish(Frontier::at(time + 1));
      if (!batch) return report(batch.error());
      std::vector<Batch> batches;
      batches.push_back(std::move(*batch));
      auto appended = (*writer)->compare_and_append(batches, upper, Frontier::at(time + 1));
      if (appended) {
        std::printf("{\"count\":%llu,\"time\":%llu,\"upper\":%llu}\n",
                    static_cast<unsigned long long>(count), static_cast<unsigned long long>(time),
                    static_cast<unsigned long long>(time + 1));
        std::fflush(stdout);
        break;
      }
      if (!appended.error().is(ErrorKind::kUpperMismatch) || mismatches >= kMaxMismatches) {
        return report(appended.error());
      }
    }
    writer->reset();
    maintain(**shard);
    return kExitOk;
  }

  // A producer: skip what the shard has committed for it.
  auto lookup = (*shard)->lookup_producer(*producer, true);
  if (!lookup) return report(lookup.error());
  const std::uint64_t committed = lookup->producer ? lookup->producer->sequence + 1 : 0;
  const std::uint64_t skip = std::min(committed, count);
  std::string out;
  if (skip == count) {
    out = "{\"count\":" + std::to_string(count);
    if (count > 0) out += ",\"time\":" + std::to_string(lookup->producer->time);
  } else {
    auto appender = Appender::open(*shard);
    if (!appender) return report(appender.error());
    auto sender = (*appender)->sender(*producer, skip);
    if (!sender) return report(sender.error());
    std::optional<Error> error;
    std::optional<CommitToken> last;
    std::uint64_t seen = 0;
    for_each_record(
        [&](std::uint64_t, Record&& record) {
          if (seen++ < skip) return true;
          AppendRecord r{std::move(record.key), std::move(record.value), record.diff};
          const bool is_last = seen == count;
          for (;;) {
            Status queued;
            if (is_last) {
              auto token = sender->enqueue_with_token(&r);
              if (token) last = *token;
              if (!token) queued = std::unexpected(token.error());
            } else {
              queued = sender->enqueue_many(std::span<AppendRecord>(&r, 1));
            }
            if (queued) return true;
            if (!queued.error().is(ErrorKind::kFull)) {
              error = queued.error();
              return false;
            }
            sender->wait_for_capacity();
          }
        },
        &failure);
    if (!failure.empty()) error = corruption(failure + " (the input changed)").error();
    if (error) return report(*error);
    auto flushed = (*appender)->flush();
    if (!flushed) return report(flushed.error());
    (*appender)->close();
    out = "{\"count\":" + std::to_string(count);
    auto time = last->wait();
    if (!time) return report(time.error());
    out += ",\"time\":" + std::to_string(*time);
  }
  auto upper = (*shard)->upper();
  if (upper) out += ",\"upper\":" + upper->to_json();
  out += ",\"producer\":";
  append_json_string(&out, *producer);
  out += ",\"duplicates\":" + std::to_string(skip);
  std::printf("%s}\n", out.c_str());
  std::fflush(stdout);
  maintain(**shard);
  return kExitOk;
}

}  // namespace

int run_append(const Globals& globals, const std::vector<std::string>& argv) {
  auto args =
      Args::parse(argv, {"--input", "--lower", "--upper", "--producer", "--max-record-bytes"}, {});
  if (!args) return usage_error(args.error().message);
  if (args->positionals().size() != 1) return usage_error("append takes one NAME");
  // The longest record line read, as a server's default (a part block
  // holds at most 1 GiB).
  std::uint64_t max_record_bytes = kDefaultMaxRecordBytes;
  if (auto text = args->get("--max-record-bytes")) {
    auto bytes = parse_size(*text);
    if (!bytes || *bytes == 0 || *bytes > kMaxBlockUncompressedBytes / 2) {
      return usage_error("--max-record-bytes takes a size from 1 byte to 512MiB, got " + *text);
    }
    max_record_bytes = *bytes;
  }
  if (args->has("--producer") && args->has("--lower")) {
    return usage_error("--producer is for managed appends (without --lower/--upper)");
  }
  auto lower = args->frontier("--lower", false);
  if (!lower) return usage_error(lower.error().message);
  auto upper = args->frontier("--upper", true);
  if (!upper) return usage_error(upper.error().message);
  if (lower->has_value() != upper->has_value()) {
    return usage_error("--lower and --upper go together");
  }
  if (!lower->has_value()) return run_managed_append(globals, *args, max_record_bytes);
  if (**upper < **lower) {
    return usage_error("--upper " + (*upper)->to_string() + " is below --lower " +
                       (*lower)->to_string());
  }

  std::string input_name = args->get("--input").value_or("-");
  std::FILE* in = stdin;
  if (input_name != "-") {
    if (auto readable = check_input_path(input_name); !readable) {
      std::fprintf(stderr, "tidemark: %s\n", readable.error().message.c_str());
      return kExitError;
    }
    in = std::fopen(input_name.c_str(), "rb");
    if (!in) {
      std::fprintf(stderr, "tidemark: cannot open input %s\n", input_name.c_str());
      return kExitError;
    }
  }
  struct Closer {
    std::FILE* f;
    ~Closer() {
      if (f != stdin) std::fclose(f);
    }
  } closer{in};

  auto shard = open_named_shard(globals, args->positionals()[0]);
  if (!shard) return report(shard.error());
  auto writer = (*shard)->open_writer();
  if (!writer) return report(writer.error());

  // Every line is validated before anything is committed; on any error the
  // builder is dropped, which deletes the parts it uploaded.
  Description desc{**lower, **upper, Frontier::at(0)};
  BatchBuilder builder = (*writer)->builder(desc.lower);
  LineReader lines(in, "input " + input_name, max_record_bytes, "--max-record-bytes");
  std::uint64_t count = 0;
  for (;;) {
    auto line = lines.next();
    if (!line) {
      std::fprintf(stderr, "tidemark: %s; nothing was appended\n", line.error().message.c_str());
      return kExitError;
    }
    if (!*line) break;
    if (is_blank_line(**line)) continue;
    auto record = parse_record_line(**line, RecordMode::kExplicit);
    auto fail = [&](const std::string& message) {
      std::fprintf(stderr, "tidemark: line %llu: %s; nothing was appended\n",
                   static_cast<unsigned long long>(lines.number()), message.c_str());
      return kExitError;
    };
    if (!record) return fail(record.error().message);
    if (!desc.contains(*record->time)) {
      return fail("time " + std::to_string(*record->time) + " is outside [" +
                  desc.lower.to_string() + ", " + desc.upper.to_string() + ")");
    }
    auto added = builder.add(record->key, record->value, *record->time, record->diff);
    if (!added) return fail(added.error().message);
    ++count;
  }
  auto batch = builder.finish(desc.upper);
  if (!batch) return report(batch.error());
  std::vector<Batch> batches;
  batches.push_back(std::move(*batch));
  auto appended = (*writer)->compare_and_append(batches, desc.lower, desc.upper);
  if (!appended) return report(appended.error());
  std::printf("{\"count\":%llu,\"lower\":%s,\"upper\":%s}\n",
              static_cast<unsigned long long>(count), desc.lower.to_json().c_str(),
              desc.upper.to_json().c_str());
  std::fflush(stdout);
  writer->reset();
  maintain(**shard);
  return kExitOk;
}

// --- compact ----------------------------------------------------------------

namespace {

std::string compaction_json(const CompactionReport& c, const GcReport& g) {
  auto field = [](const char* name, std::uint64_t value) {
    return std::string("\"") + name + "\":" + std::to_string(value);
  };
  return "{" + field("merges", c.merges) + "," + field("merges_lost", c.merges_lost) + "," +
         field("batches_merged", c.batches_merged) + "," + field("parts_written", c.parts_written) +
         "," + field("bytes_written", c.bytes_written) + "," +
         field("parts_deleted", g.parts_deleted) + "," +
         field("orphans_deleted", g.orphans_deleted) + "," +
         field("rollups_deleted", g.rollups_deleted) + "," +
         field("versions_truncated", g.versions_truncated) + "," +
         field("parts_live", g.parts_live);
}

}  // namespace

void maintain(Shard& shard) {
  auto compacted = shard.compact();
  if (!compacted) {
    std::fprintf(stderr, "tidemark: warning: the append is durable, but compacting failed: %s\n",
                 compacted.error().to_string().c_str());
    return;
  }
  if (compacted->merges == 0) return;
  auto collected = shard.collect_garbage();
  if (!collected) {
    std::fprintf(stderr,
                 "tidemark: warning: the append is durable, but garbage collection failed: %s\n",
                 collected.error().to_string().c_str());
  }
}

int run_compact(const Globals& globals, const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {}, {});
  if (!args) return usage_error(args.error().message);
  if (args->positionals().size() != 1) return usage_error("compact takes one NAME");
  auto shard = open_named_shard(globals, args->positionals()[0]);
  if (!shard) return report(shard.error());
  auto compacted = (*shard)->compact();
  if (!compacted) return report(compacted.error());
  auto collected = (*shard)->collect_garbage();
  if (!collected) return report(collected.error());
  auto info = (*shard)->inspect();
  if (!info) return report(info.error());
  std::printf("%s,\"batches\":%llu,\"parts\":%llu,\"inline_parts\":%llu}\n",
              compaction_json(*compacted, *collected).c_str(),
              static_cast<unsigned long long>(info->batches),
              static_cast<unsigned long long>(info->parts),
              static_cast<unsigned long long>(info->inline_parts));
  return kExitOk;
}

// --- snapshot ---------------------------------------------------------------

int run_snapshot(const Globals& globals, const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--as-of"}, {});
  if (!args) return usage_error(args.error().message);
  if (args->positionals().size() != 1) return usage_error("snapshot takes one NAME");
  auto as_of_flag = args->frontier("--as-of", false);
  if (!as_of_flag) return usage_error(as_of_flag.error().message);
  auto shard = open_named_shard(globals, args->positionals()[0], DataDir::kMustExist);
  if (!shard) return report(shard.error());
  Time as_of;
  if (*as_of_flag) {
    as_of = (*as_of_flag)->time();
  } else {
    // The latest complete time: just below the upper (all of it, closed).
    auto upper = (*shard)->upper();
    if (!upper) return report(upper.error());
    const std::optional<Time> latest = latest_complete_time(*upper);
    if (!latest) {
      std::fprintf(stderr, "tidemark: shard %s has no complete time yet (its upper is 0)\n",
                   args->positionals()[0].c_str());
      return kExitError;
    }
    as_of = *latest;
  }
  auto cursor = (*shard)->snapshot(as_of);
  if (!cursor) return report(cursor.error());
  Output out;
  for (;;) {
    auto row = cursor->next();
    if (!row) {
      out.flush();
      return report(row.error());
    }
    if (!*row) break;
    append_snapshot_row(&out.buffer(), (*row)->key, (*row)->value, (*row)->diff);
    out.maybe_flush();
  }
  return kExitOk;
}

// --- listen -----------------------------------------------------------------

namespace {

// Prints a listener's events as NDJSON until it is done.
int print_listen(Listener& listener) {
  Output out;
  for (;;) {
    auto event = listener.next();
    if (!event) {
      out.flush();
      return report(event.error());
    }
    if (!*event) break;
    const ListenEvent& e = **event;
    if (e.kind == ListenEvent::Kind::kProgress) {
      append_progress_row(&out.buffer(), e.progress);
      out.flush();  // a reader waiting on progress sees it now
    } else {
      append_listen_row(&out.buffer(), e.key, e.value, e.time, e.diff);
      out.maybe_flush();
    }
  }
  return kExitOk;
}

}  // namespace

int run_listen(const Globals& globals, const std::vector<std::string>& argv) {
  auto args =
      Args::parse(argv, {"--from", "--resume-progress", "--until", "--as-of"}, {"--snapshot"});
  if (!args) return usage_error(args.error().message);
  if (args->positionals().size() != 1) return usage_error("listen takes one NAME");
  auto from = args->frontier("--from", false);
  if (!from) return usage_error(from.error().message);
  // The progress value a stream printed last, "null" included.
  auto resume = args->get("--resume-progress") == "null"
                    ? Result<std::optional<Frontier>>(std::optional<Frontier>{Frontier::closed()})
                    : args->frontier("--resume-progress", false);
  if (!resume) return usage_error(resume.error().message);
  auto as_of = args->frontier("--as-of", false);
  if (!as_of) return usage_error(as_of.error().message);
  const bool snapshot = args->has("--snapshot");
  if (snapshot && (from->has_value() || resume->has_value())) {
    return usage_error(
        "listen --snapshot starts at its snapshot: it takes --as-of T, not --from or "
        "--resume-progress");
  }
  if (!snapshot && as_of->has_value()) {
    return usage_error("--as-of is for listen --snapshot");
  }
  if (!snapshot && from->has_value() == resume->has_value()) {
    return usage_error(
        "listen needs one of --from T (times after T), --resume-progress P (times from P on) "
        "and --snapshot (the snapshot, then every change after it)");
  }
  auto until = args->frontier("--until", false);
  if (!until) return usage_error(until.error().message);
  auto shard = open_named_shard(globals, args->positionals()[0], DataDir::kMustExist);
  if (!shard) return report(shard.error());
  std::optional<Time> until_time;
  if (*until) until_time = (*until)->time();
  if (snapshot) {
    std::optional<Time> as_of_time;
    if (*as_of) as_of_time = (*as_of)->time();
    auto both = (*shard)->listen_snapshot(as_of_time, until_time);
    if (!both) return report(both.error());
    return print_listen(*both->listener);
  }
  const ListenStart start =
      *from ? ListenStart::after((*from)->time()) : ListenStart::at_progress(**resume);
  auto listener = (*shard)->listen(start, until_time);
  if (!listener) return report(listener.error());
  return print_listen(**listener);
}

}  // namespace tidemark::cli
