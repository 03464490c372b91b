// TIDEMARK_RANDOM_CONFIG for the integration tests: the drawn configuration
// (shard/random_config.h) a test process runs under, drawn once per process
// so "random" means one fresh seed for the whole run, and printed so a
// failure reruns with TIDEMARK_RANDOM_CONFIG=<seed>.
//
// Thread-safety: random_config() is safe to call from any thread (a
// function-local static, initialized once).
#pragma once

#include <cstdio>
#include <optional>

#include "shard/random_config.h"
#include "util/try.h"

namespace tidemark::testing {

// nullopt when TIDEMARK_RANDOM_CONFIG is unset; InvalidUsage for text that
// is neither a decimal seed nor "random".
inline const Result<std::optional<RandomConfig>>& random_config() {
  static const Result<std::optional<RandomConfig>> config =
      []() -> Result<std::optional<RandomConfig>> {
    TM_ASSIGN(std::optional<std::uint64_t> seed, random_config_seed_from_env());
    if (!seed) return std::optional<RandomConfig>{};
    return std::optional<RandomConfig>{draw_random_config(*seed)};
  }();
  return config;
}

// On stdout, which gtest prints with the test and ctest --output-on-failure
// shows.
inline void print_random_config(const RandomConfig& config, const char* test_binary) {
  std::printf("random configuration %s\n(rerun: %s=%llu %s)\n", config.describe().c_str(),
              kRandomConfigVariable, static_cast<unsigned long long>(config.seed), test_binary);
  std::fflush(stdout);
}

}  // namespace tidemark::testing
