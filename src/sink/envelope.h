// Sink messages: diff pairs in the upsert or debezium
// envelope, as file lines (json or csv) or as Kafka key/value.
//
// Keys and values are the JSON text the shard stores, written as is.
// Files, json: upsert {"time": T, "key": K, "value": V} (V null for a
// tombstone); debezium {"time": T, "key": K, "before": B, "after": A}.
// csv: the same columns with a header row, the JSON text of each in a cell
// (quoted as RFC 4180 when it needs to be). A missing side is the cell
// null, the JSON text of null, as in json; an empty cell is never written.
// Kafka: the key's JSON text; upsert value = the after's JSON text or none
// (a tombstone); debezium value = {"before": B, "after": A} (null for a
// missing side).
//
// Upsert and more than one pair for a (key, time) is a primary-key
// violation: counted, and logged to stderr at most once per
// kViolationLogInterval.
//
// Thread-safety: an encoder is used from one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sink/diff_pairs.h"
#include "tidemark/error.h"
#include "tidemark/sink.h"

namespace tidemark {

// Envelope, SinkFormat and their parsers: tidemark/sink.h.

struct KafkaMessage {
  std::string key;
  std::optional<std::string> value;  // nullopt: a tombstone
};

class MessageEncoder {
 public:
  static constexpr std::chrono::seconds kViolationLogInterval{10};

  MessageEncoder(Envelope envelope, SinkFormat format);

  // The csv header row with its newline; empty for json.
  std::string file_header() const;
  // Appends the file line of `pair` (with its newline) to `out`.
  void append_file_line(const DiffPair& pair, std::string* out);
  KafkaMessage kafka_message(const DiffPair& pair);
  // The same into `out`, reusing its strings' capacity (no allocation per
  // message once they have grown).
  void kafka_message(const DiffPair& pair, KafkaMessage* out);

  std::uint64_t primary_key_violations() const { return violations_; }

 private:
  void note_violation(const DiffPair& pair);

  Envelope envelope_;
  SinkFormat format_;
  std::uint64_t violations_ = 0;
  std::chrono::steady_clock::time_point last_log_{};
};

}  // namespace tidemark
