#include "util/json.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace tidemark {
namespace {

constexpr bool is_whitespace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
constexpr bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Bytes that stand for themselves inside a JSON string and need no further
// check: printable ASCII (and DEL) other than '"' and '\'.
constexpr std::array<bool, 256> kPlainStringByte = [] {
  std::array<bool, 256> table{};
  for (int c = 0x20; c < 0x80; ++c) table[c] = c != '"' && c != '\\';
  return table;
}();

// The length of the well-formed UTF-8 sequence at `p`, whose first byte is
// >= 0x80, or 0 when it is not well-formed: overlong forms, UTF-16
// surrogates (U+D800..U+DFFF), code points above U+10FFFF, stray
// continuation bytes and sequences cut short by `end` are all rejected
// (Unicode table 3-7).
std::size_t utf8_sequence_length(const unsigned char* p, const unsigned char* end) {
  const unsigned char lead = p[0];
  const auto available = static_cast<std::size_t>(end - p);
  auto continuation = [](unsigned char b) { return (b & 0xC0) == 0x80; };
  if (lead >= 0xC2 && lead <= 0xDF) {
    return available >= 2 && continuation(p[1]) ? 2 : 0;
  }
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (available < 3) return 0;
    const unsigned char low = lead == 0xE0 ? 0xA0 : 0x80;   // not overlong
    const unsigned char high = lead == 0xED ? 0x9F : 0xBF;  // not a surrogate
    return p[1] >= low && p[1] <= high && continuation(p[2]) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (available < 4) return 0;
    const unsigned char low = lead == 0xF0 ? 0x90 : 0x80;   // not overlong
    const unsigned char high = lead == 0xF4 ? 0x8F : 0xBF;  // <= U+10FFFF
    return p[1] >= low && p[1] <= high && continuation(p[2]) && continuation(p[3]) ? 4 : 0;
  }
  return 0;
}

void append_utf8(std::string* out, std::uint32_t code_point) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

int hex_digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string hex_byte(unsigned char byte) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  return {'0', 'x', kDigits[byte >> 4], kDigits[byte & 0xF]};
}

// A field name for an error message: `escaped` is JSON string contents
// (escapes not resolved), shown in quotes and cut to a readable length
// without splitting a UTF-8 sequence.
std::string quoted_name(std::string_view escaped) {
  constexpr std::size_t kLimit = 64;
  std::string out = "\"";
  if (escaped.size() <= kLimit) {
    out.append(escaped);
  } else {
    std::size_t cut = kLimit;
    while (cut > 0 && (static_cast<unsigned char>(escaped[cut]) & 0xC0) == 0x80) --cut;
    out.append(escaped.substr(0, cut));
    out.append("...");
  }
  out.push_back('"');
  return out;
}

enum class RecordField : std::uint8_t { kKey, kValue, kTime, kDiff, kUnknown };

RecordField record_field_named(std::string_view name) {
  if (name == "key") return RecordField::kKey;
  if (name == "value") return RecordField::kValue;
  if (name == "time") return RecordField::kTime;
  if (name == "diff") return RecordField::kDiff;
  return RecordField::kUnknown;
}

constexpr std::string_view kFieldNames[] = {"key", "value", "time", "diff"};

// A single-pass validating scanner over one JSON text. Every scan_* and
// parse_* method returns false on failure, leaving the message in error();
// the first failure ends the parse. Not copyable: it points into the input.
class Parser {
 public:
  // How error messages name a position: a record is one line, so only its
  // column; a general text may span lines.
  enum class Positions : std::uint8_t { kColumn, kLineAndColumn };

  Parser(std::string_view text, Positions positions)
      : data_(text.data()), size_(text.size()), positions_(positions) {}
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  std::string take_error() { return std::move(error_); }

  // Record lines --------------------------------------------------------

