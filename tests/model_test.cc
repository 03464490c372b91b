// Randomized model test: random sequences of compare_and_append calls (one
// and many batches per call, stale and wrong expectations, two writers,
// injected determinate and indeterminate faults in Blob and Consensus)
// checked against a reference multiset model. Interleaved with them, under
// the same faults: leased readers opened, downgraded, heartbeated, expired
// and dropped (some with short leases that run out); compaction and garbage
// collection on either handle, with and without the background compactor;
// and a snapshot cursor kept open across several operations.
//
// After every operation, with faults off: the snapshot at every as_of in
// [since, upper) equals the model's, a read below since is a
// SinceViolation, since never moves back, a listen from any time >= since
// reproduces the model's updates after it, and once compaction has run
// the spine holds O(log appends) batches. At the end, with every reader
// and writer gone, garbage collection leaves exactly the parts the final
// state references.
//
// TIDEMARK_MODEL_SEED=N reruns one seed; every failure prints its seed. The
// run is a function of the seed except for timing (leases, background
// threads).
//
// TIDEMARK_RANDOM_CONFIG=N (or `random`) runs under a configuration drawn
// from N (shard/random_config.h): its part, block and listen buffer sizes,
// uploads in flight and compression replace the test's own, and its
// latencies are injected along with the test's faults. The model seeds
// then start from N too (unless TIDEMARK_MODEL_SEED is set), so the one
// number printed reruns the whole test.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "location/faulty.h"
#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "random_config.h"
#include "testing/shard_util.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/write.h"

