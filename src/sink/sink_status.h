// SinkStatusRecord: how a server's sink is doing, as its runner publishes
// it in the location's Consensus, so that every server sharing the
// location answers for every sink (GET /v1/sinks on any of them), not only
// the one that runs it.
//
// Key: "sink/status/<sink name>" (a sink's name is unique across the
// servers sharing a blob store). The head is the latest record: status
// ("starting", "running", "failed", "done", "stopped"), the last
// error, the committed frontier, and who wrote it (the runner's label, which
// names its address, and its server id) at what wall-clock time.
//
// Written by SinkStatusPublisher, one per running sink: a change of status
// or error is published at once (on the caller's thread, one head read the
// first time and one compare_and_set), a frontier alone at most every
// `frontier_every` (flush() publishes one that waited). Every
// kTruncateEvery-th version truncates those below, so a key keeps a few
// versions. A write that fails is retried at the next publish or flush: the
// record may lag the runner, never the other way round, and readers say
// when it was written.
//
// Thread-safety: SinkStatusPublisher's methods may be called from any
// thread (one mutex; its Consensus calls run outside no other lock).
// Memory: one record per sink.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "tidemark/frontier.h"
#include "tidemark/location.h"

namespace tidemark {

struct SinkStatusRecord {
  std::string status;
  std::optional<std::string> error;
  std::optional<Frontier> frontier;  // none until the runner knows it
  std::string runner;                // "tidemark serve on 127.0.0.1:6875"
  std::string owner;                 // the runner's server id
  std::uint64_t written_at_ms = 0;   // wall clock

  std::string to_json() const;
  // Corruption naming what is wrong.
  [[nodiscard]] static Result<SinkStatusRecord> parse(std::string_view json);
};

std::string sink_status_key(std::string_view sink_name);

// The head record of `sink_name`, or nullopt when none was published.
[[nodiscard]] Result<std::optional<SinkStatusRecord>> read_sink_status(Consensus& consensus,
                                                                       std::string_view sink_name);

class SinkStatusPublisher {
 public:
  static constexpr SeqNo kTruncateEvery = 8;
  static constexpr std::chrono::milliseconds kFrontierEvery{2'000};

  SinkStatusPublisher(std::shared_ptr<Consensus> consensus, std::string sink_name,
                      std::string runner, std::string owner,
                      std::chrono::milliseconds frontier_every = kFrontierEvery);

  // Publishes a new status and error now (with the frontier as last set).
  // The outcome of the write: callers may ignore it, as the next publish
  // or flush retries.
  Status set_status(std::string status, std::optional<std::string> error);
  // Records a status and error without writing them: the next publish or
  // flush does (for callers on threads that must not block).
  void stage_status(std::string status, std::optional<std::string> error);
  // Records the committed frontier; publishes it when the last write is
  // `frontier_every` old, else leaves it to flush().
  void set_frontier(const Frontier& frontier);
  // Publishes what has not landed yet (a frontier held back, a failed
  // write). Cheap when nothing is pending.
  void flush();

 private:
  // Writes the record as it is now; leaves it pending when the write fails.
  Status publish();

  const std::shared_ptr<Consensus> consensus_;
  const std::string key_;
  const std::chrono::milliseconds frontier_every_;
  std::mutex write_mu_;  // one write at a time, in order; taken before mu_
  std::mutex mu_;
  SinkStatusRecord record_;                                          // guarded by mu_
  bool pending_ = false;                                             // guarded by mu_
  std::optional<std::chrono::steady_clock::time_point> last_write_;  // guarded by mu_
  std::optional<SeqNo> seqno_;  // guarded by write_mu_: the head as last seen
  bool seqno_known_ = false;    // guarded by write_mu_
};

}  // namespace tidemark