  bool parse_record(RecordMode mode, Record* record) {
    skip_whitespace();
    if (peek() != '{') {
      if (starts_value(peek())) return fail_message("a record must be a JSON object");
      return fail(pos_, "expected '{'");
    }
    ++pos_;
    skip_whitespace();
    unsigned seen = 0;
    if (peek() != '}') {
      while (true) {
        if (peek() != '"') return fail(pos_, "expected '\"'");
        const std::size_t name_start = pos_;
        name_.clear();
        if (!scan_string(&name_)) return false;
        const RecordField field = record_field_named(name_);
        if (field == RecordField::kUnknown) {
          return fail_message("unknown field " +
                              quoted_name({data_ + name_start + 1, pos_ - name_start - 2}));
        }
        const unsigned bit = 1u << static_cast<unsigned>(field);
        if (seen & bit) return fail_message(field_message("duplicate field ", field));
        seen |= bit;
        if (field == RecordField::kTime && mode == RecordMode::kManaged) {
          return fail_message(
              "\"time\" is not allowed in a managed append: the appender assigns times");
        }
        skip_whitespace();
        if (peek() != ':') return fail(pos_, "expected ':'");
        ++pos_;
        skip_whitespace();
        switch (field) {
          case RecordField::kKey:
            if (!copy_compact_value(&record->key, 1)) return false;
            break;
          case RecordField::kValue:
            if (!copy_compact_value(&record->value, 1)) return false;
            break;
          case RecordField::kTime: {
            Time time = 0;
            if (!parse_time(&time)) return false;
            record->time = time;
            break;
          }
          case RecordField::kDiff:
            if (!parse_diff(&record->diff)) return false;
            break;
          case RecordField::kUnknown:
            break;
        }
        skip_whitespace();
        const char c = peek();
        if (c == ',') {
          ++pos_;
          skip_whitespace();
          continue;
        }
        if (c == '}') break;
        return fail(pos_, "expected ',' or '}'");
      }
    }
    ++pos_;
    skip_whitespace();
    if (pos_ != size_) return fail(pos_, "unexpected characters after the record");
    for (RecordField required : {RecordField::kKey, RecordField::kValue}) {
      if (!(seen & (1u << static_cast<unsigned>(required)))) {
        return fail_message(field_message("missing field ", required));
      }
    }
    if (mode == RecordMode::kExplicit && !record->time) {
      return fail_message(field_message("missing field ", RecordField::kTime));
    }
    return true;
  }

  // Whole texts ---------------------------------------------------------

  bool parse_document(JsonValue* out) {
    skip_whitespace();
    if (!parse_value(out, 0)) return false;
    skip_whitespace();
    if (pos_ != size_) return fail(pos_, "unexpected characters after the value");
    return true;
  }

 private:
  char peek() const { return pos_ < size_ ? data_[pos_] : '\0'; }

  static bool starts_value(char c) {
    return c == '{' || c == '[' || c == '"' || c == '-' || is_digit(c) || c == 't' || c == 'f' ||
           c == 'n';
  }

  void skip_whitespace() {
    while (pos_ < size_ && is_whitespace(data_[pos_])) ++pos_;
  }

  // Errors --------------------------------------------------------------

  // A syntax error at byte offset `at`.
  bool fail(std::size_t at, std::string_view detail) {
    error_ = "invalid JSON at ";
    const std::string_view text(data_, size_);
    if (positions_ == Positions::kColumn || text.find('\n') == std::string_view::npos) {
      error_ += "column " + std::to_string(at + 1);
    } else {
      const std::string_view before = text.substr(0, at);
      const std::size_t line = 1 + std::count(before.begin(), before.end(), '\n');
      const std::size_t last_newline = before.rfind('\n');
      const std::size_t column =
          last_newline == std::string_view::npos ? at + 1 : at - last_newline;
      error_ += "line " + std::to_string(line) + ", column " + std::to_string(column);
    }
    error_ += ": ";
    error_ += detail;
    return false;
  }

  bool fail_message(std::string message) {
    error_ = std::move(message);
    return false;
  }

  static std::string field_message(std::string_view prefix, RecordField field) {
    std::string message(prefix);
    message += '"';
    message += kFieldNames[static_cast<int>(field)];
    message += '"';
    return message;
  }

  // Tokens --------------------------------------------------------------

