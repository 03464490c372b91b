// Error: what kind of failure happened, as a value.
//
// Every operation a caller must be able to handle returns Result<T>, a
// std::expected<T, Error>. No exception crosses the public API. The kinds
// follow how a caller must react:
//   - InvalidUsage: the caller broke a documented rule; retrying won't help.
//   - UpperMismatch: a lost race on a shard's upper; `expected` and `current`
//     say which frontier the caller assumed and which one it found.
//   - Determinate: an infrastructure failure that certainly did not apply.
//   - Indeterminate: an infrastructure failure that may have applied (e.g. a
//     timeout after the request was sent). Retry idempotently.
//   - Corruption: stored data failed validation; the message names the object.
//   - NotFound / AlreadyExists: the named thing is absent / already present.
//   - SinceViolation: a read below the shard's since (history compacted away).
//   - NotReady: a read at a time that is not yet complete (>= upper), or a
//     wait that gave up.
//   - Closed: the appender (or other queue) no longer accepts work.
//   - Full: a bounded queue has no room now; wait for capacity and retry.
//   - TooLarge: a record that can never fit the budget it must fit in.
//   - LeaseExpired: a writer's lease ran out (its process paused or was cut
//     off past it): the call was not applied; the handle has registered
//     again, so a retry with batches built anew succeeds.
//   - SequenceMismatch: an idempotent producer's records do not continue
//     what the shard has committed for it (some are committed already, or
//     some before them are missing).
//   - Held: someone else holds what only one may hold at a time (a data
//     directory, a sink, a sink's destination); the message names the
//     holder. Retry once it is gone.
//
// Thread-safety: Error is a plain value type.
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <utility>

namespace tidemark {

enum class ErrorKind : std::uint8_t {
  kInvalidUsage,
  kUpperMismatch,
  kDeterminate,
  kIndeterminate,
  kCorruption,
  kNotFound,
  kAlreadyExists,
  kSinceViolation,
  kNotReady,
  kClosed,
  kFull,
  kTooLarge,
  kSequenceMismatch,
  kLeaseExpired,
  kHeld,
};

const char* error_kind_name(ErrorKind kind);

struct Error {
  ErrorKind kind;
  std::string message;
  // Set only for kUpperMismatch: the upper the caller expected and the one
  // the shard has. nullopt means the closed frontier.
  std::optional<std::uint64_t> expected_upper;
  std::optional<std::uint64_t> current_upper;

  // "kind: message", for logs and the command line.
  std::string to_string() const;

  bool is(ErrorKind k) const { return kind == k; }
};

template <typename T>
using Result = std::expected<T, Error>;

// A Result with no value, for operations that only succeed or fail.
using Status = std::expected<void, Error>;

inline std::unexpected<Error> make_error(ErrorKind kind, std::string message) {
  return std::unexpected(Error{kind, std::move(message), std::nullopt, std::nullopt});
}

inline std::unexpected<Error> invalid_usage(std::string message) {
  return make_error(ErrorKind::kInvalidUsage, std::move(message));
}
inline std::unexpected<Error> corruption(std::string message) {
  return make_error(ErrorKind::kCorruption, std::move(message));
}
inline std::unexpected<Error> determinate(std::string message) {
  return make_error(ErrorKind::kDeterminate, std::move(message));
}
inline std::unexpected<Error> indeterminate(std::string message) {
  return make_error(ErrorKind::kIndeterminate, std::move(message));
}

}  // namespace tidemark
