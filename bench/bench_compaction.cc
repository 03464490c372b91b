// tidemark bench compaction: issue #4's figures for docs/benchmarks.md.
// Many small appends to one shard with the background compactor on (the
// default), on the embedded default (file blob + SQLite) in a scratch
// directory.
//
//   tidemark bench compaction [--appends N] [--background-compaction on|off]
//       [--dir DIR] [--json]
//
// One writer makes N compare_and_append calls (default 100,000) of one
// record each: append i holds a distinct 16-byte JSON string key and a
// short JSON number value at time i, in the batch [i, i + 1). The blob and
// the consensus are wrapped in counting decorators, so the figures say what
// the engine wrote. --background-compaction off (ClientOptions) shows what
// the compactor costs the appends; the final compact() then does all the
// merging.
//
//   append            the whole append (building and uploading its one-part
//                     batch, then compare_and_append) p50/p99, the
//                     compare_and_append call alone p50/p99, appends/s over
//                     the run, and the run's time split between building
//                     and compare_and_append
//   batches           inspect().batches every 1,000 appends (mean, most, and
//                     at each power of ten) and at the end; then the writer
//                     and the shard handle are dropped (which stops the
//                     background compactor) and a handle without one runs a
//                     final Shard::compact() and everything below
//   bytes per CaS     next.data.size() of every committed compare_and_set:
//                     the appends' own (mean, max, and the mean over the
//                     first and the last 1,000 appends: a CaS that grows
//                     with the shard shows there) and everyone else's (the
//                     compactor, heartbeats, garbage collection)
//   open              Client::open + open_shard + inspect with new backends,
//                     in this process and in a child process (nothing
//                     cached in the process; the OS page cache stays warm),
//                     and the reads it took
//   snapshot          the whole shard at upper - 1, rows/s, in both
//   garbage           after the writer is dropped: blob objects (parts and
//                     rollups) and consensus versions before and after
//                     Shard::collect_garbage, and its GcReport
//
// Benchmarks report figures; they never pass or fail on time. A snapshot
// that does not hold exactly the N records is a correctness failure: the
// command says so and exits 1.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "bench_util.h"
#include "cli/cli.h"
#include "location/forwarding.h"
#include "shard/state.h"
#include "tidemark/read.h"
#include "tidemark/write.h"
#include "util/try.h"

namespace tidemark::cli {
namespace {

using Clock = BenchClock;

constexpr const char* kCompactionUsage =
    "bench compaction [--appends N] [--background-compaction on|off] [--dir DIR] [--json]";
constexpr const char* kShardName = "compaction";
// Appends between two samples of the batch count; appends in the first and
// in the last window whose bytes per CaS are compared.
constexpr std::uint64_t kSampleEvery = 1000;
constexpr std::uint64_t kWindow = 1000;

// What a CountingConsensus saw.
struct ConsensusCounts {
  std::uint64_t heads = 0, scans = 0, versions_read = 0, bytes_read = 0;
  std::uint64_t cas_committed = 0, cas_mismatched = 0, cas_bytes = 0;
  // Committed by the thread that made the decorator (the benchmark's own
  // calls), and by every other thread (the compactor, heartbeats).
  std::uint64_t own_cas = 0, own_cas_bytes = 0, own_cas_mismatched = 0;
  std::uint64_t other_cas = 0, other_cas_bytes = 0, other_cas_max_bytes = 0;
};

// Forwards to a real Consensus and counts what passes through it, as
// FaultyConsensus (location/faulty.h) does without the faults.
class CountingConsensus : public ForwardingConsensus {
 public:
  explicit CountingConsensus(std::shared_ptr<Consensus> inner)
      : ForwardingConsensus(std::move(inner)), owner_(std::this_thread::get_id()) {}

  Result<std::optional<VersionedData>> head(std::string_view key) override {
    auto result = ForwardingConsensus::head(key);
    std::lock_guard lock(mu_);
    ++counts_.heads;
    if (result && *result) counts_.bytes_read += (*result)->data.size();
    return result;
  }