namespace tidemark {
namespace {

using std::chrono::milliseconds;
using testing::Collection;
using testing::model_at;
using testing::read_cursor;
using testing::read_listen;
using testing::read_snapshot;

struct Backends {
  std::shared_ptr<Blob> inner_blob;  // without faults: what is really stored
  std::shared_ptr<FaultyBlob> blob;
  std::shared_ptr<FaultyConsensus> consensus;
};

Backends faulty(std::shared_ptr<Blob> blob, std::shared_ptr<Consensus> consensus) {
  auto faulty_blob = std::make_shared<FaultyBlob>(blob);
  return Backends{std::move(blob), std::move(faulty_blob),
                  std::make_shared<FaultyConsensus>(std::move(consensus))};
}

// What an operation may fail with under injected faults.
bool is_infrastructure(const Error& error) {
  return error.is(ErrorKind::kDeterminate) || error.is(ErrorKind::kIndeterminate);
}

// The model's collections at every as_of in [from, to), by one sweep over
// `model`, which is sorted by time.
std::vector<Collection> model_series(const std::vector<Update>& model, Time from, Time to) {
  std::vector<Collection> out;
  Collection sums;
  auto next = model.begin();
  for (Time as_of = from; as_of < to; ++as_of) {
    for (; next != model.end() && next->time <= as_of; ++next)
      sums[{next->key, next->value}] += next->diff;
    Collection& at = out.emplace_back(sums);
    std::erase_if(at, [](const auto& entry) { return entry.second == 0; });
  }
  return out;
}

// The spine's bound once compaction has run: sizes grow geometrically from
// the newest batch back, and every append adds at most one batch.
std::uint64_t spine_bound(int committed) {
  return static_cast<std::uint64_t>(2 * std::log2(std::max(committed, 1)) + 4);
}

// A snapshot cursor kept open across operations under a leased reader of
// its own; members in this order so the cursor (and its pin) goes first.
struct HeldCursor {
  std::unique_ptr<ReadHandle> reader;
  std::optional<SnapshotCursor> cursor;
  Time as_of = 0;
  Collection rows;
  std::optional<std::pair<std::string, std::string>> last;
  int operations_left = 0;
};

void run_model(std::uint64_t seed, Backends backends, int operations,
               const std::optional<RandomConfig>& random) {
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (rerun with TIDEMARK_MODEL_SEED=" + std::to_string(seed) +
               (random ? " TIDEMARK_RANDOM_CONFIG=" + std::to_string(random->seed) : "") + ")");
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  auto fatal = [] { return ::testing::Test::HasFatalFailure(); };

  FaultConfig faults;
  faults.determinate_rate = 0.04;
  faults.indeterminate_rate = 0.04;
  faults.seed = seed;
  const FaultConfig no_faults;

  ClientOptions options;
  options.part_target_bytes = uniform(200, 4000);
  options.block_bytes = uniform(64, 1024);
  options.max_uploads_in_flight = uniform(1, 3);
  options.listen_buffer_bytes = uniform(300, 5000);
  options.listen_poll_interval = milliseconds(1);
  // Short enough that a compaction pass whose removal failed under faults
  // is gone by the end, long enough that live writers rarely lapse (only
  // when the heavy faults below fail their heartbeats for the whole lease).
  options.writer_lease = milliseconds(2000);
  options.reader_lease = milliseconds(chance(0.5) ? 1000 : 60'000);
  options.background_compaction = false;  // the admin handle's
  if (random) {
    // Applied after the test's own draws, so a model seed means the same
    // workload with or without a random configuration. The test keeps its leases
    // (short ones run out on purpose; live writers must not lapse), its
    // 1 ms listen poll, and which handles compact in the background (the
    // admin handle never; each writer's by the model seed).
    options.part_target_bytes = random->client.part_target_bytes;
    options.block_bytes = random->client.block_bytes;
    options.max_uploads_in_flight = random->client.max_uploads_in_flight;
    options.zstd_level = random->client.zstd_level;
    options.listen_buffer_bytes = random->client.listen_buffer_bytes;
    options.inline_part_max_bytes = random->client.inline_part_max_bytes;
    options.inline_state_max_bytes = random->client.inline_state_max_bytes;
    options.inline_rollup_max_bytes = random->client.inline_rollup_max_bytes;
  } else if ((seed >> 1) % 2 == 0) {
    // Half the seeds write blob parts only, so their merges and garbage
    // collection move blob objects (inline merges write none). Taken from
    // the seed, not drawn, so a seed's workload is what it was before.
    options.inline_part_max_bytes = 0;
  }
  Location location{backends.blob, backends.consensus};
  auto admin = *Client::open(location, options);
  ASSERT_TRUE(admin->create_shard("model"));

  // Two writers on separate handles, so each has its own cached state and
  // their appends race for real. Each handle runs a background compactor
  // or not.
  std::vector<std::shared_ptr<Shard>> shards;
  std::vector<std::unique_ptr<WriteHandle>> writers;
  std::string background;
  for (int i = 0; i < 2; ++i) {
    ClientOptions handle_options = options;
    handle_options.background_compaction = chance(0.5);
    background += handle_options.background_compaction ? 'B' : '-';
    shards.push_back(*(*Client::open(location, handle_options))->open_shard("model"));
    writers.push_back(std::move(*shards.back()->open_writer()));
  }
  auto some_shard = [&]() -> Shard& { return *shards[uniform(0, 1)]; };

  // Sorted by time: appends only add times at or after the old upper.
  std::vector<Update> model;
  Time upper = 0;
  Frontier last_since = Frontier::at(0);
  // A hold for a reader to move to: at most upper; mostly close to it, so
  // since keeps up and compaction consolidates history; now and then
  // anywhere (often a no-op: holds never move back).
  auto some_since = [&] {
    const Time lowest = chance(0.8) ? upper - std::min<Time>(upper, 4) : 0;
    return Frontier::at(uniform(lowest, upper));
  };
  auto set_faults = [&](const FaultConfig& config) {
    backends.blob->set_config(config);
    backends.consensus->set_config(config);
  };
  // The test's own fault rates (the drawn ones do not replace them), plus
  // the drawn configuration's latencies while faults are on; the checks run
  // without either.
  const auto blob_latency = random ? random->blob_faults.latency : std::chrono::microseconds(0);
  const auto consensus_latency =
      random ? random->consensus_faults.latency : std::chrono::microseconds(0);
  auto inject_faults = [&] {
    FaultConfig config = faults;
    config.latency = blob_latency;
    backends.blob->set_config(config);
    config.latency = consensus_latency;
    backends.consensus->set_config(config);
  };

  int committed = 0, mismatches = 0, failed = 0, indeterminate = 0, lapsed = 0;
  std::uint64_t merges = 0, gc_deleted = 0, truncations = 0;
  int readers_opened = 0, readers_expired = 0, cursors_held = 0;
  std::uint64_t snapshots_checked = 0;
  SeqNo final_seqno = 0;

  // --- One compare_and_append, under faults ------------------------------
  auto append = [&](int op) {
    WriteHandle& writer = *writers[uniform(0, 1)];
    Time expected = writer.upper().is_closed() ? upper : writer.upper().time();
    if (chance(0.1)) expected = uniform(0, upper + 2);  // a plainly wrong guess
    Time next = expected + uniform(1, 4);

    faults.seed = seed * 7919 + op;  // set_config reseeds: a fresh draw per operation
    inject_faults();
    std::vector<Batch> batches;
    std::vector<Update> appended;
    int batch_count = static_cast<int>(uniform(1, 3));
    for (int b = 0; b < batch_count; ++b) {
      Time lower = uniform(expected, next - 1);
      Time batch_upper = uniform(lower + 1, next);
      BatchBuilder builder = writer.builder(Frontier::at(lower));
      int n = static_cast<int>(uniform(0, 40));
      for (int i = 0; i < n; ++i) {
        Update u{"k" + std::to_string(uniform(0, 7)), "v" + std::to_string(uniform(0, 3)),
                 uniform(lower, batch_upper - 1), static_cast<Diff>(uniform(0, 5)) - 2};
        if (!builder.add(u.key, u.value, u.time, u.diff)) {
          set_faults(no_faults);
          ++failed;
          return;
        }
        appended.push_back(std::move(u));
      }
      auto batch = builder.finish(Frontier::at(batch_upper));
      if (!batch) {
        // Only an injected blob fault may fail a well-formed build.
        ASSERT_TRUE(is_infrastructure(batch.error())) << batch.error().to_string();
        set_faults(no_faults);
        ++failed;
        return;
      }
      batches.push_back(std::move(*batch));
    }

    // Now and then a storm of indeterminate consensus errors outlasts the
    // machine's own checks, so the caller must retry with its token.
    if (chance(0.05)) {
      FaultConfig heavy = faults;
      heavy.latency = consensus_latency;
      heavy.indeterminate_rate = 0.6;  // and reads fail too, so the machine
      heavy.determinate_rate = 0.6;    // cannot learn the outcome itself
      backends.consensus->set_config(heavy);
    }
    std::string token = "op-" + std::to_string(op);
    auto result =
        writer.compare_and_append(batches, Frontier::at(expected), Frontier::at(next), token);
    if (!result && result.error().is(ErrorKind::kIndeterminate)) {
      ++indeterminate;
      // Retry with the same token until the outcome is known.
      set_faults(no_faults);
      result =
          writer.compare_and_append(batches, Frontier::at(expected), Frontier::at(next), token);
      if (!result && result.error().is(ErrorKind::kIndeterminate)) {
        // The writer that made the first attempt lost its lease, and with
        // it the record that would tell: read the shard. Operations run
        // one at a time, so only this append can have moved the upper.
        auto now = some_shard().upper();
        ASSERT_TRUE(now) << now.error().to_string();
        if (expected == upper && *now == Frontier::at(next)) {
          result = Status{};
        } else {
          ASSERT_EQ(*now, Frontier::at(upper)) << result.error().to_string();
          ++failed;
          return;
        }
      }
    }
    set_faults(no_faults);
    if (result) {
      ASSERT_EQ(expected, upper) << "an append with a wrong expectation committed";
      std::stable_sort(appended.begin(), appended.end(),
                       [](const Update& a, const Update& b) { return a.time < b.time; });
      model.insert(model.end(), appended.begin(), appended.end());
      upper = next;
      ++committed;
    } else if (result.error().is(ErrorKind::kUpperMismatch)) {
      ASSERT_NE(expected, upper) << result.error().to_string();
      ASSERT_EQ(result.error().current_upper, std::optional<Time>(upper));
      ++mismatches;
    } else if (result.error().is(ErrorKind::kLeaseExpired)) {
      // Heavy faults failed the heartbeats too, past the writer's lease:
      // nothing was appended, and the handle registered a writer of a new
      // id for the next append.
      ++lapsed;
    } else {
      ASSERT_TRUE(result.error().is(ErrorKind::kDeterminate)) << result.error().to_string();
      ++failed;
    }
  };

  // --- Readers, compaction and GC, under faults ---------------------------
  // Short leases; some never heartbeat, so they run out. Only these are
  // opened under faults: a hold whose drop failed must lapse by the end.
  std::vector<std::unique_ptr<ReadHandle>> readers;
  auto reader_outcome = [&](const Status& status, std::unique_ptr<ReadHandle>& reader) {
    if (status || is_infrastructure(status.error())) return;
    ASSERT_TRUE(status.error().is(ErrorKind::kNotFound)) << status.error().to_string();
    ++readers_expired;
    reader.reset();  // an expired reader stays expired
  };
  auto some_reader = [&]() -> std::unique_ptr<ReadHandle>* {
    if (readers.empty()) return nullptr;
    return &readers[uniform(0, readers.size() - 1)];
  };
  auto maintain = [&](int op, int action) {
    faults.seed = (seed * 7919 + op) * 31 + action + 1;
    inject_faults();
    switch (uniform(0, 13)) {
      case 0:
      case 1: {
        const ReaderOptions reader_options{milliseconds(uniform(30, 100)), chance(0.5)};
        if (readers.size() >= 6) break;
        auto reader = some_shard().open_reader(reader_options);
        if (!reader) {
          ASSERT_TRUE(is_infrastructure(reader.error())) << reader.error().to_string();
          break;
        }
        readers.push_back(std::move(*reader));
        ++readers_opened;
        break;
      }
      case 2: {
        auto* reader = some_reader();
        if (!reader) break;
        if (chance(0.5) && *reader) reader_outcome((*reader)->expire(), *reader);
        readers.erase(readers.begin() + (reader - readers.data()));  // drops its hold
        break;
      }
      case 3:
      case 4:
      case 5: {
        auto* reader = some_reader();
        const Frontier since = some_since();
        if (reader && *reader) reader_outcome((*reader)->downgrade_since(since), *reader);
        break;
      }
      case 6: {
        auto* reader = some_reader();
        if (reader && *reader) reader_outcome((*reader)->heartbeat(), *reader);
        break;
      }
      case 7:
      case 8:
      case 9: {
        auto compacted = some_shard().compact();
        if (compacted) {
          merges += compacted->merges;
        } else {
          // Faults and latency may outlast the pass's lease: it ends, and
          // a later pass redoes it.
          ASSERT_TRUE(is_infrastructure(compacted.error()) ||
                      compacted.error().is(ErrorKind::kLeaseExpired))
              << compacted.error().to_string();
        }
        break;
      }
      case 10:
      case 11:
      case 12: {
        // Half the time only consensus fails, so passes get as far as
        // truncating it.
        if (chance(0.5)) backends.blob->set_config(no_faults);
        auto collected = some_shard().collect_garbage();
        if (collected) {
          gc_deleted += collected->parts_deleted + collected->orphans_deleted;
          truncations += collected->versions_truncated > 0;
        } else {
          ASSERT_TRUE(is_infrastructure(collected.error())) << collected.error().to_string();
        }
        break;
      }
      case 13:
        std::this_thread::sleep_for(milliseconds(uniform(20, 120)));  // let short leases run out
        break;
    }
    set_faults(no_faults);
  };

  // --- With faults off ----------------------------------------------------
  // Compaction and GC succeed; a pass racing the background compactor's may
  // still lose and be told to retry.
  auto compact_clean = [&](Shard& shard) {
    auto compacted = shard.compact();
    for (int attempt = 0; attempt < 5 && !compacted; ++attempt) {
      ASSERT_TRUE(compacted.error().is(ErrorKind::kDeterminate)) << compacted.error().to_string();
      compacted = shard.compact();
    }
    ASSERT_TRUE(compacted) << compacted.error().to_string();
    merges += compacted->merges;
    auto info = shard.inspect();
    ASSERT_TRUE(info) << info.error().to_string();
    ASSERT_LE(info->batches, spine_bound(committed))
        << "the spine is out of shape after compaction: " << info->to_json();
  };
  auto collect_clean = [&](Shard& shard, GcReport* report = nullptr) {
    auto collected = shard.collect_garbage();
    for (int attempt = 0; attempt < 5 && !collected; ++attempt) {
      ASSERT_TRUE(collected.error().is(ErrorKind::kDeterminate)) << collected.error().to_string();
      collected = shard.collect_garbage();
    }
    ASSERT_TRUE(collected) << collected.error().to_string();
    gc_deleted += collected->parts_deleted + collected->orphans_deleted;
    truncations += collected->versions_truncated > 0;
    if (report) *report = *collected;
  };

  // Every read of the shard agrees with the model. A reader of our own
  // holds since still while we look.
  auto check = [&](Shard& shard, bool listen_from_since) {
    auto holder = shard.open_reader(ReaderOptions{milliseconds(10'000), true});
    ASSERT_TRUE(holder) << holder.error().to_string();
    auto info = shard.inspect();
    ASSERT_TRUE(info) << info.error().to_string();
    ASSERT_EQ(info->upper, Frontier::at(upper));
    ASSERT_LE(last_since, info->since) << "since moved back";
    ASSERT_LE(info->since, info->upper);
    last_since = info->since;
    const Time since = info->since.time();

    std::vector<Collection> expected = model_series(model, since, upper);
    for (Time as_of = since; as_of < upper; ++as_of) {
      auto got = read_snapshot(**holder, as_of);
      ASSERT_TRUE(got) << got.error().to_string() << " as_of " << as_of;
      ASSERT_EQ(*got, expected[as_of - since]) << "as_of " << as_of << " since " << since;
      ++snapshots_checked;
    }
    if (since < upper) {
      const Time as_of = uniform(since, upper - 1);
      auto got = read_snapshot(shard, as_of);
      ASSERT_TRUE(got) << got.error().to_string() << " as_of " << as_of;
      ASSERT_EQ(*got, expected[as_of - since]) << "as_of " << as_of << " since " << since;
    }
    auto not_ready = shard.snapshot(upper);
    ASSERT_FALSE(not_ready);
    ASSERT_TRUE(not_ready.error().is(ErrorKind::kNotReady)) << not_ready.error().to_string();
    if (since > 0) {
      const Time below = uniform(0, since - 1);
      auto compacted = shard.snapshot(below);
      ASSERT_FALSE(compacted) << "a snapshot as of " << below << " below since " << since;
      ASSERT_TRUE(compacted.error().is(ErrorKind::kSinceViolation))
          << compacted.error().to_string();
      auto held = (*holder)->snapshot(below);
      ASSERT_FALSE(held) << "a snapshot as of " << below << " below since " << since;
      ASSERT_TRUE(held.error().is(ErrorKind::kSinceViolation)) << held.error().to_string();
      auto listened = shard.listen(below, upper);
      ASSERT_FALSE(listened) << "a listen from " << below << " below since " << since;
      ASSERT_TRUE(listened.error().is(ErrorKind::kSinceViolation)) << listened.error().to_string();
    }

    // A listen from since (or later) to upper yields the model's updates
    // in (from, upper), in time order: compaction only advanced times at or
    // below since.
    if (since < upper) {
      const Time from = listen_from_since || chance(0.5) ? since : uniform(since, upper - 1);
      auto listener = chance(0.5) ? shard.listen(from, upper) : (*holder)->listen(from, upper);
      ASSERT_TRUE(listener) << listener.error().to_string();
      auto out = read_listen(**listener);
      ASSERT_TRUE(out) << out.error().to_string();
      ASSERT_TRUE(std::is_sorted(out->updates.begin(), out->updates.end(),
                                 [](const Update& a, const Update& b) { return a.time < b.time; }));
      ASSERT_FALSE(out->progress.empty());
      ASSERT_EQ(out->progress.back(), Frontier::at(upper));
      std::vector<Update> expected_updates;
      for (const Update& u : model) {
        if (u.time > from) expected_updates.push_back(u);
      }
      consolidate(expected_updates);
      consolidate(out->updates);
      ASSERT_EQ(out->updates, expected_updates) << "listen from " << from << " since " << since;
    }
  };

  // The held cursor reads a few rows at a time, and its rest once it is
  // due; the rows must equal the model at its as_of however compaction and
  // GC changed the shard meanwhile.
  std::optional<HeldCursor> held;
  auto read_held = [&](int rows) {
    for (int i = 0; i < rows; ++i) {
      auto row = held->cursor->next();
      ASSERT_TRUE(row) << row.error().to_string() << " (held cursor as of " << held->as_of << ")";
      if (!*row) return;
      std::pair<std::string, std::string> kv{std::string((*row)->key), std::string((*row)->value)};
      ASSERT_TRUE(!held->last || *held->last < kv) << "held cursor rows out of order";
      held->last = kv;
      held->rows[kv] = (*row)->diff;
    }
  };
  auto tend_held = [&]() {
    if (!held) {
      if (upper == 0 || !chance(0.15)) return;
      HeldCursor h;
      auto reader = some_shard().open_reader(ReaderOptions{milliseconds(5'000), true});
      ASSERT_TRUE(reader) << reader.error().to_string();
      h.reader = std::move(*reader);
      auto since = h.reader->since();
      ASSERT_TRUE(since) << since.error().to_string();
      if (!since->includes(upper - 1)) return;  // since reached upper: nothing to read
      h.as_of = uniform(since->time(), upper - 1);
      auto cursor = h.reader->snapshot(h.as_of);
      ASSERT_TRUE(cursor) << cursor.error().to_string();
      h.cursor.emplace(std::move(*cursor));
      h.operations_left = static_cast<int>(uniform(2, 10));
      held.emplace(std::move(h));
      ++cursors_held;
      read_held(static_cast<int>(uniform(0, 3)));
      return;
    }
    // Its lease must not lapse under faults; its hold on since may move
    // past the cursor's as_of: the cursor still reads what it started on.
    ASSERT_TRUE(held->reader->heartbeat());
    if (chance(0.5)) {
      ASSERT_TRUE(held->reader->downgrade_since(some_since()));
    }
    read_held(static_cast<int>(uniform(0, 3)));
    if (fatal() || --held->operations_left > 0) return;
    compact_clean(some_shard());
    if (fatal()) return;
    collect_clean(some_shard());
    if (fatal()) return;
    auto rest = read_cursor(*held->cursor);
    ASSERT_TRUE(rest) << rest.error().to_string() << " (held cursor as of " << held->as_of << ")";
    ASSERT_TRUE(rest->empty() || !held->last || *held->last < rest->begin()->first);
    held->rows.merge(*rest);
    ASSERT_EQ(held->rows, model_at(model, held->as_of)) << "held cursor as of " << held->as_of;
    held.reset();
  };

  for (int op = 0; op < operations; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    append(op);
    if (fatal()) return;
    const int actions = static_cast<int>(uniform(0, 2));
    for (int action = 0; action < actions; ++action) {
      maintain(op, action);
      if (fatal()) return;
    }
    tend_held();
    if (fatal()) return;
    if (chance(0.2)) {
      compact_clean(some_shard());
      if (fatal()) return;
      if (chance(0.5)) collect_clean(some_shard());
      if (fatal()) return;
    }
    check(some_shard(), false);
    if (fatal()) return;
  }

  // --- The end, with faults off ------------------------------------------
  while (held) {
    held->operations_left = 1;
    tend_held();
    if (fatal()) return;
  }
  readers.clear();
  check(*shards[0], true);
  if (fatal()) return;
  compact_clean(*shards[0]);
  if (fatal()) return;
  // Writers first (their parts become orphans GC may take), then the
  // handles, which stops their background compactors.
  writers.clear();
  shards.clear();
  auto final_shard = admin->open_shard("model");
  ASSERT_TRUE(final_shard) << final_shard.error().to_string();
  Shard& shard = **final_shard;
  // A compaction pass (or reader) whose removal failed under faults holds
  // until its lease runs out.
  const auto deadline = std::chrono::steady_clock::now() + options.writer_lease + milliseconds(500);
  for (;;) {
    GcReport collected;
    collect_clean(shard, &collected);
    if (fatal()) return;
    auto info = shard.inspect();
    ASSERT_TRUE(info) << info.error().to_string();
    std::uint64_t stored = 0;
    ASSERT_TRUE(backends.inner_blob->list("shard/model/part/",
                                          [&](std::string_view, std::uint64_t) { ++stored; }));
    final_seqno = info->seqno;
    // Every part object is referenced, and every referenced part not held
    // inline in the state is an object.
    const std::uint64_t in_blob = info->parts - info->inline_parts;
    if (stored == in_blob) {
      ASSERT_EQ(collected.parts_live, in_blob);
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << stored << " parts stored, the final state references " << in_blob
        << " in the blob store: " << info->to_json();
    std::this_thread::sleep_for(milliseconds(100));
  }
  check(shard, true);
  if (fatal()) return;

  // Every path was exercised.
  EXPECT_GT(committed, 0);
  EXPECT_GT(mismatches, 0);

  std::printf(
      "seed %llu: %d committed, %d mismatches, %d failed, %d indeterminate to the caller, "
      "%d lapsed; injected: %llu determinate, %llu indeterminate\n",
      static_cast<unsigned long long>(seed), committed, mismatches, failed, indeterminate, lapsed,
      static_cast<unsigned long long>(backends.blob->injected_determinate() +
                                      backends.consensus->injected_determinate()),
      static_cast<unsigned long long>(backends.blob->injected_indeterminate() +
                                      backends.consensus->injected_indeterminate()));
  std::printf(
      "seed %llu: background compaction %s; %llu merges; GC deleted %llu parts, truncated "
      "%llu times; %d readers opened, %d expired; %d cursors held; %llu snapshots checked; "
      "since %s, upper %llu, seqno %llu\n",
      static_cast<unsigned long long>(seed), background.c_str(),
      static_cast<unsigned long long>(merges), static_cast<unsigned long long>(gc_deleted),
      static_cast<unsigned long long>(truncations), readers_opened, readers_expired, cursors_held,
      static_cast<unsigned long long>(snapshots_checked), last_since.to_string().c_str(),
      static_cast<unsigned long long>(upper), static_cast<unsigned long long>(final_seqno));
}

std::vector<std::uint64_t> seeds(int count, const std::optional<RandomConfig>& random) {
  if (const char* env = std::getenv("TIDEMARK_MODEL_SEED"))
    return {std::strtoull(env, nullptr, 10)};
  std::vector<std::uint64_t> out;
  std::random_device rd;
  std::uint64_t base = random ? random->seed : (static_cast<std::uint64_t>(rd()) << 32) | rd();
  for (int i = 0; i < count; ++i) out.push_back(base + i);
  return out;
}

// The configuration TIDEMARK_RANDOM_CONFIG asks for, printed; nullopt
// when it is unset.
std::optional<RandomConfig> announced_random_config() {
  const auto& random = testing::random_config();
  EXPECT_TRUE(random) << random.error().to_string();
  if (!random || !*random) return std::nullopt;
  testing::print_random_config(**random, "model_test");
  return *random;
}

TEST(ModelTest, MemoryBackendsWithFaults) {
  const std::optional<RandomConfig> random = announced_random_config();
  if (HasFailure()) return;
  // 100 operations (each commits a dozen state versions or so: appends,
  // readers, compaction) take the state well past kRollupInterval versions,
  // so reads fold diffs onto rollups written mid-run and GC truncates.
  for (std::uint64_t seed : seeds(8, random)) {
    run_model(seed, faulty(std::make_shared<MemBlob>(), std::make_shared<MemConsensus>()), 100,
              random);
    if (HasFatalFailure()) return;
  }
}

TEST(ModelTest, FileAndSqliteBackendsWithFaults) {
  const std::optional<RandomConfig> random = announced_random_config();
  if (HasFailure()) return;
  for (std::uint64_t seed : seeds(2, random)) {
    auto dir = std::filesystem::temp_directory_path() / ("tidemark-model-" + std::to_string(seed));
    std::filesystem::remove_all(dir);
    auto blob = open_blob("file://" + (dir / "blob").string());
    auto consensus = open_consensus("sqlite://" + (dir / "consensus.db").string());
    ASSERT_TRUE(blob && consensus);
    run_model(seed, faulty(*blob, *consensus), 40, random);
    std::filesystem::remove_all(dir);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace tidemark
