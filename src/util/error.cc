#include "tidemark/error.h"

namespace tidemark {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidUsage:
      return "invalid usage";
    case ErrorKind::kUpperMismatch:
      return "upper mismatch";
    case ErrorKind::kDeterminate:
      return "determinate error";
    case ErrorKind::kIndeterminate:
      return "indeterminate error";
    case ErrorKind::kCorruption:
      return "corruption";
    case ErrorKind::kNotFound:
      return "not found";
    case ErrorKind::kAlreadyExists:
      return "already exists";
    case ErrorKind::kSinceViolation:
      return "since violation";
    case ErrorKind::kNotReady:
      return "not ready";
    case ErrorKind::kClosed:
      return "closed";
    case ErrorKind::kFull:
      return "full";
    case ErrorKind::kTooLarge:
      return "record too large";
    case ErrorKind::kSequenceMismatch:
      return "sequence mismatch";
    case ErrorKind::kLeaseExpired:
      return "lease expired";
    case ErrorKind::kHeld:
      return "held";
  }
  return "unknown error";
}

std::string Error::to_string() const {
  std::string out = error_kind_name(kind);
  out += ": ";
  out += message;
  return out;
}

}  // namespace tidemark