  Result<CasOutcome> compare_and_set(std::string_view key, std::optional<SeqNo> expected,
                                     VersionedData next) override {
    const std::uint64_t bytes = next.data.size();
    auto result = ForwardingConsensus::compare_and_set(key, expected, std::move(next));
    if (!result) return result;
    const bool own = std::this_thread::get_id() == owner_;
    std::lock_guard lock(mu_);
    if (*result == CasOutcome::kExpectationMismatch) {
      ++counts_.cas_mismatched;
      if (own) ++counts_.own_cas_mismatched;
      return result;
    }
    ++counts_.cas_committed;
    counts_.cas_bytes += bytes;
    if (own) {
      ++counts_.own_cas;
      counts_.own_cas_bytes += bytes;
    } else {
      ++counts_.other_cas;
      counts_.other_cas_bytes += bytes;
      counts_.other_cas_max_bytes = std::max(counts_.other_cas_max_bytes, bytes);
    }
    return result;
  }

  Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                          std::size_t limit) override {
    auto result = ForwardingConsensus::scan(key, from, limit);
    std::lock_guard lock(mu_);
    ++counts_.scans;
    if (result) {
      counts_.versions_read += result->size();
      for (const VersionedData& version : *result) counts_.bytes_read += version.data.size();
    }
    return result;
  }

  ConsensusCounts counts() {
    std::lock_guard lock(mu_);
    return counts_;
  }

 private:
  const std::thread::id owner_;
  std::mutex mu_;
  ConsensusCounts counts_;  // guarded by mu_
};

// What a CountingBlob saw.
struct BlobCounts {
  std::uint64_t gets = 0, get_bytes = 0;  // get and get_range
  std::uint64_t part_sets = 0, part_bytes = 0, rollup_sets = 0, rollup_bytes = 0;
  std::uint64_t removes = 0;
};

// Forwards to a real Blob and counts what passes through it, telling the
// shard's parts from its rollups by their key prefixes.
class CountingBlob : public ForwardingBlob {
 public:
  CountingBlob(std::shared_ptr<Blob> inner, std::string_view shard)
      : ForwardingBlob(std::move(inner)),
        part_prefix_(shard_part_prefix(shard)),
        rollup_prefix_(shard_rollup_prefix(shard)) {}

  Result<std::optional<std::string>> get(std::string_view key) override {
    auto result = ForwardingBlob::get(key);
    std::lock_guard lock(mu_);
    ++counts_.gets;
    if (result && *result) counts_.get_bytes += (*result)->size();
    return result;
  }

  Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                std::uint64_t length) override {
    auto result = ForwardingBlob::get_range(key, offset, length);
    std::lock_guard lock(mu_);
    ++counts_.gets;
    if (result) counts_.get_bytes += result->size();
    return result;
  }

  Status set(std::string_view key, std::string_view bytes) override {
    auto result = ForwardingBlob::set(key, bytes);
    if (!result) return result;
    std::lock_guard lock(mu_);
    if (key.starts_with(rollup_prefix_)) {
      ++counts_.rollup_sets;
      counts_.rollup_bytes += bytes.size();
    } else if (key.starts_with(part_prefix_)) {
      ++counts_.part_sets;
      counts_.part_bytes += bytes.size();
    }
    return result;
  }

  Status remove(std::string_view key) override {
    auto result = ForwardingBlob::remove(key);
    std::lock_guard lock(mu_);
    ++counts_.removes;
    return result;
  }

  Status remove_many(const std::vector<std::string>& keys) override {
    auto result = ForwardingBlob::remove_many(keys);
    std::lock_guard lock(mu_);
    counts_.removes += keys.size();
    return result;
  }

  BlobCounts counts() {
    std::lock_guard lock(mu_);
    return counts_;
  }

 private:
  const std::string part_prefix_;
  const std::string rollup_prefix_;
  std::mutex mu_;
  BlobCounts counts_;  // guarded by mu_
};

// The embedded default in `dir`, behind counting decorators.
struct CountedLocation {
  std::shared_ptr<CountingBlob> blob;
  std::shared_ptr<CountingConsensus> consensus;
  Location location() const { return Location{blob, consensus}; }
};

Result<CountedLocation> open_counted(const std::filesystem::path& dir) {
  TM_ASSIGN(auto blob, open_blob(blob_url(dir)));
  TM_ASSIGN(auto consensus, open_consensus(consensus_url(dir)));
  return CountedLocation{std::make_shared<CountingBlob>(std::move(blob), kShardName),
                         std::make_shared<CountingConsensus>(std::move(consensus))};
}

// One record: a distinct 16-byte JSON string key, a short JSON number.
Update make_update(std::uint64_t i) {
  char key[32];
  std::snprintf(key, sizeof key, "\"k%013llu\"", static_cast<unsigned long long>(i));
  return Update{key, std::to_string(i * 2654435761u % 1000000007u), i, 1};
}

