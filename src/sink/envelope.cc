#include "sink/envelope.h"

#include <cstdio>
#include <string>

#include "util/json.h"

namespace tidemark {
namespace {

// Log lines name the key, but a key can be megabytes long.
constexpr std::size_t kMaxLoggedKeyBytes = 200;

constexpr std::string_view kNull = "null";

std::string_view or_null(const std::optional<std::string_view>& text) {
  return text ? *text : kNull;
}

// A cell as RFC 4180 wants it: quoted, with quotes doubled, when it holds a
// comma, a quote, CR or LF; as is otherwise.
void append_csv_cell(std::string* out, std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) {
    out->append(text);
    return;
  }
  out->push_back('"');
  for (char c : text) {
    if (c == '"') out->push_back('"');
    out->push_back(c);
  }
  out->push_back('"');
}

// The first kMaxLoggedKeyBytes of `key`, cut on a UTF-8 character boundary.
std::string key_for_log(std::string_view key) {
  if (key.size() <= kMaxLoggedKeyBytes) return std::string(key);
  std::size_t end = kMaxLoggedKeyBytes;
  while (end > 0 && (static_cast<unsigned char>(key[end]) & 0xC0) == 0x80) --end;
  std::string out(key.substr(0, end));
  out.append("...");
  return out;
}

}  // namespace

Result<Envelope> parse_envelope(std::string_view text) {
  if (text == "upsert") return Envelope::kUpsert;
  if (text == "debezium") return Envelope::kDebezium;
  return invalid_usage("unknown envelope \"" + std::string(text) +
                       "\": expected upsert or debezium");
}

Result<SinkFormat> parse_sink_format(std::string_view text) {
  if (text == "json") return SinkFormat::kJson;
  if (text == "csv") return SinkFormat::kCsv;
  return invalid_usage("unknown sink format \"" + std::string(text) + "\": expected json or csv");
}

MessageEncoder::MessageEncoder(Envelope envelope, SinkFormat format)
    : envelope_(envelope), format_(format) {}

std::string MessageEncoder::file_header() const {
  if (format_ == SinkFormat::kJson) return {};
  return envelope_ == Envelope::kUpsert ? "time,key,value\n" : "time,key,before,after\n";
}

void MessageEncoder::append_file_line(const DiffPair& pair, std::string* out) {
  note_violation(pair);
  if (format_ == SinkFormat::kJson) {
    out->append("{\"time\":");
    append_u64(out, pair.time);
    out->append(",\"key\":").append(pair.key);
    if (envelope_ == Envelope::kUpsert) {
      out->append(",\"value\":").append(or_null(pair.after));
    } else {
      out->append(",\"before\":").append(or_null(pair.before));
      out->append(",\"after\":").append(or_null(pair.after));
    }
    out->append("}\n");
    return;
  }
  // A time's decimal never needs quoting.
  append_u64(out, pair.time);
  out->push_back(',');
  append_csv_cell(out, pair.key);
  out->push_back(',');
  if (envelope_ == Envelope::kUpsert) {
    append_csv_cell(out, or_null(pair.after));
  } else {
    append_csv_cell(out, or_null(pair.before));
    out->push_back(',');
    append_csv_cell(out, or_null(pair.after));
  }
  out->push_back('\n');
}

KafkaMessage MessageEncoder::kafka_message(const DiffPair& pair) {
  KafkaMessage message;
  kafka_message(pair, &message);
  return message;
}

void MessageEncoder::kafka_message(const DiffPair& pair, KafkaMessage* out) {
  note_violation(pair);
  out->key.assign(pair.key);
  if (envelope_ == Envelope::kUpsert) {
    if (pair.after) {
      if (!out->value) out->value.emplace();
      out->value->assign(*pair.after);
    } else {
      out->value.reset();
    }
    return;
  }
  if (!out->value) out->value.emplace();
  std::string& value = *out->value;
  value.assign("{\"before\":").append(or_null(pair.before));
  value.append(",\"after\":").append(or_null(pair.after)).append("}");
}

void MessageEncoder::note_violation(const DiffPair& pair) {
  // Pairs 1, 2, ... of a group are all the same violation: count the group
  // once, at its second pair.
  if (envelope_ != Envelope::kUpsert || pair.index_in_group != 1) return;
  ++violations_;
  const auto now = std::chrono::steady_clock::now();
  const bool logged_before = last_log_ != std::chrono::steady_clock::time_point{};
  if (logged_before && now - last_log_ < kViolationLogInterval) return;
  last_log_ = now;
  std::fprintf(stderr,
               "tidemark: warning: upsert primary-key violation: key %s has more than one value "
               "at time %llu (%llu violations so far)\n",
               key_for_log(pair.key).c_str(), static_cast<unsigned long long>(pair.time),
               static_cast<unsigned long long>(violations_));
}

}  // namespace tidemark