  // REQUIRES: peek() == '"'. Validates a string and moves past it; when
  // `decoded` is set, appends the contents with escapes resolved.
  bool scan_string(std::string* decoded) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(data_);
    std::size_t i = pos_ + 1;
    std::size_t run_start = i;
    while (true) {
      while (i < size_ && kPlainStringByte[bytes[i]]) ++i;
      if (i == size_) return fail(pos_, "unterminated string");
      const unsigned char c = bytes[i];
      if (c == '"') break;
      if (c == '\\') {
        if (decoded) decoded->append(data_ + run_start, i - run_start);
        if (!scan_escape(&i, decoded)) return false;
        run_start = i;
      } else if (c < 0x20) {
        return fail(i, "control character " + hex_byte(c) + " must be escaped in a string");
      } else {
        const std::size_t length = utf8_sequence_length(bytes + i, bytes + size_);
        if (length == 0) return fail(i, "invalid UTF-8 in string");
        i += length;
      }
    }
    if (decoded) decoded->append(data_ + run_start, i - run_start);
    pos_ = i + 1;
    return true;
  }

  // REQUIRES: data_[*i] == '\\'. Moves *i past one escape.
  bool scan_escape(std::size_t* i, std::string* decoded) {
    const std::size_t start = *i;
    if (start + 1 >= size_) return fail(pos_, "unterminated string");
    char resolved;
    switch (data_[start + 1]) {
      case '"':
        resolved = '"';
        break;
      case '\\':
        resolved = '\\';
        break;
      case '/':
        resolved = '/';
        break;
      case 'b':
        resolved = '\b';
        break;
      case 'f':
        resolved = '\f';
        break;
      case 'n':
        resolved = '\n';
        break;
      case 'r':
        resolved = '\r';
        break;
      case 't':
        resolved = '\t';
        break;
      case 'u':
        return scan_unicode_escape(i, decoded);
      default: {
        const auto c = static_cast<unsigned char>(data_[start + 1]);
        const std::string shown = (c > 0x20 && c < 0x7F)
                                      ? std::string("'\\") + static_cast<char>(c) + "'"
                                      : "'\\' followed by byte " + hex_byte(c);
        return fail(start, "invalid escape " + shown);
      }
    }
    if (decoded) decoded->push_back(resolved);
    *i = start + 2;
    return true;
  }

  // Reads four hex digits at `at` into *unit.
  bool read_hex4(std::size_t at, std::uint32_t* unit) const {
    if (at + 4 > size_) return false;
    std::uint32_t value = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const int digit = hex_digit_value(data_[at + k]);
      if (digit < 0) return false;
      value = (value << 4) | static_cast<std::uint32_t>(digit);
    }
    *unit = value;
    return true;
  }

  // REQUIRES: data_[*i..] starts with "\u".
  bool scan_unicode_escape(std::size_t* i, std::string* decoded) {
    const std::size_t start = *i;
    std::uint32_t unit = 0;
    if (!read_hex4(start + 2, &unit)) return fail(start, "\\u must be followed by 4 hex digits");
    std::size_t next = start + 6;
    std::uint32_t code_point = unit;
    if (unit >= 0xD800 && unit <= 0xDFFF) {
      std::uint32_t low = 0;
      const bool paired = unit <= 0xDBFF && next + 1 < size_ && data_[next] == '\\' &&
                          data_[next + 1] == 'u' && read_hex4(next + 2, &low) && low >= 0xDC00 &&
                          low <= 0xDFFF;
      if (!paired) {
        return fail(start, "unpaired UTF-16 surrogate " + std::string(data_ + start, 6));
      }
      code_point = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
      next += 6;
    }
    if (decoded) append_utf8(decoded, code_point);
    *i = next;
    return true;
  }

  // REQUIRES: peek() is '-' or a digit. Validates a number and moves past.
  bool scan_number() {
    std::size_t i = pos_;
    if (data_[i] == '-') ++i;
    if (i == size_ || !is_digit(data_[i])) return fail(i, "expected a digit");
    if (data_[i] == '0') {
      ++i;
      if (i < size_ && is_digit(data_[i])) return fail(i, "leading zeros are not allowed");
    } else {
      while (i < size_ && is_digit(data_[i])) ++i;
    }
    if (i < size_ && data_[i] == '.') {
      ++i;
      if (i == size_ || !is_digit(data_[i])) return fail(i, "expected a digit after '.'");
      while (i < size_ && is_digit(data_[i])) ++i;
    }
    if (i < size_ && (data_[i] == 'e' || data_[i] == 'E')) {
      ++i;
      if (i < size_ && (data_[i] == '+' || data_[i] == '-')) ++i;
      if (i == size_ || !is_digit(data_[i])) return fail(i, "expected a digit in the exponent");
      while (i < size_ && is_digit(data_[i])) ++i;
    }
    pos_ = i;
    return true;
  }

  // REQUIRES: peek() is 't', 'f' or 'n'. Moves past true, false or null.
  bool scan_literal(std::string_view* literal) {
    const char c = peek();
    const std::string_view expected = c == 't' ? "true" : (c == 'f' ? "false" : "null");
    if (std::string_view(data_ + pos_, size_ - pos_).substr(0, expected.size()) != expected) {
      return fail(pos_, "expected a value");
    }
    pos_ += expected.size();
    if (literal) *literal = expected;
    return true;
  }

  // Compact copies ------------------------------------------------------

  // Validates the value at pos_ and appends its compact text to `out`.
  // Whitespace between tokens splits the text into runs; each run is
  // appended whole, so a value without whitespace costs one append.
  bool copy_compact_value(std::string* out, int depth) {
    compact_out_ = out;
    run_start_ = pos_;
    if (!copy_value(depth)) return false;
    out->append(data_ + run_start_, pos_ - run_start_);
    return true;
  }

  void skip_whitespace_in_copy() {
    if (pos_ < size_ && is_whitespace(data_[pos_])) {
      compact_out_->append(data_ + run_start_, pos_ - run_start_);
      skip_whitespace();
      run_start_ = pos_;
    }
  }

  // `depth` is the number of arrays and objects around the value.
  bool copy_value(int depth) {
    switch (peek()) {
      case '{':
        if (depth >= kMaxJsonDepth) return fail(pos_, "nesting deeper than 128 levels");
        ++pos_;
        skip_whitespace_in_copy();
        if (peek() == '}') {
          ++pos_;
          return true;
        }
        while (true) {
          if (peek() != '"') return fail(pos_, "expected '\"'");
          if (!scan_string(nullptr)) return false;
          skip_whitespace_in_copy();
          if (peek() != ':') return fail(pos_, "expected ':'");
          ++pos_;
          skip_whitespace_in_copy();
          if (!copy_value(depth + 1)) return false;
          skip_whitespace_in_copy();
          const char c = peek();
          if (c == ',') {
            ++pos_;
            skip_whitespace_in_copy();
          } else if (c == '}') {
            ++pos_;
            return true;
          } else {
            return fail(pos_, "expected ',' or '}'");
          }
        }
      case '[':
        if (depth >= kMaxJsonDepth) return fail(pos_, "nesting deeper than 128 levels");
        ++pos_;
        skip_whitespace_in_copy();
        if (peek() == ']') {
          ++pos_;
          return true;
        }
        while (true) {
          if (!copy_value(depth + 1)) return false;
          skip_whitespace_in_copy();
          const char c = peek();
          if (c == ',') {
            ++pos_;
            skip_whitespace_in_copy();
          } else if (c == ']') {
            ++pos_;
            return true;
          } else {
            return fail(pos_, "expected ',' or ']'");
          }
        }
      case '"':
        return scan_string(nullptr);
      case 't':
      case 'f':
      case 'n':
        return scan_literal(nullptr);
      case '-':
      case '0':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7':
      case '8':
      case '9':
        return scan_number();
      default:
        return fail(pos_, "expected a value");
    }
  }

  // Integers ------------------------------------------------------------

  // Scans a JSON number at pos_ and returns its text in *text, failing with
  // `type_message` unless it is a plain integer (no fraction, no exponent).
  bool scan_integer_text(std::string_view type_message, std::string_view* text) {
    const char c = peek();
    if (c != '-' && !is_digit(c)) {
      if (starts_value(c)) return fail_message(std::string(type_message));
      return fail(pos_, "expected a value");
    }
    const std::size_t start = pos_;
    if (!scan_number()) return false;
    *text = std::string_view(data_ + start, pos_ - start);
    if (text->find_first_of(".eE") != std::string_view::npos) {
      return fail_message(std::string(type_message));
    }
    return true;
  }

  bool parse_time(Time* time) {
    constexpr std::string_view kType = "\"time\" must be a non-negative integer";
    std::string_view text;
    if (!scan_integer_text(kType, &text)) return false;
    if (text.front() == '-') return fail_message(std::string(kType));
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *time);
    if (error != std::errc()) {
      return fail_message("\"time\" is out of range (at most 18446744073709551615)");
    }
    return true;
  }

  bool parse_diff(Diff* diff) {
    constexpr std::string_view kType = "\"diff\" must be an integer";
    std::string_view text;
    if (!scan_integer_text(kType, &text)) return false;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *diff);
    if (error != std::errc()) {
      return fail_message("\"diff\" is out of range (-9223372036854775808 to 9223372036854775807)");
    }
    return true;
  }

  // Trees ---------------------------------------------------------------

  bool parse_value(JsonValue* out, int depth) {
    switch (peek()) {
      case '{': {
        if (depth >= kMaxJsonDepth) return fail(pos_, "nesting deeper than 128 levels");
        ++pos_;
        skip_whitespace();
        JsonValue::Object members;
        if (peek() == '}') {
          ++pos_;
        } else {
          while (true) {
            if (peek() != '"') return fail(pos_, "expected '\"'");
            std::string name;
            if (!scan_string(&name)) return false;
            skip_whitespace();
            if (peek() != ':') return fail(pos_, "expected ':'");
            ++pos_;
            skip_whitespace();
            JsonValue member;
            if (!parse_value(&member, depth + 1)) return false;
            members.emplace_back(std::move(name), std::move(member));
            skip_whitespace();
            const char c = peek();
            if (c == ',') {
              ++pos_;
              skip_whitespace();
            } else if (c == '}') {
              ++pos_;
              break;
            } else {
              return fail(pos_, "expected ',' or '}'");
            }
          }
        }
        if (!check_unique_names(members)) return false;
        *out = JsonValue::from_object(std::move(members));
        return true;
      }
      case '[': {
        if (depth >= kMaxJsonDepth) return fail(pos_, "nesting deeper than 128 levels");
        ++pos_;
        skip_whitespace();
        JsonValue::Array items;
        if (peek() == ']') {
          ++pos_;
        } else {
          while (true) {
            items.emplace_back();
            if (!parse_value(&items.back(), depth + 1)) return false;
            skip_whitespace();
            const char c = peek();
            if (c == ',') {
              ++pos_;
              skip_whitespace();
            } else if (c == ']') {
              ++pos_;
              break;
            } else {
              return fail(pos_, "expected ',' or ']'");
            }
          }
        }
        *out = JsonValue::from_array(std::move(items));
        return true;
      }
      case '"': {
        std::string text;
        if (!scan_string(&text)) return false;
        *out = JsonValue::from_string(std::move(text));
        return true;
      }
      case 't':
      case 'f':
      case 'n': {
        std::string_view literal;
        if (!scan_literal(&literal)) return false;
        *out = literal == "null" ? JsonValue() : JsonValue::from_bool(literal == "true");
        return true;
      }
      default: {
        const char c = peek();
        if (c != '-' && !is_digit(c)) return fail(pos_, "expected a value");
        const std::size_t start = pos_;
        if (!scan_number()) return false;
        *out = JsonValue::from_number_text(std::string(data_ + start, pos_ - start));
        return true;
      }
    }
  }

  // Objects are small (configuration, requests), but a hostile body may
  // hold many members: sort names instead of comparing every pair.
  bool check_unique_names(const JsonValue::Object& members) {
    if (members.size() < 2) return true;
    std::vector<std::string_view> names;
    names.reserve(members.size());
    for (const auto& member : members) names.push_back(member.first);
    std::sort(names.begin(), names.end());
    const auto duplicate = std::adjacent_find(names.begin(), names.end());
    if (duplicate == names.end()) return true;
    std::string escaped;
    append_json_string(&escaped, *duplicate);
    return fail_message("duplicate field " +
                        quoted_name(std::string_view(escaped).substr(1, escaped.size() - 2)));
  }

  const char* data_;
  std::size_t size_;
  Positions positions_;
  std::size_t pos_ = 0;
  std::string error_;
  // A record field name, decoded; reused so short names never allocate.
  std::string name_;
  // The compact copy in progress: its output and the start of the run of
  // input not yet appended.
  std::string* compact_out_ = nullptr;
  std::size_t run_start_ = 0;
};