// A fresh open of the shard, then a snapshot of all of it.
struct OpenRun {
  double open_seconds = 0;  // backends, Client::open, open_shard, inspect
  ShardInfo info;
  ConsensusCounts open_consensus;  // the open's reads
  BlobCounts open_blob;
  std::uint64_t snapshot_rows = 0;
  std::int64_t snapshot_diffs = 0;
  double snapshot_seconds = 0;
  double process_seconds = 0;  // child only: spawn to exit, as the parent saw it
};

Result<OpenRun> open_and_snapshot(const std::filesystem::path& dir) {
  // The open starts no compactor thread (only an append does), and the
  // snapshot appends nothing: the default options.
  OpenRun run;
  auto start = Clock::now();
  TM_ASSIGN(CountedLocation counted, open_counted(dir));
  TM_ASSIGN(auto client, Client::open(counted.location()));
  TM_ASSIGN(auto shard, client->open_shard(kShardName));
  TM_ASSIGN(run.info, shard->inspect());
  run.open_seconds = seconds_since(start);
  run.open_consensus = counted.consensus->counts();
  run.open_blob = counted.blob->counts();
  if (run.info.upper.is_closed() || run.info.upper.time() == 0) {
    return determinate("the shard's upper is " + run.info.upper.to_string());
  }
  start = Clock::now();
  TM_ASSIGN(SnapshotCursor cursor, shard->snapshot(run.info.upper.time() - 1));
  for (;;) {
    TM_ASSIGN(auto row, cursor.next());
    if (!row) break;
    ++run.snapshot_rows;
    run.snapshot_diffs += row->diff;
  }
  run.snapshot_seconds = seconds_since(start);
  return run;
}

// `tidemark bench compaction-child DIR`: open_and_snapshot in a process of
// its own, its figures on one line.
int open_child(const std::string& dir) {
  auto run = open_and_snapshot(dir);
  if (!run) return report(run.error());
  std::printf("%.6f %llu %llu %llu %llu %llu %llu %llu %llu %lld %.6f\n", run->open_seconds,
              static_cast<unsigned long long>(run->info.batches),
              static_cast<unsigned long long>(run->info.parts),
              static_cast<unsigned long long>(run->open_consensus.heads),
              static_cast<unsigned long long>(run->open_consensus.scans),
              static_cast<unsigned long long>(run->open_consensus.versions_read),
              static_cast<unsigned long long>(run->open_blob.gets),
              static_cast<unsigned long long>(run->open_blob.get_bytes),
              static_cast<unsigned long long>(run->snapshot_rows),
              static_cast<long long>(run->snapshot_diffs), run->snapshot_seconds);
  return kExitOk;
}

Result<OpenRun> run_open_child(const std::filesystem::path& dir) {
  const auto start = Clock::now();
  TM_ASSIGN(std::string text, run_bench_child("compaction-child", dir));
  OpenRun run;
  run.process_seconds = seconds_since(start);
  unsigned long long batches = 0, parts = 0, heads = 0, scans = 0, versions = 0, gets = 0,
                     get_bytes = 0, rows = 0;
  long long diffs = 0;
  if (std::sscanf(text.c_str(), "%lf %llu %llu %llu %llu %llu %llu %llu %llu %lld %lf",
                  &run.open_seconds, &batches, &parts, &heads, &scans, &versions, &gets, &get_bytes,
                  &rows, &diffs, &run.snapshot_seconds) != 11) {
    return determinate("the open child printed \"" + text + "\"");
  }
  run.info.batches = batches;
  run.info.parts = parts;
  run.open_consensus.heads = heads;
  run.open_consensus.scans = scans;
  run.open_consensus.versions_read = versions;
  run.open_blob.gets = gets;
  run.open_blob.get_bytes = get_bytes;
  run.snapshot_rows = rows;
  run.snapshot_diffs = diffs;
  return run;
}

// Blob objects and consensus versions the shard holds now.
struct Stored {
  std::uint64_t parts = 0, rollups = 0, other = 0;  // blob objects
  std::uint64_t bytes = 0;                          // of all blob objects
  std::uint64_t versions = 0;                       // consensus versions of the shard
};

Result<Stored> count_stored(const Location& location) {
  Stored s;
  const std::string parts = shard_part_prefix(kShardName);
  const std::string rollups = shard_rollup_prefix(kShardName);
  TM_TRY(location.blob->list("", [&](std::string_view key, std::uint64_t size) {
    if (key.starts_with(parts)) {
      ++s.parts;
    } else if (key.starts_with(rollups)) {
      ++s.rollups;
    } else {
      ++s.other;
    }
    s.bytes += size;
  }));
  const std::string key = shard_consensus_key(kShardName);
  for (SeqNo from = 0;;) {
    TM_ASSIGN(auto versions, location.consensus->scan(key, from, 4096));
    if (versions.empty()) break;
    s.versions += versions.size();
    from = versions.back().seqno + 1;
  }
  return s;
}

