// Randomized model test: random sequences of compare_and_append calls (one
// and many batches per call, stale and wrong expectations, two writers,
// injected determinate and indeterminate faults in Blob and Consensus)
// checked against a reference multiset model. After every operation the
// snapshot at every complete as_of must equal the model's, and a listen
// over the whole history must reproduce it.
//
// TIDEMARK_MODEL_SEED=N reruns one seed; every failure prints its seed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "location/faulty.h"
#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "shard/test_util.h"
#include "tidemark/client.h"
#include "tidemark/read.h"
#include "tidemark/write.h"

namespace tidemark {
namespace {

using testing::model_at;
using testing::read_listen;
using testing::read_snapshot;

struct Backends {
  std::shared_ptr<FaultyBlob> blob;
  std::shared_ptr<FaultyConsensus> consensus;
};

Backends faulty(std::shared_ptr<Blob> blob, std::shared_ptr<Consensus> consensus) {
  return Backends{std::make_shared<FaultyBlob>(std::move(blob)),
                  std::make_shared<FaultyConsensus>(std::move(consensus))};
}

void run_model(std::uint64_t seed, Backends backends, int operations) {
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (rerun with TIDEMARK_MODEL_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };

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
  options.listen_poll_interval = std::chrono::milliseconds(1);
  Location location{backends.blob, backends.consensus};
  auto admin = *Client::open(location, options);
  ASSERT_TRUE(admin->create_shard("model"));

  // Two writers on separate handles, so each has its own cached state and
  // their appends race for real.
  std::vector<std::shared_ptr<Shard>> shards;
  std::vector<std::unique_ptr<WriteHandle>> writers;
  for (int i = 0; i < 2; ++i) {
    shards.push_back(*(*Client::open(location, options))->open_shard("model"));
    writers.push_back(std::move(*shards.back()->open_writer()));
  }

  std::vector<Update> model;
  Time upper = 0;
  auto set_faults = [&](const FaultConfig& config) {
    backends.blob->set_config(config);
    backends.consensus->set_config(config);
  };

  int committed = 0, mismatches = 0, failed = 0, indeterminate = 0;
  for (int op = 0; op < operations; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    WriteHandle& writer = *writers[uniform(0, 1)];
    Time expected = writer.upper().is_closed() ? upper : writer.upper().time();
    if (chance(0.1)) expected = uniform(0, upper + 2);  // a plainly wrong guess
    Time next = expected + uniform(1, 4);

    faults.seed = seed * 7919 + op;  // set_config reseeds: a fresh draw per operation
    set_faults(faults);
    std::vector<Batch> batches;
    std::vector<Update> appended;
    bool built = true;
    int batch_count = static_cast<int>(uniform(1, 3));
    for (int b = 0; b < batch_count && built; ++b) {
      Time lower = uniform(expected, next - 1);
      Time batch_upper = uniform(lower + 1, next);
      BatchBuilder builder = writer.builder(Frontier::at(lower));
      int n = static_cast<int>(uniform(0, 40));
      for (int i = 0; i < n; ++i) {
        Update u{"k" + std::to_string(uniform(0, 7)), "v" + std::to_string(uniform(0, 3)),
                 uniform(lower, batch_upper - 1), static_cast<Diff>(uniform(0, 5)) - 2};
        if (!builder.add(u.key, u.value, u.time, u.diff)) {
          built = false;
          break;
        }
        appended.push_back(std::move(u));
      }
      if (!built) break;
      auto batch = builder.finish(Frontier::at(batch_upper));
      if (!batch) {
        // Only an injected blob fault may fail a well-formed build.
        ASSERT_TRUE(batch.error().is(ErrorKind::kDeterminate) ||
                    batch.error().is(ErrorKind::kIndeterminate))
            << batch.error().to_string();
        built = false;
        break;
      }
      batches.push_back(std::move(*batch));
    }
    if (!built) {
      set_faults(no_faults);
      ++failed;
      continue;
    }

    // Now and then a storm of indeterminate consensus errors outlasts the
    // machine's own checks, so the caller must retry with its token.
    bool storm = chance(0.05);
    if (storm) {
      FaultConfig heavy = faults;
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
    }
    set_faults(no_faults);
    if (result) {
      ASSERT_EQ(expected, upper) << "an append with a wrong expectation committed";
      model.insert(model.end(), appended.begin(), appended.end());
      upper = next;
      ++committed;
    } else if (result.error().is(ErrorKind::kUpperMismatch)) {
      ASSERT_NE(expected, upper) << result.error().to_string();
      ASSERT_EQ(result.error().current_upper, std::optional<Time>(upper));
      ++mismatches;
    } else {
      ASSERT_TRUE(result.error().is(ErrorKind::kDeterminate)) << result.error().to_string();
      ++failed;
    }

    // The snapshot at the newest and at a few random complete times equals
    // the model's; every complete time is checked at the end.
    Shard& reader = *shards[uniform(0, 1)];
    ASSERT_EQ(*reader.upper(), Frontier::at(upper));
    if (upper > 0) {
      for (Time as_of : {upper - 1, uniform(0, upper - 1), uniform(0, upper - 1)}) {
        auto got = read_snapshot(reader, as_of);
        ASSERT_TRUE(got) << got.error().to_string();
        ASSERT_EQ(*got, model_at(model, as_of)) << "as_of " << as_of;
      }
    }
  }
  for (Time as_of = 0; as_of < upper; ++as_of) {
    auto got = read_snapshot(*shards[0], as_of);
    ASSERT_TRUE(got) << got.error().to_string();
    ASSERT_EQ(*got, model_at(model, as_of)) << "as_of " << as_of;
  }

  // A listen over the whole history yields the model, in time order.
  if (upper > 1) {
    auto listener = shards[0]->listen(0, upper);
    ASSERT_TRUE(listener);
    auto out = read_listen(**listener);
    ASSERT_TRUE(out) << out.error().to_string();
    ASSERT_TRUE(std::is_sorted(out->updates.begin(), out->updates.end(),
                               [](const Update& a, const Update& b) { return a.time < b.time; }));
    std::vector<Update> expected_updates;
    for (const Update& u : model) {
      if (u.time > 0) expected_updates.push_back(u);
    }
    ASSERT_TRUE(consolidate(expected_updates));
    ASSERT_TRUE(consolidate(out->updates));
    ASSERT_EQ(out->updates, expected_updates);
  }
  // Every path was exercised.
  EXPECT_GT(committed, 0);
  EXPECT_GT(mismatches, 0);

  std::printf(
      "seed %llu: %d committed, %d mismatches, %d failed, %d indeterminate to the caller; "
      "injected: %llu determinate, %llu indeterminate\n",
      static_cast<unsigned long long>(seed), committed, mismatches, failed, indeterminate,
      static_cast<unsigned long long>(backends.blob->injected_determinate() +
                                      backends.consensus->injected_determinate()),
      static_cast<unsigned long long>(backends.blob->injected_indeterminate() +
                                      backends.consensus->injected_indeterminate()));
}

std::vector<std::uint64_t> seeds(int count) {
  if (const char* env = std::getenv("TIDEMARK_MODEL_SEED"))
    return {std::strtoull(env, nullptr, 10)};
  std::vector<std::uint64_t> out;
  std::random_device rd;
  std::uint64_t base = (static_cast<std::uint64_t>(rd()) << 32) | rd();
  for (int i = 0; i < count; ++i) out.push_back(base + i);
  return out;
}

TEST(ModelTest, MemoryBackendsWithFaults) {
  // 160 operations take the state past kRollupInterval versions, so reads
  // fold diffs onto a rollup written mid-run.
  for (std::uint64_t seed : seeds(8)) {
    run_model(seed, faulty(std::make_shared<MemBlob>(), std::make_shared<MemConsensus>()), 160);
    if (HasFatalFailure()) return;
  }
}

TEST(ModelTest, FileAndSqliteBackendsWithFaults) {
  for (std::uint64_t seed : seeds(2)) {
    auto dir = std::filesystem::temp_directory_path() / ("tidemark-model-" + std::to_string(seed));
    std::filesystem::remove_all(dir);
    auto blob = open_blob("file://" + (dir / "blob").string());
    auto consensus = open_consensus("sqlite://" + (dir / "consensus.db").string());
    ASSERT_TRUE(blob && consensus);
    run_model(seed, faulty(*blob, *consensus), 40);
    std::filesystem::remove_all(dir);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace tidemark