template <typename Integer>
std::optional<Integer> parse_integer_text(const std::string& text) {
  if (text.find_first_of(".eE") != std::string::npos) return std::nullopt;
  // As for a record's "time", an unsigned integer is spelled without a sign,
  // so "-0" is rejected too.
  if (std::is_unsigned_v<Integer> && !text.empty() && text.front() == '-') return std::nullopt;
  Integer value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

// Records -------------------------------------------------------------------

bool is_blank_line(std::string_view line) {
  for (char c : line) {
    if (!is_whitespace(c)) return false;
  }
  return true;
}

Result<Record> parse_record_line(std::string_view line, RecordMode mode) {
  if (is_blank_line(line)) return invalid_usage("empty line");
  Parser parser(line, Parser::Positions::kColumn);
  Record record;
  if (!parser.parse_record(mode, &record)) return invalid_usage(parser.take_error());
  return record;
}

// Writing -------------------------------------------------------------------

void append_json_string(std::string* out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  out->reserve(out->size() + text.size() + 2);
  out->push_back('"');
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t size = text.size();
  std::size_t run_start = 0;
  std::size_t i = 0;
  while (i < size) {
    const unsigned char c = bytes[i];
    if (kPlainStringByte[c]) {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      if (const std::size_t length = utf8_sequence_length(bytes + i, bytes + size); length != 0) {
        i += length;
        continue;
      }
    }
    out->append(text.data() + run_start, i - run_start);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c >= 0x80) {
          out->append(kReplacement);
        } else {
          const char escape[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
          out->append(escape, sizeof(escape));
        }
    }
    ++i;
    run_start = i;
  }
  out->append(text.data() + run_start, size - run_start);
  out->push_back('"');
}