struct Figures {
  std::uint64_t appends = 0;
  bool background_compaction = true;
  double append_seconds = 0, appends_per_s = 0;
  double build_seconds = 0, cas_seconds = 0;  // summed over the appends
  double append_p50_ms = 0, append_p99_ms = 0, cas_p50_ms = 0, cas_p99_ms = 0;

  // (appends so far, batches) at each power of ten, and the most seen.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> batches_at;
  std::uint64_t batches_max = 0, batches_max_at = 0;
  double batches_mean = 0;  // over the samples every kSampleEvery appends
  ShardInfo at_end, after_compact;
  double compactor_stop_seconds = 0;  // dropping the writer and the shard
  CompactionReport final_compaction;
  double compact_seconds = 0;

  // Bytes of the appends' own committed CaS (one per append).
  double append_cas_mean = 0, append_cas_first_mean = 0, append_cas_last_mean = 0;
  std::uint64_t append_cas_max = 0, append_cas_max_at = 0;
  std::uint64_t append_mismatches = 0;  // lost races, retried by the machine
  ConsensusCounts consensus;            // over the appends
  BlobCounts blob;                      // over the appends
  SeqNo seqno_at_end = 0;

  OpenRun open_here, open_child;
  Stored before_gc, after_gc;
  GcReport gc;
  double gc_seconds = 0;
};

