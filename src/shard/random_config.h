// RandomConfig: a whole engine configuration drawn from one seed, so tests
// and `tidemark serve` run under knobs nobody picked by hand (part and
// block sizes, uploads in flight, compression, listen buffer, inline parts
// and rollups, background compaction, the appender's batching, injected
// latencies and faults) and any failure reproduces from the printed seed. `tidemark serve` keeps
// background compaction on whatever is drawn: a server has no other
// compactor, and no flag turns it off.
//
// TIDEMARK_RANDOM_CONFIG turns it on: a decimal seed, or `random` for a
// fresh one. Unset, nothing changes.
//
// Every drawn configuration is valid (Client::open and Appender::open take
// it) and meaningful: sizes span from a few KiB (many parts, blocks and
// listen passes) to the defaults and beyond, log-uniformly; injected faults
// are off most of the time and otherwise a few percent, which every caller
// of the engine must handle anyway (the appender retries, an explicit
// append or a read reports the error). The draw depends only on the seed
// (std::mt19937_64, no standard distributions): the same seed gives the
// same configuration on every platform.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "location/faulty.h"
#include "tidemark/appender.h"
#include "tidemark/client.h"
#include "tidemark/error.h"

namespace tidemark {

// The environment variable that asks for a random configuration.
inline constexpr char kRandomConfigVariable[] = "TIDEMARK_RANDOM_CONFIG";

struct RandomConfig {
  ClientOptions client;
  // Only the batching knobs and queue_bytes are drawn; the rest (pool,
  // clock, mismatch policy, retries) are the defaults.
  AppenderOptions appender;
  FaultConfig blob_faults;
  FaultConfig consensus_faults;
  std::uint64_t seed = 0;

  // One line: "seed=N: knob=value ..." with every drawn knob.
  std::string describe() const;
  // Whether any fault (latency or failure) is injected into either backend.
  bool injects_faults() const;
};

[[nodiscard]] RandomConfig draw_random_config(std::uint64_t seed);

// Whether `faults` injects anything (latency or failures): a backend needs
// no FaultyBlob or FaultyConsensus around it otherwise.
[[nodiscard]] bool injects_faults(const FaultConfig& faults);

// A seed as TIDEMARK_RANDOM_CONFIG spells it: decimal digits (fitting in 64
// bits), or "random" for a fresh seed from std::random_device. Anything
// else is InvalidUsage, never silently ignored.
[[nodiscard]] Result<std::uint64_t> parse_random_config_seed(std::string_view text);

// nullopt when TIDEMARK_RANDOM_CONFIG is unset (or empty); else its seed
// (parse_random_config_seed).
[[nodiscard]] Result<std::optional<std::uint64_t>> random_config_seed_from_env();

}  // namespace tidemark