void append_u64(std::string* out, std::uint64_t value) {
  char buffer[20];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, result.ptr);
}

void append_i64(std::string* out, std::int64_t value) {
  char buffer[20];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, result.ptr);
}

// JsonValue -----------------------------------------------------------------

JsonValue JsonValue::from_bool(bool value) {
  JsonValue result;
  result.value_ = value;
  return result;
}

JsonValue JsonValue::from_number_text(std::string text) {
  JsonValue result;
  result.value_ = Number{std::move(text)};
  return result;
}

JsonValue JsonValue::from_string(std::string text) {
  JsonValue result;
  result.value_.emplace<std::string>(std::move(text));
  return result;
}

JsonValue JsonValue::from_array(Array items) {
  JsonValue result;
  result.value_.emplace<Array>(std::move(items));
  return result;
}

JsonValue JsonValue::from_object(Object members) {
  JsonValue result;
  result.value_.emplace<Object>(std::move(members));
  return result;
}

const JsonValue* JsonValue::find(std::string_view name) const {
  if (!is_object()) return nullptr;
  for (const auto& [member_name, member] : as_object()) {
    if (member_name == name) return &member;
  }
  return nullptr;
}

std::optional<std::string> JsonValue::find_string(std::string_view name) const {
  const JsonValue* member = find(name);
  if (member == nullptr || !member->is_string()) return std::nullopt;
  return member->as_string();
}

