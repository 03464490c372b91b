#include "shard/random_config.h"

#include <cstdio>
#include <cstdlib>
#include <random>

#include "util/number.h"
#include "util/try.h"

namespace tidemark {
namespace {

// Draws from one std::mt19937_64 with arithmetic of our own: the standard
// distributions are implementation-defined, and the seed must mean the
// same configuration everywhere.
class Draw {
 public:
  // The seed is mixed with a tag, so a caller that seeds its own
  // std::mt19937_64 with the same number (a test's workload) does not draw
  // the very same sequence.
  explicit Draw(std::uint64_t seed) : random_(seed ^ 0x7a1de3a4c0f16b5dull) {}

  // Uniform in [lo, hi] (the modulo bias is irrelevant here).
  std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) {
    return lo + random_() % (hi - lo + 1);
  }
  // Uniform in [0, 1), from the top 53 bits.
  double unit() { return static_cast<double>(random_() >> 11) * 0x1.0p-53; }
  bool chance(double p) { return unit() < p; }
  // About log-uniform in [2^lo_exp, 2^hi_exp): a power of two, then a
  // uniform step within it.
  std::uint64_t log_uniform(int lo_exp, int hi_exp) {
    const std::uint64_t power = std::uint64_t{1} << uniform(lo_exp, hi_exp - 1);
    return power + uniform(0, power - 1);
  }

  // Mostly none; a quarter of the time 1-20 ms per call, and, independently
  // each, a 1-5% rate of determinate and of indeterminate failures.
  FaultConfig faults() {
    FaultConfig config;
    if (chance(0.25)) config.latency = std::chrono::microseconds(uniform(1'000, 20'000));
    if (chance(0.25)) config.determinate_rate = 0.01 + 0.04 * unit();
    if (chance(0.25)) config.indeterminate_rate = 0.01 + 0.04 * unit();
    config.seed = random_();
    return config;
  }

 private:
  std::mt19937_64 random_;
};

std::string describe_faults(const char* backend, const FaultConfig& faults) {
  char line[160];
  std::snprintf(line, sizeof line,
                " %s_latency_us=%lld %s_determinate_rate=%.4f %s_indeterminate_rate=%.4f", backend,
                static_cast<long long>(faults.latency.count()), backend, faults.determinate_rate,
                backend, faults.indeterminate_rate);
  return line;
}

}  // namespace

RandomConfig draw_random_config(std::uint64_t seed) {
  Draw draw(seed);
  RandomConfig config;
  config.seed = seed;

  ClientOptions& client = config.client;
  client.part_target_bytes = draw.log_uniform(12, 24);  // 4 KiB .. 16 MiB
  client.block_bytes = draw.log_uniform(9, 18);         // 512 B .. 256 KiB
  client.max_uploads_in_flight = draw.uniform(1, 4);
  client.zstd_level = static_cast<int>(draw.uniform(1, 6));
  client.listen_buffer_bytes = draw.log_uniform(12, 24);  // 4 KiB .. 16 MiB
  client.listen_poll_interval = std::chrono::milliseconds(draw.uniform(1, 100));
  client.background_compaction = draw.chance(0.75);

  AppenderOptions& appender = config.appender;
  appender.queue_bytes = draw.log_uniform(20, 27);       // 1 MiB .. 128 MiB
  appender.batch_max_bytes = draw.log_uniform(12, 24);   // 4 KiB .. 16 MiB
  appender.batch_max_records = draw.log_uniform(3, 17);  // 8 .. 128 Ki
  appender.batch_appends = draw.chance(0.75);
  appender.batch_linger = std::chrono::milliseconds(draw.chance(0.2) ? 0 : draw.uniform(1, 20));

  config.blob_faults = draw.faults();
  config.consensus_faults = draw.faults();

  // Drawn last, so a seed keeps the knobs above.
  client.inline_part_max_bytes = draw.chance(0.25) ? 0 : draw.log_uniform(6, 13);  // 64 B .. 8 KiB
  client.inline_state_max_bytes = draw.log_uniform(12, 20);                        // 4 KiB .. 1 MiB
  client.inline_rollup_max_bytes =
      draw.chance(0.25) ? 0 : draw.log_uniform(10, 22);  // 1 KiB .. 4 MiB
  client.spine_fanout = draw.uniform(2, 8);
  return config;
}

std::string RandomConfig::describe() const {
  char line[768];
  std::snprintf(
      line, sizeof line,
      "seed=%llu: part_target_bytes=%llu block_bytes=%zu max_uploads_in_flight=%zu zstd_level=%d "
      "listen_buffer_bytes=%llu listen_poll_ms=%lld background_compaction=%s "
      "appender_queue_bytes=%llu batch_max_bytes=%llu batch_max_records=%zu batch_appends=%s "
      "batch_linger_ms=%lld inline_part_max_bytes=%llu inline_state_max_bytes=%llu "
      "inline_rollup_max_bytes=%llu spine_fanout=%llu",
      static_cast<unsigned long long>(seed),
      static_cast<unsigned long long>(client.part_target_bytes), client.block_bytes,
      client.max_uploads_in_flight, client.zstd_level,
      static_cast<unsigned long long>(client.listen_buffer_bytes),
      static_cast<long long>(client.listen_poll_interval.count()),
      client.background_compaction ? "on" : "off",
      static_cast<unsigned long long>(appender.queue_bytes),
      static_cast<unsigned long long>(appender.batch_max_bytes), appender.batch_max_records,
      appender.batch_appends ? "on" : "off", static_cast<long long>(appender.batch_linger.count()),
      static_cast<unsigned long long>(client.inline_part_max_bytes),
      static_cast<unsigned long long>(client.inline_state_max_bytes),
      static_cast<unsigned long long>(client.inline_rollup_max_bytes),
      static_cast<unsigned long long>(client.spine_fanout));
  return line + describe_faults("blob", blob_faults) +
         describe_faults("consensus", consensus_faults);
}

bool injects_faults(const FaultConfig& faults) {
  return faults.latency.count() > 0 || faults.determinate_rate > 0 || faults.indeterminate_rate > 0;
}

bool RandomConfig::injects_faults() const {
  return tidemark::injects_faults(blob_faults) || tidemark::injects_faults(consensus_faults);
}

Result<std::uint64_t> parse_random_config_seed(std::string_view text) {
  if (text == "random") {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) | device();
  }
  auto seed = parse_decimal(text);
  if (!seed) {
    return invalid_usage(std::string(kRandomConfigVariable) +
                         " takes a decimal seed or \"random\", got \"" + std::string(text) + "\"");
  }
  return *seed;
}

Result<std::optional<std::uint64_t>> random_config_seed_from_env() {
  const char* text = std::getenv(kRandomConfigVariable);
  if (text == nullptr || *text == '\0') return std::optional<std::uint64_t>{};
  TM_ASSIGN(std::uint64_t seed, parse_random_config_seed(text));
  return std::optional<std::uint64_t>{seed};
}

}  // namespace tidemark
