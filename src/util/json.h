// JSON for NDJSON records, JSON output and small request objects, with no
// dependencies.
//
// Three parts:
//   - parse_record_line reads one NDJSON record line
//     in a single pass. The record's "key" and "value" are kept as their
//     compact JSON text: whitespace outside strings is removed; string
//     contents (escapes included) and number spellings are kept byte for
//     byte. So "a" and "\u0061" are different keys, and so are 1 and 1.0.
//   - append_json_string / append_u64 / append_i64 write JSON output into a
//     caller-owned buffer, for the snapshot, listen and sink writers.
//   - parse_json builds a small JsonValue tree, for configuration and
//     request bodies. It is not meant for bulk data.
//
// Validation follows RFC 8259 strictly: whitespace is only space, tab, LF
// and CR; strings must be valid UTF-8 with no raw control characters (below
// 0x20) and only the standard escapes; \u escapes that encode UTF-16
// surrogates must come as a high/low pair; numbers follow the grammar (no
// leading zeros, "+", ".5", "1.", NaN or Infinity); any number of digits and
// any exponent is accepted, because numbers are kept as text. No byte order
// mark. At most kMaxJsonDepth arrays/objects may be open at once, counting a
// record's own object.
//
// Error messages name a 1-based byte column ("invalid JSON at column 17:
// expected ':'"), or a line and column when the text spans several lines.
// Record messages never name the line number: the caller prefixes it.
//
// Thread-safety: every function here is pure and safe to call from any
// thread; JsonValue is a plain value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tidemark/error.h"
#include "tidemark/frontier.h"

namespace tidemark {

// The most arrays and objects that may be open at once in a parsed text.
inline constexpr int kMaxJsonDepth = 128;

// ---------------------------------------------------------------------------
// Records.

enum class RecordMode {
  // Explicit appends: every record must carry "time".
  kExplicit,
  // Managed appends (through the appender): "time" must be absent.
  kManaged,
};

// One parsed record line.
struct Record {
  std::string key;           // compact JSON text
  std::string value;         // compact JSON text
  std::optional<Time> time;  // set exactly when the mode is kExplicit
  Diff diff = 1;             // "diff" or the default 1; may be 0

  bool operator==(const Record&) const = default;
};

// True when `line` is empty or only JSON whitespace (space, tab, CR, LF).
// Callers that allow blank lines in NDJSON input skip them with this.
bool is_blank_line(std::string_view line);

// Parses one NDJSON record: a JSON object with exactly the fields
//   "key"   any JSON value, required;
//   "value" any JSON value, required;
//   "time"  an integer in [0, 2^64), required in kExplicit and rejected in
//           kManaged. "-0" is rejected: a time is spelled without a sign;
//   "diff"  an integer in [-2^63, 2^63), optional, default 1. "-0" is 0.
// in any order. Integers must be plain JSON integers: no fraction or
// exponent, not quoted. Whitespace (including a trailing CR from CRLF line
// ends) may surround every token. Fields nested inside "key" and "value"
// are not checked for duplicate names: they are kept as written.
//
// Every failure is kInvalidUsage with a message such as
//   empty line                        (is_blank_line(line) holds)
//   invalid JSON at column 17: expected ':'
//   a record must be a JSON object
//   unknown field "foo"  |  duplicate field "key"  |  missing field "value"
//   "time" must be a non-negative integer  |  "diff" must be an integer
//   "time" is out of range (at most 18446744073709551615)
//   "time" is not allowed in a managed append: the appender assigns times
[[nodiscard]] Result<Record> parse_record_line(std::string_view line, RecordMode mode);

// ---------------------------------------------------------------------------
// Writing.

// Appends `text` as a quoted JSON string: '"' and '\' are escaped, so are
// control characters (\b \f \n \r \t, else \u00XX); everything else is
// copied. Bytes that are not well-formed UTF-8 are each replaced by U+FFFD,
// so the output is always valid JSON even for arbitrary bytes.
void append_json_string(std::string* out, std::string_view text);

// Append the decimal form of an integer, which is also its JSON form.
void append_u64(std::string* out, std::uint64_t value);
void append_i64(std::string* out, std::int64_t value);

// ---------------------------------------------------------------------------
// General parsing.

// A parsed JSON value. Numbers keep their text, so no precision is lost and
// the caller decides how to read them (as_u64, as_i64, or std::from_chars).
// Strings are decoded UTF-8 (escapes resolved; "\u0000" gives a NUL byte).
// Object members keep their order; names are unique (parse_json rejects
// duplicates).
class JsonValue {
 public:
  enum class Kind : std::uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<JsonValue>;
  using Object = std::vector<std::pair<std::string, JsonValue>>;

  // null.
  JsonValue() = default;
  static JsonValue from_bool(bool value);
  // REQUIRES: `text` is a JSON number.
  static JsonValue from_number_text(std::string text);
  static JsonValue from_string(std::string text);
  static JsonValue from_array(Array items);
  static JsonValue from_object(Object members);

  Kind kind() const { return static_cast<Kind>(value_.index()); }
  bool is_null() const { return kind() == Kind::kNull; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_number() const { return kind() == Kind::kNumber; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_array() const { return kind() == Kind::kArray; }
  bool is_object() const { return kind() == Kind::kObject; }

  // REQUIRES: is_bool().
  bool as_bool() const { return std::get<bool>(value_); }
  // REQUIRES: is_number(). The number exactly as written.
  const std::string& number_text() const { return std::get<Number>(value_).text; }
  // REQUIRES: is_string().
  const std::string& as_string() const { return std::get<std::string>(value_); }
  // REQUIRES: is_array().
  const Array& as_array() const { return std::get<Array>(value_); }
  // REQUIRES: is_object().
  const Object& as_object() const { return std::get<Object>(value_); }

  // The member named `name`, or nullptr when there is none or this is not
  // an object.
  const JsonValue* find(std::string_view name) const;
  // The text of the string member named `name`, or nullopt when there is
  // none, it is not a string, or this is not an object.
  std::optional<std::string> find_string(std::string_view name) const;

  // The value as an integer, or nullopt when it is not a number, has a
  // fraction or exponent, or does not fit.
  std::optional<std::uint64_t> as_u64() const;
  std::optional<std::int64_t> as_i64() const;

  // Appends the compact JSON text of this value.
  void append_json(std::string* out) const;
  std::string to_json() const;

  friend bool operator==(const JsonValue& a, const JsonValue& b);

 private:
  struct Number {
    std::string text;
  };
  // Alternative order matches Kind.
  std::variant<std::monostate, bool, Number, std::string, Array, Object> value_;
};

// Parses a whole JSON text (any value at the top level, surrounded by
// optional whitespace). Failures are kInvalidUsage: "invalid JSON at ...",
// or duplicate field "name".
[[nodiscard]] Result<JsonValue> parse_json(std::string_view text);

}  // namespace tidemark
