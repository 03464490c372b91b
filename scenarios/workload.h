// What the scenarios send and check: records named by a number, clients
// that append them over HTTP, and a tracker of which were acknowledged, so
// that after any number of SIGKILLs the shard can be checked exactly.
//
// A record: {"key":"r<id>","value":V}, V a string of `value_bytes`
// characters drawn from a fixed pseudo-random pool at an offset depending
// on the id (or the number id when value_bytes is 0). Every record has
// diff 1 and a key of its own.
//
// Memory: one byte of state per record id, plus each client's request body.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scenarios/scenario.h"

namespace tidemark::scenarios {

// A JSON number field of a small object ("upper", "time", "count"...).
std::optional<std::int64_t> json_integer(std::string_view json, std::string_view field);
// A JSON string field of a small object.
std::optional<std::string> json_string(std::string_view json, std::string_view field);

class RecordShape {
 public:
  explicit RecordShape(std::size_t value_bytes, std::uint64_t seed);
  std::size_t value_bytes() const { return value_bytes_; }
  // The record's NDJSON line, newline included.
  void append_line(std::uint64_t id, std::string& out) const;
  // The value's text as stored (the JSON text: quoted string or number).
  std::string value_text(std::uint64_t id) const;
  bool value_matches(std::uint64_t id, std::string_view value_json) const;

 private:
  std::string_view raw_value(std::uint64_t id) const;
  std::size_t value_bytes_;
  std::string pool_;
};

// What became of each record id.
class Tracker {
 public:
  enum State : std::uint8_t { kUnsent = 0, kInFlight = 1, kAcked = 2 };
  explicit Tracker(std::uint64_t capacity) : states_(capacity) {}
  std::uint64_t capacity() const { return states_.size(); }
  void set(std::uint64_t from, std::uint64_t to, State state) {
    for (auto id = from; id < to; ++id) states_[id].store(state, std::memory_order_relaxed);
  }
  State get(std::uint64_t id) const { return states_[id].load(std::memory_order_relaxed); }
  std::uint64_t count(State state) const;

 private:
  std::vector<std::atomic<State>> states_;
};

// Managed appends from `clients` threads: each takes the next
// `per_request` ids, posts them, and records the answer. Errors (the
// server being killed, restarting) leave those ids in flight (they may or
// may not be in the shard) and the client goes on with new ids after a
// short pause. Runs until `stop` or until the ids (or `byte_goal`) run
// out.
class Ingest {
 public:
  Ingest(Run& run, std::string shard, const RecordShape& shape, Tracker& tracker,
         std::size_t per_request);
  ~Ingest();  // stops and joins

  void start(int clients, std::uint64_t byte_goal);
  void stop();
  void wait();  // until the goal is met (or stop)

  std::uint64_t acked_bytes() const { return acked_bytes_.load(); }
  std::uint64_t acked_records() const { return acked_records_.load(); }
  std::uint64_t errors() const { return errors_.load(); }
  std::uint64_t requests() const { return requests_.load(); }
  // The "time" of the first acknowledged append (the first commit).
  std::int64_t first_time() const { return first_time_.load(); }
  std::string last_error() const;

 private:
  void client_loop();

  Run& run_;
  std::string shard_;
  const RecordShape& shape_;
  Tracker& tracker_;
  std::size_t per_request_;
  std::uint64_t byte_goal_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> next_id_{0};
  std::atomic<std::uint64_t> sent_bytes_{0};
  std::atomic<std::uint64_t> acked_bytes_{0};
  std::atomic<std::uint64_t> acked_records_{0};
  std::atomic<std::uint64_t> errors_{0};
  std::atomic<std::uint64_t> requests_{0};
  std::atomic<std::int64_t> first_time_{INT64_MAX};
  mutable std::mutex mutex_;
  std::string last_error_;
  std::vector<std::thread> threads_;
};

// Tallies of one id per key r<id>: each acknowledged id exactly once,
// each in-flight one at most once, nothing else; fails `run` otherwise
// (naming the first few offenders). `what` names the output checked.
class Audit {
 public:
  Audit(Run& run, const Tracker& tracker, std::string what);
  // One occurrence of the key text r<id> (without quotes); false for a
  // foreign key (already reported).
  bool saw(std::string_view key, std::int64_t copies = 1);
  // Checks the tallies; returns the number of ids present. `complete`:
  // the output should hold every acknowledged record (false for a part of
  // it, where only duplicates and records never sent are errors).
  std::uint64_t finish(bool complete = true);

 private:
  Run& run_;
  const Tracker& tracker_;
  std::string what_;
  std::vector<std::uint8_t> seen_;
  std::uint64_t foreign_ = 0;
};

// Snapshot over HTTP at upper - 1, each line checked against the shape;
// the number of lines (0 with a failure recorded if it could not read).
std::uint64_t audit_snapshot(Run& run, const std::string& shard, const RecordShape& shape,
                             const Tracker& tracker);

// The shard's upper (GET /v1/shards/{name}); nullopt if unreachable.
std::optional<std::int64_t> shard_upper(Run& run, const std::string& shard);
bool create_shard(Run& run, const std::string& shard);

}  // namespace tidemark::scenarios
