// Helpers for the sink destinations (the SinkDestination interface is
// public: tidemark/sink.h). Implementations: FileDestination (rolling
// files), S3Destination (the same files as S3 objects), KafkaDestination
// (transactional producer plus progress topic).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "tidemark/error.h"
#include "tidemark/frontier.h"
#include "tidemark/memory_pool.h"
#include "tidemark/sink.h"

namespace tidemark {

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