Result<Figures> run_compaction(const std::filesystem::path& dir, std::uint64_t appends,
                               bool background_compaction) {
  Figures f;
  f.appends = appends;
  f.background_compaction = background_compaction;
  TM_ASSIGN(CountedLocation counted, open_counted(dir));
  ClientOptions options;
  options.background_compaction = background_compaction;
  TM_ASSIGN(auto client, Client::open(counted.location(), options));
  TM_TRY(client->create_shard(kShardName));
  TM_ASSIGN(auto shard, client->open_shard(kShardName));
  TM_ASSIGN(auto writer, shard->open_writer());

  std::vector<float> append_ms, cas_ms;
  std::vector<std::uint32_t> cas_bytes;  // of append i's committed CaS
  append_ms.reserve(appends);
  cas_ms.reserve(appends);
  cas_bytes.reserve(appends);
  const ConsensusCounts before = counted.consensus->counts();
  const BlobCounts blob_before = counted.blob->counts();
  ConsensusCounts last = before;
  std::uint64_t next_power = 10;
  double sampling_seconds = 0;
  std::uint64_t samples = 0, sampled_batches = 0;
  const auto start = Clock::now();
  for (std::uint64_t i = 0; i < appends; ++i) {
    const Update update = make_update(i);
    const auto begin = Clock::now();
    TM_ASSIGN(Batch batch,
              writer->batch(std::span(&update, 1), Frontier::at(i), Frontier::at(i + 1)));
    const auto built = Clock::now();
    TM_TRY(writer->compare_and_append(std::span(&batch, 1), Frontier::at(i), Frontier::at(i + 1)));
    const auto done = Clock::now();
    append_ms.push_back(std::chrono::duration<float, std::milli>(done - begin).count());
    cas_ms.push_back(std::chrono::duration<float, std::milli>(done - built).count());
    f.build_seconds += std::chrono::duration<double>(built - begin).count();
    f.cas_seconds += std::chrono::duration<double>(done - built).count();
    const ConsensusCounts now = counted.consensus->counts();
    if (now.own_cas != last.own_cas + 1) {
      return determinate("append " + std::to_string(i) + " committed " +
                         std::to_string(now.own_cas - last.own_cas) + " consensus writes");
    }
    cas_bytes.push_back(static_cast<std::uint32_t>(now.own_cas_bytes - last.own_cas_bytes));
    last = now;

    const std::uint64_t made = i + 1;
    if (made % kSampleEvery == 0 || made == next_power || made == appends) {
      const auto sample = Clock::now();
      TM_ASSIGN(ShardInfo info, shard->inspect());
      if (made % kSampleEvery == 0) {
        ++samples;
        sampled_batches += info.batches;
      }
      if (info.batches > f.batches_max) {
        f.batches_max = info.batches;
        f.batches_max_at = made;
      }
      if (made == next_power) {
        f.batches_at.emplace_back(made, info.batches);
        next_power *= 10;
      }
      sampling_seconds += seconds_since(sample);
    }
  }
  f.append_seconds = seconds_since(start) - sampling_seconds;
  f.batches_mean = samples == 0 ? 0 : static_cast<double>(sampled_batches) / samples;
  f.appends_per_s = appends / f.append_seconds;
  f.append_p50_ms = percentile(append_ms, 0.5);
  f.append_p99_ms = percentile(append_ms, 0.99);
  f.cas_p50_ms = percentile(cas_ms, 0.5);
  f.cas_p99_ms = percentile(cas_ms, 0.99);

  // Counts over the appends (the benchmark's own writes before them left
  // out: creating the shard and the writer).
  f.consensus = counted.consensus->counts();
  f.consensus.cas_committed -= before.cas_committed;
  f.consensus.cas_bytes -= before.cas_bytes;
  f.consensus.cas_mismatched -= before.cas_mismatched;
  f.consensus.own_cas -= before.own_cas;
  f.consensus.own_cas_bytes -= before.own_cas_bytes;
  f.append_mismatches = f.consensus.own_cas_mismatched - before.own_cas_mismatched;
  f.blob = counted.blob->counts();
  f.blob.part_sets -= blob_before.part_sets;
  f.blob.part_bytes -= blob_before.part_bytes;
  f.blob.rollup_sets -= blob_before.rollup_sets;
  f.blob.rollup_bytes -= blob_before.rollup_bytes;
  f.blob.removes -= blob_before.removes;

  std::uint64_t total = 0;
  for (std::uint64_t i = 0; i < appends; ++i) {
    total += cas_bytes[i];
    if (cas_bytes[i] > f.append_cas_max) {
      f.append_cas_max = cas_bytes[i];
      f.append_cas_max_at = i;
    }
  }
  f.append_cas_mean = static_cast<double>(total) / appends;
  const std::uint64_t window = std::min(kWindow, appends);
  std::uint64_t first = 0, tail = 0;
  for (std::uint64_t i = 0; i < window; ++i) {
    first += cas_bytes[i];
    tail += cas_bytes[appends - window + i];
  }
  f.append_cas_first_mean = static_cast<double>(first) / window;
  f.append_cas_last_mean = static_cast<double>(tail) / window;

  TM_ASSIGN(f.at_end, shard->inspect());
  f.seqno_at_end = f.at_end.seqno;

  // Dropping the writer removes it from the shard; then nothing but the
  // state's own versions hold parts. Dropping the shard handle (the
  // writer's holds its context too) stops its background compactor, after
  // the merge or collection it is in the middle of, so what follows is
  // measured alone, through a handle without one.
  auto stop_start = Clock::now();
  writer.reset();
  shard.reset();
  f.compactor_stop_seconds = seconds_since(stop_start);
  ClientOptions quiet = options;
  quiet.background_compaction = false;
  TM_ASSIGN(auto quiet_client, Client::open(counted.location(), quiet));
  TM_ASSIGN(shard, quiet_client->open_shard(kShardName));
  auto compact_start = Clock::now();
  TM_ASSIGN(f.final_compaction, shard->compact());
  f.compact_seconds = seconds_since(compact_start);
  TM_ASSIGN(f.after_compact, shard->inspect());

  TM_ASSIGN(f.open_here, open_and_snapshot(dir));
  TM_ASSIGN(f.open_child, run_open_child(dir));

  TM_ASSIGN(f.before_gc, count_stored(counted.location()));
  auto gc_start = Clock::now();
  TM_ASSIGN(f.gc, shard->collect_garbage());
  f.gc_seconds = seconds_since(gc_start);
  TM_ASSIGN(f.after_gc, count_stored(counted.location()));
  return f;
}

double mean(std::uint64_t bytes, std::uint64_t count) {
  return count == 0 ? 0 : static_cast<double>(bytes) / count;
}

std::string batches_at_json(const Figures& f) {
  std::string out = "[";
  for (const auto& [made, batches] : f.batches_at) {
    if (out.size() > 1) out += ",";
    out += "[" + std::to_string(made) + "," + std::to_string(batches) + "]";
  }
  return out + "]";
}

