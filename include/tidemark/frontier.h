// Frontier: a lower bound on the times that may still change.
//
// Times are u64 and totally ordered, so a frontier is either one time `t`
// (every time >= t may still change; everything < t is final) or closed
// (the empty antichain: nothing will ever change again). Closed is greater
// than every time.
//
// Thread-safety: a plain value type.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>

namespace tidemark {

using Time = std::uint64_t;
using Diff = std::int64_t;

class Frontier {
 public:
  // The frontier at time 0: nothing is final yet.
  constexpr Frontier() : time_(0) {}
  static constexpr Frontier at(Time t) { return Frontier(t); }
  static constexpr Frontier closed() {
    Frontier f;
    f.time_.reset();
    return f;
  }
  static Frontier from_optional(std::optional<Time> t) { return t ? at(*t) : closed(); }

  bool is_closed() const { return !time_.has_value(); }
  // REQUIRES: !is_closed().
  Time time() const { return *time_; }
  std::optional<Time> as_optional() const { return time_; }

  // True when `t` may still change, i.e. t >= this frontier.
  bool includes(Time t) const { return time_.has_value() && t >= *time_; }
  // True when `t` is final: t < this frontier.
  bool is_past(Time t) const { return !includes(t); }

  friend bool operator==(const Frontier&, const Frontier&) = default;
  friend std::strong_ordering operator<=>(const Frontier& a, const Frontier& b) {
    if (a.is_closed() || b.is_closed()) {
      return a.is_closed() == b.is_closed()
                 ? std::strong_ordering::equal
                 : (a.is_closed() ? std::strong_ordering::greater : std::strong_ordering::less);
    }
    return *a.time_ <=> *b.time_;
  }

  // "17" or "closed".
  std::string to_string() const;
  // JSON: a number, or null when closed.
  std::string to_json() const;

 private:
  constexpr explicit Frontier(Time t) : time_(t) {}
  std::optional<Time> time_;
};

// The times a batch covers: [lower, upper), with history below `since`
// possibly compacted. REQUIRES for a valid description: lower <= upper and
// lower is not closed unless upper is.
struct Description {
  Frontier lower;
  Frontier upper;
  Frontier since;

  bool contains(Time t) const { return lower.includes(t) && upper.is_past(t); }
  bool operator==(const Description&) const = default;
  std::string to_string() const;
};

}  // namespace tidemark
