// SinkDestination: where a sink's messages go.
//
// A destination receives the diff pairs of one interval of times at a time,
// [lower, upper), between begin(lower) and commit(upper), and makes them
// visible atomically with its progress: after commit(upper) returns OK,
// progress() is upper and a restarted sink reads that same progress back.
// Pairs written after begin() and never committed are never visible as
// output (a file's temporary is deleted; an S3 upload is aborted; a Kafka
// transaction is aborted).
//
// Implementations: FileDestination (rolling files), S3Destination (the
// same files as S3 objects), KafkaDestination (transactional producer plus
// progress topic).
//
// Thread-safety: one sink uses a destination from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "sink/diff_pairs.h"
#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/memory_pool.h"

namespace tidemark {

class SinkDestination {
 public:
  virtual ~SinkDestination() = default;

  // The largest committed upper: every pair at a time below it is
  // committed. nullopt when nothing is committed yet.
  virtual std::optional<Frontier> progress() const = 0;

  // Starts an interval at `lower`. REQUIRES: none open; lower not closed;
  // lower >= progress() when set.
  [[nodiscard]] virtual Status begin(Frontier lower) = 0;
  // Emits the message of one pair. REQUIRES: an interval open; the pair's
  // time >= its lower.
  [[nodiscard]] virtual Status write(const DiffPair& pair) = 0;
  // Bytes emitted into the open interval so far (for rolling).
  virtual std::uint64_t open_bytes() const = 0;
  // Commits the open interval as [lower, upper) together with the progress
  // upper. REQUIRES: upper > every time written, upper > lower, upper not
  // closed. An Indeterminate error means the commit may have happened;
  // progress() then says what this process knows, and a reopened
  // destination reads the truth.
  [[nodiscard]] virtual Status commit(Frontier upper) = 0;

  virtual std::uint64_t primary_key_violations() const = 0;
};

// Reserves a destination's buffer (`what`, for the message) from `pool`,
// waiting up to `wait` for room (none: as long as it takes). Past the wait,
// Full naming the pool: a server's sink then fails and is retried, instead
// of holding a thread of the sinks' pool (and a delete of the sink) until
// other sinks stop. When the pool can never hold it, InvalidUsage.
[[nodiscard]] inline Result<Lease> reserve_for_sink(MemoryPool& pool, std::uint64_t bytes,
                                                    std::optional<std::chrono::milliseconds> wait,
                                                    const std::string& what) {
  auto lease = wait ? pool.reserve_until(bytes, std::chrono::steady_clock::now() + *wait)
                    : pool.reserve(bytes);
  if (lease) return lease;
  std::string message = what + " needs " + std::to_string(bytes) + " bytes of memory pool \"" +
                        pool.name() + "\" (capacity " + std::to_string(pool.capacity()) +
                        " bytes, " + std::to_string(pool.used()) + " in use)";
  if (lease.error().is(ErrorKind::kInvalidUsage)) {
    // A configuration to change, not a wait to retry.
    return invalid_usage(message + ", more than it can ever hold");
  }
  if (wait) {
    message += ", which other sinks held for " + std::to_string(wait->count()) +
               " ms: it starts once they stop, or with more memory";
  }
  return make_error(ErrorKind::kFull, message + " (" + lease.error().message + ")");
}

}  // namespace tidemark