void print_json(const Figures& f) {
  const ConsensusCounts& c = f.consensus;
  std::printf(
      "{\"appends\":%llu,\"background_compaction\":%s,\"append_seconds\":%.2f,"
      "\"build_seconds\":%.2f,\"cas_seconds\":%.2f,\"appends_per_s\":%.0f,"
      "\"append_p50_ms\":%.3f,\"append_p99_ms\":%.3f,\"cas_p50_ms\":%.3f,\"cas_p99_ms\":%.3f,"
      "\"append_mismatches\":%llu,",
      static_cast<unsigned long long>(f.appends), f.background_compaction ? "true" : "false",
      f.append_seconds, f.build_seconds, f.cas_seconds, f.appends_per_s, f.append_p50_ms,
      f.append_p99_ms, f.cas_p50_ms, f.cas_p99_ms,
      static_cast<unsigned long long>(f.append_mismatches));
  std::printf(
      "\"batches_at\":%s,\"batches_max\":%llu,\"batches_max_at\":%llu,\"batches_mean\":%.1f,"
      "\"batches_end\":%llu,\"parts_end\":%llu,\"compactor_stop_seconds\":%.3f,"
      "\"batches_after_compact\":%llu,\"parts_after_compact\":%llu,"
      "\"compact_seconds\":%.3f,\"compact_merges\":%llu,\"seqno_end\":%llu,",
      batches_at_json(f).c_str(), static_cast<unsigned long long>(f.batches_max),
      static_cast<unsigned long long>(f.batches_max_at), f.batches_mean,
      static_cast<unsigned long long>(f.at_end.batches),
      static_cast<unsigned long long>(f.at_end.parts), f.compactor_stop_seconds,
      static_cast<unsigned long long>(f.after_compact.batches),
      static_cast<unsigned long long>(f.after_compact.parts), f.compact_seconds,
      static_cast<unsigned long long>(f.final_compaction.merges),
      static_cast<unsigned long long>(f.seqno_at_end));
  std::printf(
      "\"append_cas_bytes_mean\":%.1f,\"append_cas_bytes_max\":%llu,"
      "\"append_cas_bytes_first_1000_mean\":%.1f,\"append_cas_bytes_last_1000_mean\":%.1f,"
      "\"cas_committed\":%llu,\"cas_bytes_mean\":%.1f,\"other_cas\":%llu,"
      "\"other_cas_bytes_mean\":%.1f,\"other_cas_bytes_max\":%llu,\"cas_mismatched\":%llu,"
      "\"part_sets\":%llu,\"part_bytes\":%llu,\"rollup_sets\":%llu,\"rollup_bytes\":%llu,"
      "\"blob_removes\":%llu,",
      f.append_cas_mean, static_cast<unsigned long long>(f.append_cas_max), f.append_cas_first_mean,
      f.append_cas_last_mean, static_cast<unsigned long long>(c.cas_committed),
      mean(c.cas_bytes, c.cas_committed), static_cast<unsigned long long>(c.other_cas),
      mean(c.other_cas_bytes, c.other_cas), static_cast<unsigned long long>(c.other_cas_max_bytes),
      static_cast<unsigned long long>(c.cas_mismatched),
      static_cast<unsigned long long>(f.blob.part_sets),
      static_cast<unsigned long long>(f.blob.part_bytes),
      static_cast<unsigned long long>(f.blob.rollup_sets),
      static_cast<unsigned long long>(f.blob.rollup_bytes),
      static_cast<unsigned long long>(f.blob.removes));
  for (const auto& [name, run] : {std::pair{"open", &f.open_here}, {"open_child", &f.open_child}}) {
    std::printf(
        "\"%s_seconds\":%.4f,\"%s_consensus_heads\":%llu,\"%s_consensus_scans\":%llu,"
        "\"%s_versions_read\":%llu,\"%s_blob_gets\":%llu,\"%s_blob_get_bytes\":%llu,"
        "\"%s_snapshot_rows\":%llu,\"%s_snapshot_seconds\":%.3f,\"%s_snapshot_rows_per_s\":%.0f,",
        name, run->open_seconds, name, static_cast<unsigned long long>(run->open_consensus.heads),
        name, static_cast<unsigned long long>(run->open_consensus.scans), name,
        static_cast<unsigned long long>(run->open_consensus.versions_read), name,
        static_cast<unsigned long long>(run->open_blob.gets), name,
        static_cast<unsigned long long>(run->open_blob.get_bytes), name,
        static_cast<unsigned long long>(run->snapshot_rows), name, run->snapshot_seconds, name,
        run->snapshot_seconds > 0 ? run->snapshot_rows / run->snapshot_seconds : 0);
  }
  std::printf("\"open_child_process_seconds\":%.4f,", f.open_child.process_seconds);
  for (const auto& [name, s] : {std::pair{"before_gc", &f.before_gc}, {"after_gc", &f.after_gc}}) {
    std::printf(
        "\"%s_parts\":%llu,\"%s_rollups\":%llu,\"%s_blob_objects\":%llu,\"%s_blob_bytes\":%llu,"
        "\"%s_consensus_versions\":%llu,",
        name, static_cast<unsigned long long>(s->parts), name,
        static_cast<unsigned long long>(s->rollups), name,
        static_cast<unsigned long long>(s->parts + s->rollups + s->other), name,
        static_cast<unsigned long long>(s->bytes), name,
        static_cast<unsigned long long>(s->versions));
  }
  std::printf(
      "\"gc_seconds\":%.3f,\"gc_parts_deleted\":%llu,\"gc_orphans_deleted\":%llu,"
      "\"gc_rollups_deleted\":%llu,\"gc_versions_truncated\":%llu,\"gc_parts_live\":%llu}\n",
      f.gc_seconds, static_cast<unsigned long long>(f.gc.parts_deleted),
      static_cast<unsigned long long>(f.gc.orphans_deleted),
      static_cast<unsigned long long>(f.gc.rollups_deleted),
      static_cast<unsigned long long>(f.gc.versions_truncated),
      static_cast<unsigned long long>(f.gc.parts_live));
}

