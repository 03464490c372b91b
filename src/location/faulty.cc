#include "location/faulty.h"

#include <thread>
#include <utility>

namespace tidemark {

namespace {

using Fault = FaultInjector::Fault;

std::unexpected<Error> injected(Fault fault, std::string_view operation) {
  if (fault == Fault::kDeterminate) {
    return determinate("injected determinate fault in " + std::string(operation));
  }
  return indeterminate(
      "injected indeterminate fault in " + std::string(operation) +
      (fault == Fault::kIndeterminateApplied ? " (inner call made)" : " (inner call skipped)"));
}

}  // namespace

FaultInjector::FaultInjector(FaultConfig config) : config_(config), random_(config.seed) {}

void FaultInjector::set_config(FaultConfig config) {
  std::lock_guard lock(mutex_);
  config_ = config;
  random_.seed(config.seed);
}

Fault FaultInjector::next(bool mutating) {
  std::chrono::microseconds latency;
  {
    std::lock_guard lock(mutex_);
    latency = config_.latency;
  }
  // Sleep without the lock so concurrent calls overlap their latency.
  if (latency.count() > 0) std::this_thread::sleep_for(latency);

  std::lock_guard lock(mutex_);
  // Draws only when a rate is set, so a fault-free decorator costs a lock.
  if (config_.determinate_rate <= 0 && (!mutating || config_.indeterminate_rate <= 0)) {
    return Fault::kNone;
  }
  double draw = std::uniform_real_distribution<double>(0.0, 1.0)(random_);
  if (draw < config_.determinate_rate) {
    ++determinate_;
    return Fault::kDeterminate;
  }
  if (mutating && draw < config_.determinate_rate + config_.indeterminate_rate) {
    ++indeterminate_;
    return (random_() & 1) != 0 ? Fault::kIndeterminateApplied : Fault::kIndeterminateNotApplied;
  }
  return Fault::kNone;
}

std::uint64_t FaultInjector::injected_determinate() const {
  std::lock_guard lock(mutex_);
  return determinate_;
}

std::uint64_t FaultInjector::injected_indeterminate() const {
  std::lock_guard lock(mutex_);
  return indeterminate_;
}

FaultyBlob::FaultyBlob(std::shared_ptr<Blob> inner, FaultConfig config)
    : ForwardingBlob(std::move(inner)), faults_(config) {}

Result<std::optional<std::string>> FaultyBlob::get(std::string_view key) {
  if (Fault fault = faults_.next(false); fault != Fault::kNone) return injected(fault, "blob get");
  return inner().get(key);
}

Result<std::string> FaultyBlob::get_range(std::string_view key, std::uint64_t offset,
                                          std::uint64_t length) {
  if (Fault fault = faults_.next(false); fault != Fault::kNone) {
    return injected(fault, "blob get_range");
  }
  return inner().get_range(key, offset, length);
}

Status FaultyBlob::set(std::string_view key, std::string_view bytes) {
  Fault fault = faults_.next(true);
  if (fault == Fault::kNone) return inner().set(key, bytes);
  if (fault == Fault::kIndeterminateApplied) (void)inner().set(key, bytes);
  return injected(fault, "blob set");
}

Status FaultyBlob::remove(std::string_view key) {
  Fault fault = faults_.next(true);
  if (fault == Fault::kNone) return inner().remove(key);
  if (fault == Fault::kIndeterminateApplied) (void)inner().remove(key);
  return injected(fault, "blob remove");
}

Status FaultyBlob::remove_many(const std::vector<std::string>& keys) {
  Fault fault = faults_.next(true);
  if (fault == Fault::kNone) return inner().remove_many(keys);
  if (fault == Fault::kIndeterminateApplied) (void)inner().remove_many(keys);
  return injected(fault, "blob remove_many");
}

Status FaultyBlob::list(
    std::string_view prefix,
    const std::function<void(std::string_view key, std::uint64_t size)>& visit) {
  if (Fault fault = faults_.next(false); fault != Fault::kNone) return injected(fault, "blob list");
  return inner().list(prefix, visit);
}

FaultyConsensus::FaultyConsensus(std::shared_ptr<Consensus> inner, FaultConfig config)
    : ForwardingConsensus(std::move(inner)), faults_(config) {}

Result<std::optional<VersionedData>> FaultyConsensus::head(std::string_view key) {
  if (Fault fault = faults_.next(false); fault != Fault::kNone) {
    return injected(fault, "consensus head");
  }
  return inner().head(key);
}

Result<CasOutcome> FaultyConsensus::compare_and_set(std::string_view key,
                                                    std::optional<SeqNo> expected,
                                                    VersionedData next) {
  Fault fault = faults_.next(true);
  if (fault == Fault::kNone) return inner().compare_and_set(key, expected, std::move(next));
  if (fault == Fault::kIndeterminateApplied) {
    (void)inner().compare_and_set(key, expected, std::move(next));
  }
  return injected(fault, "consensus compare_and_set");
}

Result<std::vector<VersionedData>> FaultyConsensus::scan(std::string_view key, SeqNo from,
                                                         std::size_t limit) {
  if (Fault fault = faults_.next(false); fault != Fault::kNone) {
    return injected(fault, "consensus scan");
  }
  return inner().scan(key, from, limit);
}

Result<std::size_t> FaultyConsensus::truncate(std::string_view key, SeqNo seqno) {
  Fault fault = faults_.next(true);
  if (fault == Fault::kNone) return inner().truncate(key, seqno);
  if (fault == Fault::kIndeterminateApplied) (void)inner().truncate(key, seqno);
  return injected(fault, "consensus truncate");
}

}  // namespace tidemark
