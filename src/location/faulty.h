// FaultyBlob and FaultyConsensus: decorators that inject latency and
// failures into a wrapped Blob or Consensus, the way LevelDB's tests wrap
// its Env, so tests and benchmarks exercise the engine's error handling
// without touching it.
//
// Every call first sleeps `latency`. Then one uniform draw u in [0, 1)
// decides the outcome:
//   - u < determinate_rate: a Determinate error, without calling the inner
//     backend;
//   - else, for mutating calls only (Blob set/remove, Consensus
//     compare_and_set/truncate), u < determinate_rate + indeterminate_rate:
//     an Indeterminate error. A second draw decides, half the time each,
//     whether the inner call is made first (its result discarded), so
//     "maybe applied" really is maybe;
//   - else the call is forwarded.
// Reads never get indeterminate faults. Injected messages say "injected".
// The outcomes are a deterministic function of `seed` and the order of
// calls; set_config restarts the sequence from the new seed.
//
// Both derive from the forwarding decorators (forwarding.h): the batched
// consensus calls keep Consensus's defaults, so each single call of a
// batch draws its own fault.
//
// Thread-safety: safe for concurrent use from many threads when the inner
// backend is. set_config may be called at any time; each call uses the
// configuration current when it starts.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "location/forwarding.h"
#include "tidemark/location.h"

namespace tidemark {

struct FaultConfig {
  std::chrono::microseconds latency{0};
  double determinate_rate = 0;    // in [0, 1]
  double indeterminate_rate = 0;  // in [0, 1]; mutating calls only
  std::uint64_t seed = 0;
};

// The shared decision procedure of both decorators.
class FaultInjector {
 public:
  enum class Fault : std::uint8_t {
    kNone,
    kDeterminate,
    kIndeterminateNotApplied,
    kIndeterminateApplied,  // call the inner backend, then report Indeterminate
  };

  explicit FaultInjector(FaultConfig config);
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  void set_config(FaultConfig config);

  // Sleeps the configured latency, then draws the fault for one call.
  [[nodiscard]] Fault next(bool mutating);

  std::uint64_t injected_determinate() const;
  std::uint64_t injected_indeterminate() const;

 private:
  mutable std::mutex mutex_;
  FaultConfig config_;               // guarded by mutex_
  std::mt19937_64 random_;           // guarded by mutex_
  std::uint64_t determinate_ = 0;    // guarded by mutex_
  std::uint64_t indeterminate_ = 0;  // guarded by mutex_
};

class FaultyBlob : public ForwardingBlob {
 public:
  // REQUIRES: inner != nullptr.
  explicit FaultyBlob(std::shared_ptr<Blob> inner, FaultConfig config = {});

  [[nodiscard]] Result<std::optional<std::string>> get(std::string_view key) override;
  [[nodiscard]] Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                              std::uint64_t length) override;
  [[nodiscard]] Status set(std::string_view key, std::string_view bytes) override;
  [[nodiscard]] Status remove(std::string_view key) override;
  // One fault decision for the batch, then the inner blob's own batched
  // delete (an S3 blob's one request), never single removes.
  [[nodiscard]] Status remove_many(const std::vector<std::string>& keys) override;
  [[nodiscard]] Status list(
      std::string_view prefix,
      const std::function<void(std::string_view key, std::uint64_t size)>& visit) override;

  void set_config(FaultConfig config) { faults_.set_config(config); }
  std::uint64_t injected_determinate() const { return faults_.injected_determinate(); }
  std::uint64_t injected_indeterminate() const { return faults_.injected_indeterminate(); }

 private:
  FaultInjector faults_;
};

class FaultyConsensus : public ForwardingConsensus {
 public:
  // REQUIRES: inner != nullptr.
  explicit FaultyConsensus(std::shared_ptr<Consensus> inner, FaultConfig config = {});

  [[nodiscard]] Result<std::optional<VersionedData>> head(std::string_view key) override;
  [[nodiscard]] Result<CasOutcome> compare_and_set(std::string_view key,
                                                   std::optional<SeqNo> expected,
                                                   VersionedData next) override;
  [[nodiscard]] Result<std::vector<VersionedData>> scan(std::string_view key, SeqNo from,
                                                        std::size_t limit) override;
  [[nodiscard]] Result<std::size_t> truncate(std::string_view key, SeqNo seqno) override;

  void set_config(FaultConfig config) { faults_.set_config(config); }
  std::uint64_t injected_determinate() const { return faults_.injected_determinate(); }
  std::uint64_t injected_indeterminate() const { return faults_.injected_indeterminate(); }

 private:
  FaultInjector faults_;
};

}  // namespace tidemark