void print_table(const Figures& f) {
  const ConsensusCounts& c = f.consensus;
  std::printf(
      "%llu one-record appends                 %.0f appends/s (%.1f s: %.1f s building "
      "batches, %.1f s in compare_and_append); background compaction %s\n",
      static_cast<unsigned long long>(f.appends), f.appends_per_s, f.append_seconds,
      f.build_seconds, f.cas_seconds, f.background_compaction ? "on" : "off");
  std::printf("append (batch + compare_and_append)  p50 %.3f ms  p99 %.3f ms\n", f.append_p50_ms,
              f.append_p99_ms);
  std::printf(
      "compare_and_append alone             p50 %.3f ms  p99 %.3f ms  (%llu lost races "
      "retried)\n",
      f.cas_p50_ms, f.cas_p99_ms, static_cast<unsigned long long>(f.append_mismatches));
  std::string trail;
  for (const auto& [made, batches] : f.batches_at) {
    trail += " " + std::to_string(made) + ":" + std::to_string(batches);
  }
  std::printf(
      "batches after N appends             %s  (every %llu appends: mean %.1f, most %llu after "
      "%llu)\n",
      trail.c_str(), static_cast<unsigned long long>(kSampleEvery), f.batches_mean,
      static_cast<unsigned long long>(f.batches_max),
      static_cast<unsigned long long>(f.batches_max_at));
  std::printf(
      "batches / parts at the end           %llu / %llu; compactor stopped in %.3f s; after "
      "compact() %llu / %llu (%llu merges, %.3f s)\n",
      static_cast<unsigned long long>(f.at_end.batches),
      static_cast<unsigned long long>(f.at_end.parts), f.compactor_stop_seconds,
      static_cast<unsigned long long>(f.after_compact.batches),
      static_cast<unsigned long long>(f.after_compact.parts),
      static_cast<unsigned long long>(f.final_compaction.merges), f.compact_seconds);
  std::printf(
      "bytes per append CaS                 mean %.1f  max %llu (append %llu)  first %llu "
      "mean %.1f  last %llu mean %.1f\n",
      f.append_cas_mean, static_cast<unsigned long long>(f.append_cas_max),
      static_cast<unsigned long long>(f.append_cas_max_at),
      static_cast<unsigned long long>(std::min(kWindow, f.appends)), f.append_cas_first_mean,
      static_cast<unsigned long long>(std::min(kWindow, f.appends)), f.append_cas_last_mean);
  std::printf(
      "other CaS (compactor, heartbeats)    %llu, mean %.1f bytes, max %llu; all CaS %llu, "
      "mean %.1f bytes; %llu lost races\n",
      static_cast<unsigned long long>(c.other_cas), mean(c.other_cas_bytes, c.other_cas),
      static_cast<unsigned long long>(c.other_cas_max_bytes),
      static_cast<unsigned long long>(c.cas_committed), mean(c.cas_bytes, c.cas_committed),
      static_cast<unsigned long long>(c.cas_mismatched));
  std::printf(
      "blob writes during the appends       %llu parts (%.1f MiB), %llu rollups (%.1f MiB), "
      "%llu removes; seqno %llu\n",
      static_cast<unsigned long long>(f.blob.part_sets), f.blob.part_bytes / 1048576.0,
      static_cast<unsigned long long>(f.blob.rollup_sets), f.blob.rollup_bytes / 1048576.0,
      static_cast<unsigned long long>(f.blob.removes),
      static_cast<unsigned long long>(f.seqno_at_end));
  for (const auto& [name, run] :
       {std::pair{"this process", &f.open_here}, std::pair{"child process", &f.open_child}}) {
    std::printf(
        "open + inspect, %-13s        %.2f ms (%llu heads, %llu scans, %llu versions read; "
        "%llu blob gets, %llu bytes)\n",
        name, run->open_seconds * 1e3, static_cast<unsigned long long>(run->open_consensus.heads),
        static_cast<unsigned long long>(run->open_consensus.scans),
        static_cast<unsigned long long>(run->open_consensus.versions_read),
        static_cast<unsigned long long>(run->open_blob.gets),
        static_cast<unsigned long long>(run->open_blob.get_bytes));
  }
  std::printf("child process, spawn to exit         %.2f ms\n", f.open_child.process_seconds * 1e3);
  for (const auto& [name, run] :
       {std::pair{"this process", &f.open_here}, std::pair{"child process", &f.open_child}}) {
    std::printf("snapshot at upper - 1, %-13s %llu rows in %.3f s, %.0f rows/s\n", name,
                static_cast<unsigned long long>(run->snapshot_rows), run->snapshot_seconds,
                run->snapshot_seconds > 0 ? run->snapshot_rows / run->snapshot_seconds : 0);
  }
  for (const auto& [name, s] : {std::pair{"before GC", &f.before_gc}, {"after GC", &f.after_gc}}) {
    std::printf(
        "%-9s                            %llu blob objects (%llu parts, %llu rollups), %.1f "
        "MiB; %llu consensus versions\n",
        name, static_cast<unsigned long long>(s->parts + s->rollups + s->other),
        static_cast<unsigned long long>(s->parts), static_cast<unsigned long long>(s->rollups),
        s->bytes / 1048576.0, static_cast<unsigned long long>(s->versions));
  }
  std::printf(
      "collect_garbage                      %.3f s: %llu parts deleted, %llu orphans, %llu "
      "rollups, %llu versions truncated, %llu parts live\n",
      f.gc_seconds, static_cast<unsigned long long>(f.gc.parts_deleted),
      static_cast<unsigned long long>(f.gc.orphans_deleted),
      static_cast<unsigned long long>(f.gc.rollups_deleted),
      static_cast<unsigned long long>(f.gc.versions_truncated),
      static_cast<unsigned long long>(f.gc.parts_live));
}

}  // namespace