std::optional<std::uint64_t> JsonValue::as_u64() const {
  if (!is_number()) return std::nullopt;
  return parse_integer_text<std::uint64_t>(number_text());
}

std::optional<std::int64_t> JsonValue::as_i64() const {
  if (!is_number()) return std::nullopt;
  return parse_integer_text<std::int64_t>(number_text());
}

void JsonValue::append_json(std::string* out) const {
  switch (kind()) {
    case Kind::kNull:
      out->append("null");
      break;
    case Kind::kBool:
      out->append(as_bool() ? "true" : "false");
      break;
    case Kind::kNumber:
      out->append(number_text());
      break;
    case Kind::kString:
      append_json_string(out, as_string());
      break;
    case Kind::kArray: {
      out->push_back('[');
      bool first = true;
      for (const JsonValue& item : as_array()) {
        if (!first) out->push_back(',');
        first = false;
        item.append_json(out);
      }
      out->push_back(']');
      break;
    }
    case Kind::kObject: {
      out->push_back('{');
      bool first = true;
      for (const auto& [name, member] : as_object()) {
        if (!first) out->push_back(',');
        first = false;
        append_json_string(out, name);
        out->push_back(':');
        member.append_json(out);
      }
      out->push_back('}');
      break;
    }
  }
}

std::string JsonValue::to_json() const {
  std::string out;
  append_json(&out);
  return out;
}

bool operator==(const JsonValue& a, const JsonValue& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case JsonValue::Kind::kNull:
      return true;
    case JsonValue::Kind::kBool:
      return a.as_bool() == b.as_bool();
    case JsonValue::Kind::kNumber:
      return a.number_text() == b.number_text();
    case JsonValue::Kind::kString:
      return a.as_string() == b.as_string();
    case JsonValue::Kind::kArray:
      return a.as_array() == b.as_array();
    case JsonValue::Kind::kObject:
      return a.as_object() == b.as_object();
  }
  return false;
}

Result<JsonValue> parse_json(std::string_view text) {
  Parser parser(text, Parser::Positions::kLineAndColumn);
  JsonValue value;
  if (!parser.parse_document(&value)) return invalid_usage(parser.take_error());
  return value;
}

}  // namespace tidemark