int run_bench_compaction(const Globals& globals, const std::vector<std::string>& argv) {
  if (argv.size() == 2 && argv[0] == "compaction-child") return open_child(argv[1]);
  auto args = Args::parse(argv, {"--appends", "--background-compaction", "--dir"}, {"--json"});
  if (!args) return usage_error(args.error().message);
  if (args->positionals() != std::vector<std::string>{"compaction"}) {
    return usage_error(kCompactionUsage);
  }
  std::uint64_t appends = 100'000;
  if (auto v = args->get("--appends")) {
    try {
      std::size_t used = 0;
      appends = std::stoull(*v, &used);
      if (used != v->size() || v->front() == '-') throw std::invalid_argument(*v);
    } catch (...) {
      return usage_error("--appends takes a positive integer, got \"" + *v + "\"");
    }
  }
  if (appends == 0) return usage_error("--appends must be positive");
  bool background_compaction = true;
  if (auto v = args->get("--background-compaction")) {
    if (*v != "on" && *v != "off") return usage_error("--background-compaction takes on or off");
    background_compaction = *v == "on";
  }
  // A fresh scratch directory; under --dir DIR it is kept, so the shard
  // can be inspected (`tidemark bench compaction-child PATH`, PATH the
  // directory it prints).
  auto dir = BenchDirectory::create("compaction", args->get("--dir"));
  if (!dir) return report(dir.error());
  auto figures = run_compaction(dir->path(), appends, background_compaction);
  if (!figures) return report(figures.error());
  const Figures& f = *figures;
  if (args->has("--json")) {
    print_json(f);
  } else {
    print_table(f);
  }
  for (const OpenRun* run : {&f.open_here, &f.open_child}) {
    if (run->snapshot_rows != f.appends ||
        run->snapshot_diffs != static_cast<std::int64_t>(f.appends)) {
      std::fprintf(stderr,
                   "correctness failure: the snapshot holds %llu rows summing to %lld, not the "
                   "%llu records appended\n",
                   static_cast<unsigned long long>(run->snapshot_rows),
                   static_cast<long long>(run->snapshot_diffs),
                   static_cast<unsigned long long>(f.appends));
      return kExitError;
    }
  }
  return kExitOk;
}

}  // namespace tidemark::cli
