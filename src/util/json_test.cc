#include "util/json.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "util/size.h"

namespace tidemark {
namespace {

Record parse_ok(std::string_view line, RecordMode mode = RecordMode::kExplicit) {
  auto record = parse_record_line(line, mode);
  EXPECT_TRUE(record.has_value()) << line << " -> " << record.error().message;
  return record ? *record : Record{};
}

// The message of the error `line` is rejected with, or "<accepted>".
std::string rejection(std::string_view line, RecordMode mode = RecordMode::kExplicit) {
  auto record = parse_record_line(line, mode);
  if (record) return "<accepted>";
  EXPECT_EQ(record.error().kind, ErrorKind::kInvalidUsage);
  return record.error().message;
}

std::string json_rejection(std::string_view text) {
  auto value = parse_json(text);
  if (value) return "<accepted>";
  EXPECT_EQ(value.error().kind, ErrorKind::kInvalidUsage);
  return value.error().message;
}

std::string json_quoted(std::string_view text) {
  std::string out;
  append_json_string(&out, text);
  return out;
}

// A record whose value is `value`, placed at column 27.
constexpr std::string_view kValuePrefix = R"({"time":1,"key":1,"value":)";
constexpr int kValueColumn = 27;
std::string line_with_value(std::string_view value) {
  return std::string(kValuePrefix) + std::string(value) + "}";
}

// --- parse_record_line: accepted input -----------------------------------

TEST(ParseRecordLine, TypicalLine) {
  Record record =
      parse_ok(R"({"key": "user-123", "value": {"name": "x", "n": 5}, "time": 17, "diff": 1})");
  EXPECT_EQ(record.key, R"("user-123")");
  EXPECT_EQ(record.value, R"({"name":"x","n":5})");
  EXPECT_EQ(record.time, 17u);
  EXPECT_EQ(record.diff, 1);
}

TEST(ParseRecordLine, RemovesWhitespaceOutsideStringsOnly) {
  Record record = parse_ok(
      "{ \"key\" :\t[ 1 , 2,\r{ \"a b\" : \"x  y\" } , [ ] , { } ] ,"
      " \"value\" : \" spaced \\t out \" , \"time\":0}");
  EXPECT_EQ(record.key, R"([1,2,{"a b":"x  y"},[],{}])");
  EXPECT_EQ(record.value, R"(" spaced \t out ")");
}

TEST(ParseRecordLine, KeepsEscapesAndNumberSpellingsVerbatim) {
  const std::string escaped = R"("a\u0041\n\"\\\/\uD83D\uDE00\u00E9")";
  Record record = parse_ok(line_with_value(escaped));
  EXPECT_EQ(record.value, escaped);

  const std::string numbers = "[1.50E+03,-0,0.0e-0,1e999999,123456789012345678901234567890,-1E-7]";
  EXPECT_EQ(parse_ok(line_with_value(numbers)).value, numbers);
  EXPECT_EQ(parse_ok(line_with_value("[true,false,null]")).value, "[true,false,null]");
  // Different spellings are different keys: nothing is normalized.
  EXPECT_NE(parse_ok(R"({"key":"a","value":1,"time":1})").key,
            parse_ok(R"({"key":"\u0061","value":1,"time":1})").key);
}

TEST(ParseRecordLine, ScalarKeysAndValues) {
  Record record = parse_ok(R"({"key":5,"value":null,"time":1})");
  EXPECT_EQ(record.key, "5");
  EXPECT_EQ(record.value, "null");
}

TEST(ParseRecordLine, FieldsInAnyOrderAndDiffDefaultsToOne) {
  Record record = parse_ok(R"({"time":3,"value":"v","key":"k"})");
  EXPECT_EQ(record, (Record{R"("k")", R"("v")", 3, 1}));
  EXPECT_EQ(parse_ok(R"({"diff":-4,"value":"v","key":"k","time":3})").diff, -4);
  EXPECT_EQ(parse_ok(R"({"diff":0,"value":"v","key":"k","time":3})").diff, 0);
}

TEST(ParseRecordLine, ManagedModeHasNoTime) {
  Record record = parse_ok(R"({"key":"k","value":"v","diff":2})", RecordMode::kManaged);
  EXPECT_EQ(record.time, std::nullopt);
  EXPECT_EQ(record.diff, 2);
}

TEST(ParseRecordLine, FieldNamesMayBeEscaped) {
  Record record = parse_ok(R"({"k\u0065y":1,"valu\u0065":2,"\u0074ime":3})");
  EXPECT_EQ(record, (Record{"1", "2", 3, 1}));
  EXPECT_EQ(rejection(R"({"k\u0065y":1,"key":1,"value":2,"time":3})"), R"(duplicate field "key")");
}

TEST(ParseRecordLine, TrailingWhitespaceAndCarriageReturn) {
  EXPECT_EQ(parse_ok("{\"key\":1,\"value\":2,\"time\":3}\r").time, 3u);
  EXPECT_EQ(parse_ok("  {\"key\":1,\"value\":2,\"time\":3} \t \r").time, 3u);
  EXPECT_EQ(parse_ok("{\"key\":1,\"value\":2,\"time\":3}\r\n").time, 3u);
}

TEST(ParseRecordLine, BlankLinesAreReportedDistinctly) {
  for (std::string_view blank : {"", " ", "\r", " \t \r", "\n"}) {
    EXPECT_TRUE(is_blank_line(blank));
    EXPECT_EQ(rejection(blank), "empty line");
  }
  EXPECT_FALSE(is_blank_line(" {}"));
  EXPECT_FALSE(is_blank_line("\f"));  // not JSON whitespace
}

// --- parse_record_line: integers ------------------------------------------

TEST(ParseRecordLine, TimeBoundaries) {
  EXPECT_EQ(parse_ok(R"({"key":1,"value":2,"time":0})").time, 0u);
  EXPECT_EQ(parse_ok(R"({"key":1,"value":2,"time":18446744073709551615})").time,
            std::numeric_limits<std::uint64_t>::max());
  const std::string out_of_range = R"("time" is out of range (at most 18446744073709551615))";
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":18446744073709551616})"), out_of_range);
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":100000000000000000000000})"), out_of_range);
  // A time is spelled without a sign, so "-0" is rejected like any negative.
  const std::string not_time = R"("time" must be a non-negative integer)";
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":-0})"), not_time);
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":-1})"), not_time);
}

TEST(ParseRecordLine, DiffBoundaries) {
  EXPECT_EQ(parse_ok(R"({"key":1,"value":2,"time":0,"diff":9223372036854775807})").diff,
            std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(parse_ok(R"({"key":1,"value":2,"time":0,"diff":-9223372036854775808})").diff,
            std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(parse_ok(R"({"key":1,"value":2,"time":0,"diff":-0})").diff, 0);
  const std::string out_of_range =
      R"("diff" is out of range (-9223372036854775808 to 9223372036854775807))";
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":0,"diff":9223372036854775808})"), out_of_range);
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":0,"diff":-9223372036854775809})"), out_of_range);
}

TEST(ParseRecordLine, IntegersMustBePlainIntegers) {
  const std::string not_time = R"("time" must be a non-negative integer)";
  for (std::string_view time : {"1.0", "1e3", "1E+0", "\"3\"", "null", "true", "[3]", "{}"}) {
    EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":)" + std::string(time) + "}"), not_time)
        << time;
  }
  const std::string not_diff = R"("diff" must be an integer)";
  for (std::string_view diff : {"1.0", "-1e0", "1E0", "\"1\"", "null", "false", "[1]"}) {
    EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":1,"diff":)" + std::string(diff) + "}"),
              not_diff)
        << diff;
  }
  // Malformed numbers are syntax errors before they are type errors.
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":01})"),
            "invalid JSON at column 28: leading zeros are not allowed");
}

// --- parse_record_line: rejected input ------------------------------------

TEST(ParseRecordLine, RejectsWrongShapes) {
  for (std::string_view line : {"[1]", "\"x\"", "5", "-1", "null", "true"}) {
    EXPECT_EQ(rejection(line), "a record must be a JSON object") << line;
  }
  EXPECT_EQ(rejection("x"), "invalid JSON at column 1: expected '{'");
  EXPECT_EQ(rejection("\xEF\xBB\xBF{\"key\":1,\"value\":2,\"time\":3}"),
            "invalid JSON at column 1: expected '{'");  // no byte order mark
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":3,"foo":4})"), R"(unknown field "foo")");
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":3,"progress":4})"),
            R"(unknown field "progress")");
  EXPECT_EQ(rejection(R"({"Key":1,"value":2,"time":3})"), R"(unknown field "Key")");
  EXPECT_EQ(rejection(R"({"k\"y":1})"), R"(unknown field "k\"y")");
  EXPECT_EQ(rejection("{\"" + std::string(100, 'x') + "\":1}"),
            "unknown field \"" + std::string(64, 'x') + "...\"");
  EXPECT_EQ(rejection(R"({"key":1,"key":2,"value":2,"time":3})"), R"(duplicate field "key")");
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":3,"time":3})"), R"(duplicate field "time")");
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":3,"diff":1,"diff":1})"),
            R"(duplicate field "diff")");
  EXPECT_EQ(rejection(R"({"key":1,"time":3})"), R"(missing field "value")");
  EXPECT_EQ(rejection(R"({"value":1,"time":3})"), R"(missing field "key")");
  EXPECT_EQ(rejection(R"({"key":1,"value":2})"), R"(missing field "time")");
  EXPECT_EQ(rejection("{}"), R"(missing field "key")");
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":3})", RecordMode::kManaged),
            R"("time" is not allowed in a managed append: the appender assigns times)");
}

TEST(ParseRecordLine, RejectsMalformedRecordObjects) {
  EXPECT_EQ(rejection(R"({"key" 1})"), "invalid JSON at column 8: expected ':'");
  EXPECT_EQ(rejection(R"({key:1})"), R"(invalid JSON at column 2: expected '"')");
  EXPECT_EQ(rejection(R"({"key":1 "value":2})"), "invalid JSON at column 10: expected ',' or '}'");
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":3,})"),
            R"(invalid JSON at column 29: expected '"')");
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":3)"),
            "invalid JSON at column 28: expected ',' or '}'");
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":3}x)"),
            "invalid JSON at column 29: unexpected characters after the record");
  EXPECT_EQ(rejection(R"({"key":1,"value":2,"time":3} {})"),
            "invalid JSON at column 30: unexpected characters after the record");
  EXPECT_EQ(rejection(R"({"key":)"), "invalid JSON at column 8: expected a value");
  EXPECT_EQ(rejection(R"({"ke)"), "invalid JSON at column 2: unterminated string");
}

TEST(ParseRecordLine, RejectsMalformedValues) {
  struct Case {
    std::string_view value;
    int offset;  // of the error from the start of the value
    std::string_view detail;
  };
  const Case cases[] = {
      {"", 0, "expected a value"},
      {"01", 1, "leading zeros are not allowed"},
      {"-01", 2, "leading zeros are not allowed"},
      {"1.", 2, "expected a digit after '.'"},
      {".5", 0, "expected a value"},
      {"+1", 0, "expected a value"},
      {"-", 1, "expected a digit"},
      {"-a", 1, "expected a digit"},
      {"1e", 2, "expected a digit in the exponent"},
      {"1e+", 3, "expected a digit in the exponent"},
      {"tru", 0, "expected a value"},
      {"nul", 0, "expected a value"},
      {"True", 0, "expected a value"},
      {"NaN", 0, "expected a value"},
      {"Infinity", 0, "expected a value"},
      {"'x'", 0, "expected a value"},
      {"\"abc", 0, "unterminated string"},
      {"\"abc\\", 4, "invalid escape '\\}'"},  // the record's '}' follows
      {R"("a\x")", 2, R"(invalid escape '\x')"},
      {R"("a\U0041")", 2, R"(invalid escape '\U')"},
      {"\"a\\\x01\"", 2, R"(invalid escape '\' followed by byte 0x01)"},
      {R"("\u12G4")", 1, R"(\u must be followed by 4 hex digits)"},
      {R"("\u12")", 1, R"(\u must be followed by 4 hex digits)"},
      {R"("\uD83D")", 1, R"(unpaired UTF-16 surrogate \uD83D)"},
      {R"("\uDE00")", 1, R"(unpaired UTF-16 surrogate \uDE00)"},
      {R"("\uD83D\u0041")", 1, R"(unpaired UTF-16 surrogate \uD83D)"},
      {R"("\uD83D\uD83D")", 1, R"(unpaired UTF-16 surrogate \uD83D)"},
      {R"("x\uD83Dabcdef")", 2, R"(unpaired UTF-16 surrogate \uD83D)"},
      {"\"a\tb\"", 2, "control character 0x09 must be escaped in a string"},
      {"\"a\x01\"", 2, "control character 0x01 must be escaped in a string"},
      {std::string_view("\"a\0\"", 4), 2, "control character 0x00 must be escaped in a string"},
      {"\"a\nb\"", 2, "control character 0x0A must be escaped in a string"},
      {"[1,]", 3, "expected a value"},
      {"[,1]", 1, "expected a value"},
      {"[1 2]", 3, "expected ',' or ']'"},
      {"[1}", 2, "expected ',' or ']'"},
      {R"({"a" 1})", 5, "expected ':'"},
      {R"({"a":1,})", 7, R"(expected '"')"},
      {R"({1:2})", 1, R"(expected '"')"},
      {R"({"a":1])", 6, "expected ',' or '}'"},
      {"[", 1, "expected a value"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(rejection(line_with_value(c.value)), "invalid JSON at column " +
                                                       std::to_string(kValueColumn + c.offset) +
                                                       ": " + std::string(c.detail))
        << c.value;
  }
  EXPECT_EQ(rejection(std::string(kValuePrefix) + "\"abc\\"),
            "invalid JSON at column " + std::to_string(kValueColumn) + ": unterminated string");
}

TEST(ParseRecordLine, AcceptsValidEscapesAndDelete) {
  for (std::string_view value : {R"("\"\\\/\b\f\n\r\t")", R"("\u0000\u001f\uFFFF\ud800\udc00")",
                                 R"("\uDBFF\uDFFF")", "\"\x7F\""}) {
    EXPECT_EQ(parse_ok(line_with_value(value)).value, value);
  }
}

TEST(ParseRecordLine, ValidatesUtf8InStrings) {
  const std::string_view valid[] = {
      "\xC3\xA9",          // U+00E9
      "\xE2\x82\xAC",      // U+20AC
      "\xF0\x9F\x98\x80",  // U+1F600
      "\xC2\x80",          // U+0080, smallest 2-byte
      "\xE0\xA0\x80",      // U+0800, smallest 3-byte
      "\xED\x9F\xBF",      // U+D7FF, just below the surrogates
      "\xEE\x80\x80",      // U+E000, just above them
      "\xEF\xBF\xBF",      // U+FFFF
      "\xF0\x90\x80\x80",  // U+10000, smallest 4-byte
      "\xF4\x8F\xBF\xBF",  // U+10FFFF, the largest code point
  };
  for (std::string_view bytes : valid) {
    const std::string value = "\"" + std::string(bytes) + "\"";
    EXPECT_EQ(parse_ok(line_with_value(value)).value, value);
  }
  const std::string_view invalid[] = {
      "\xC0\x80",          // overlong NUL
      "\xC1\xBF",          // overlong 2-byte
      "\xE0\x80\x80",      // overlong 3-byte
      "\xE0\x9F\xBF",      // overlong 3-byte (U+07FF)
      "\xF0\x80\x80\x80",  // overlong 4-byte
      "\xF0\x8F\xBF\xBF",  // overlong 4-byte (U+FFFF)
      "\xED\xA0\x80",      // U+D800, a surrogate
      "\xED\xBF\xBF",      // U+DFFF, a surrogate
      "\xF4\x90\x80\x80",  // U+110000, beyond Unicode
      "\xF5\x80\x80\x80",  // invalid lead byte
      "\xFF",              // invalid byte
      "\x80",              // stray continuation byte
      "\xC3",              // truncated 2-byte
      "\xE2\x82",          // truncated 3-byte
      "\xF0\x9F\x98",      // truncated 4-byte
      "\xC3\x28",          // bad continuation byte
  };
  for (std::string_view bytes : invalid) {
    const std::string value = "\"a" + std::string(bytes) + "\"";
    EXPECT_EQ(
        rejection(line_with_value(value)),
        "invalid JSON at column " + std::to_string(kValueColumn + 2) + ": invalid UTF-8 in string")
        << testing::PrintToString(bytes);
  }
  // Truncated by the end of the line itself.
  EXPECT_EQ(
      rejection(std::string(kValuePrefix) + "\"\xE2\x82"),
      "invalid JSON at column " + std::to_string(kValueColumn + 1) + ": invalid UTF-8 in string");
  // Field names are validated the same way.
  EXPECT_EQ(rejection("{\"\xFF\":1}"), "invalid JSON at column 3: invalid UTF-8 in string");
}

TEST(ParseRecordLine, LimitsNestingDepth) {
  // The record's object is one level, so a value may nest 127 levels.
  auto nested_arrays = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_EQ(parse_ok(line_with_value(nested_arrays(127))).value, nested_arrays(127));
  EXPECT_EQ(rejection(line_with_value(nested_arrays(128))), "invalid JSON at column " +
                                                                std::to_string(kValueColumn + 127) +
                                                                ": nesting deeper than 128 levels");

  auto nested_objects = [](int depth) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += R"({"a":)";
    text += "1";
    text += std::string(depth, '}');
    return text;
  };
  EXPECT_EQ(parse_ok(line_with_value(nested_objects(127))).value, nested_objects(127));
  EXPECT_EQ(rejection(line_with_value(nested_objects(128))),
            "invalid JSON at column " + std::to_string(kValueColumn + 127 * 5) +
                ": nesting deeper than 128 levels");
  // Deep input far past the limit fails fast without exhausting the stack.
  EXPECT_NE(rejection(line_with_value(nested_arrays(1'000'000))), "<accepted>");
}

// --- Writing ---------------------------------------------------------------

TEST(AppendJsonString, EscapesWhatJsonRequires) {
  EXPECT_EQ(json_quoted(""), R"("")");
  EXPECT_EQ(json_quoted("plain / text"), R"("plain / text")");
  EXPECT_EQ(json_quoted("q\"b\\"), R"("q\"b\\")");
  EXPECT_EQ(json_quoted("\b\f\n\r\t"), R"("\b\f\n\r\t")");
  EXPECT_EQ(json_quoted(std::string_view("\x00\x01\x1f", 3)), R"("\u0000\u0001\u001f")");
  EXPECT_EQ(json_quoted("\x7F"), "\"\x7F\"");
  EXPECT_EQ(json_quoted("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"");
}

TEST(AppendJsonString, ReplacesInvalidUtf8) {
  EXPECT_EQ(json_quoted("a\xFF"), "\"a\xEF\xBF\xBD\"");
  EXPECT_EQ(json_quoted("\xE2\x82z"), "\"\xEF\xBF\xBD\xEF\xBF\xBDz\"");
  EXPECT_EQ(json_quoted("\xED\xA0\x80"), "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"");
}

TEST(AppendJsonString, AppendsToExistingText) {
  std::string out = "x=";
  append_json_string(&out, "y");
  EXPECT_EQ(out, R"(x="y")");
}

TEST(AppendJsonString, RoundTripsEveryAsciiByteThroughParseJson) {
  std::string all;
  for (int c = 0; c < 128; ++c) {
    const std::string one(1, static_cast<char>(c));
    all += one;
    auto parsed = parse_json(json_quoted(one));
    ASSERT_TRUE(parsed.has_value()) << c << ": " << parsed.error().message;
    EXPECT_EQ(parsed->as_string(), one) << c;
  }
  const std::string multi_byte = "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF";
  for (const std::string& text : {all, multi_byte, all + multi_byte + all}) {
    auto parsed = parse_json(json_quoted(text));
    ASSERT_TRUE(parsed.has_value()) << parsed.error().message;
    EXPECT_EQ(parsed->as_string(), text);
    // And as a record value, where the escaped text is kept verbatim.
    EXPECT_EQ(parse_ok(line_with_value(json_quoted(text))).value, json_quoted(text));
  }
}

TEST(AppendJsonString, OutputIsValidJsonForArbitraryBytes) {
  std::mt19937 random(42);
  for (int round = 0; round < 2000; ++round) {
    std::string bytes(random() % 24, '\0');
    for (char& b : bytes) b = static_cast<char>(random());
    auto parsed = parse_json(json_quoted(bytes));
    ASSERT_TRUE(parsed.has_value()) << parsed.error().message;
  }
}

TEST(AppendIntegers, WritesDecimal) {
  std::string out;
  append_u64(&out, 0);
  out += ' ';
  append_u64(&out, std::numeric_limits<std::uint64_t>::max());
  out += ' ';
  append_i64(&out, std::numeric_limits<std::int64_t>::min());
  out += ' ';
  append_i64(&out, std::numeric_limits<std::int64_t>::max());
  out += ' ';
  append_i64(&out, -1);
  EXPECT_EQ(out, "0 18446744073709551615 -9223372036854775808 9223372036854775807 -1");
}

// --- parse_json ------------------------------------------------------------

TEST(ParseJson, ReadsObjects) {
  auto parsed = parse_json(R"( {"name": "s1", "n": 5, "neg": -3, "f": 1.50, "ok": true,
      "no": false, "nothing": null, "list": [1, "two", []], "nested": {}} )");
  ASSERT_TRUE(parsed.has_value()) << parsed.error().message;
  const JsonValue& value = *parsed;
  ASSERT_TRUE(value.is_object());
  EXPECT_EQ(value.as_object().size(), 9u);
  EXPECT_EQ(value.as_object()[0].first, "name");  // members keep their order
  EXPECT_EQ(value.find("name")->as_string(), "s1");
  EXPECT_EQ(value.find("n")->as_u64(), 5u);
  EXPECT_EQ(value.find("n")->as_i64(), 5);
  EXPECT_EQ(value.find("neg")->as_u64(), std::nullopt);
  EXPECT_EQ(value.find("neg")->as_i64(), -3);
  EXPECT_EQ(value.find("f")->number_text(), "1.50");
  EXPECT_EQ(value.find("f")->as_i64(), std::nullopt);
  EXPECT_TRUE(value.find("ok")->as_bool());
  EXPECT_FALSE(value.find("no")->as_bool());
  EXPECT_TRUE(value.find("nothing")->is_null());
  const auto& list = value.find("list")->as_array();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[1].as_string(), "two");
  EXPECT_TRUE(list[2].as_array().empty());
  EXPECT_TRUE(value.find("nested")->as_object().empty());
  EXPECT_EQ(value.find("absent"), nullptr);
  EXPECT_EQ(list[0].find("name"), nullptr);  // not an object
  EXPECT_EQ(value.to_json(),
            R"({"name":"s1","n":5,"neg":-3,"f":1.50,"ok":true,"no":false,"nothing":null,)"
            R"("list":[1,"two",[]],"nested":{}})");
  EXPECT_EQ(*parse_json(value.to_json()), value);
}

TEST(ParseJson, ReadsScalarsAtTheTop) {
  EXPECT_TRUE(parse_json(" null ")->is_null());
  EXPECT_EQ(parse_json("-0.5e3")->number_text(), "-0.5e3");
  EXPECT_EQ(parse_json("\"x\"\r\n")->as_string(), "x");
}

TEST(ParseJson, DecodesStrings) {
  EXPECT_EQ(parse_json(R"("a\n\u00e9\uD83D\uDE00\/\"")")->as_string(),
            "a\n\xC3\xA9\xF0\x9F\x98\x80/\"");
  EXPECT_EQ(parse_json(R"("\u0000")")->as_string(), std::string(1, '\0'));
  EXPECT_EQ(parse_json(R"("\u20AC\u07FF")")->as_string(), "\xE2\x82\xAC\xDF\xBF");
}

TEST(ParseJson, IntegerAccessors) {
  EXPECT_EQ(parse_json("18446744073709551615")->as_u64(),
            std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(parse_json("18446744073709551616")->as_u64(), std::nullopt);
  EXPECT_EQ(parse_json("-9223372036854775808")->as_i64(), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(parse_json("9223372036854775808")->as_i64(), std::nullopt);
  EXPECT_EQ(parse_json("-0")->as_u64(), std::nullopt);  // as for a record's time
  EXPECT_EQ(parse_json("-0")->as_i64(), 0);
  EXPECT_EQ(parse_json("1e2")->as_u64(), std::nullopt);
  EXPECT_EQ(parse_json("\"5\"")->as_u64(), std::nullopt);
}

TEST(ParseJson, Rejections) {
  EXPECT_EQ(json_rejection(""), "invalid JSON at column 1: expected a value");
  EXPECT_EQ(json_rejection("   "), "invalid JSON at column 4: expected a value");
  EXPECT_EQ(json_rejection(R"({"a":1} x)"),
            "invalid JSON at column 9: unexpected characters after the value");
  EXPECT_EQ(json_rejection("{\n  \"a\" 1\n}"), "invalid JSON at line 2, column 7: expected ':'");
  EXPECT_EQ(json_rejection("[1,\n2,\n]"), "invalid JSON at line 3, column 1: expected a value");
  EXPECT_EQ(json_rejection(R"({"a":1,"b":2,"a":3})"), R"(duplicate field "a")");
  EXPECT_EQ(json_rejection(R"({"\n\u0041":1,"\nA":2})"), R"(duplicate field "\nA")");
  EXPECT_EQ(json_rejection(R"({"\uDE00":1})"),
            R"(invalid JSON at column 3: unpaired UTF-16 surrogate \uDE00)");
  EXPECT_EQ(json_rejection("[\"\xC0\x80\"]"), "invalid JSON at column 3: invalid UTF-8 in string");
  // Nested duplicates are found too, even in big objects.
  std::string big = R"({"outer":{)";
  for (int i = 0; i < 1000; ++i) big += "\"m" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  big += R"("m500":0}})";
  EXPECT_EQ(json_rejection(big), R"(duplicate field "m500")");
}

TEST(ParseJson, LimitsNestingDepth) {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_TRUE(parse_json(nested(128)).has_value());
  EXPECT_EQ(json_rejection(nested(129)),
            "invalid JSON at column 129: nesting deeper than 128 levels");
  EXPECT_EQ(json_rejection(std::string(100000, '[')),
            "invalid JSON at column 129: nesting deeper than 128 levels");
}

// --- Sizes -----------------------------------------------------------------

std::string size_rejection(std::string_view text) {
  auto size = parse_size(text);
  if (size) return "<accepted>";
  EXPECT_EQ(size.error().kind, ErrorKind::kInvalidUsage);
  return size.error().message;
}

TEST(ParseSize, AcceptsBytesAndBinaryUnits) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("1048576"), 1048576u);
  EXPECT_EQ(parse_size("512B"), 512u);
  EXPECT_EQ(parse_size("1KiB"), 1024u);
  EXPECT_EQ(parse_size("64MiB"), 64u << 20);
  EXPECT_EQ(parse_size("1GiB"), 1u << 30);
  EXPECT_EQ(parse_size("2TiB"), 2ull << 40);
  EXPECT_EQ(parse_size("64 MiB"), 64u << 20);
  EXPECT_EQ(parse_size("64mib"), 64u << 20);
  EXPECT_EQ(parse_size("1.5GiB"), 3u << 29);
  EXPECT_EQ(parse_size("0.5KiB"), 512u);
  EXPECT_EQ(parse_size("1.1KiB"), 1126u);  // 1126.4, rounded down
  EXPECT_EQ(parse_size("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(parse_size("16777215TiB"), 16777215ull << 40);
  EXPECT_EQ(parse_size("16777215.999999999999999999TiB"),
            std::numeric_limits<std::uint64_t>::max());
}

TEST(ParseSize, RejectsEverythingElse) {
  const std::string expected =
      "expected a number of bytes, optionally followed by KiB, MiB, GiB or TiB";
  EXPECT_EQ(size_rejection(""), "invalid size \"\": " + expected);
  EXPECT_EQ(size_rejection("-1"), "invalid size \"-1\": " + expected);
  EXPECT_EQ(size_rejection(" 64"), "invalid size \" 64\": " + expected);
  EXPECT_EQ(size_rejection("MiB"), "invalid size \"MiB\": " + expected);
  EXPECT_EQ(
      size_rejection("64MB"),
      R"(invalid size "64MB": unknown unit "MB" (use B, KiB, MiB, GiB or TiB, or plain bytes))");
  EXPECT_EQ(
      size_rejection("64M"),
      R"(invalid size "64M": unknown unit "M" (use B, KiB, MiB, GiB or TiB, or plain bytes))");
  EXPECT_EQ(size_rejection("64 "), R"(invalid size "64 ": expected a unit after ' ')");
  EXPECT_EQ(size_rejection("1.5"),
            R"(invalid size "1.5": a fraction needs a unit larger than bytes, such as MiB)");
  EXPECT_EQ(size_rejection("1.MiB"), R"(invalid size "1.MiB": expected a digit after '.')");
  EXPECT_EQ(size_rejection("18446744073709551616"),
            R"(invalid size "18446744073709551616": does not fit in 64 bits)");
  EXPECT_EQ(size_rejection("16777216TiB"),
            R"(invalid size "16777216TiB": does not fit in 64 bits)");
  EXPECT_EQ(size_rejection("99999999999999999999999999"),
            R"(invalid size "99999999999999999999999999": does not fit in 64 bits)");
  EXPECT_EQ(size_rejection("1.0000000000000000001GiB"),
            R"(invalid size "1.0000000000000000001GiB": too many digits after the decimal point)");
}

TEST(FormatSize, PicksTheLargestUnit) {
  EXPECT_EQ(format_size(0), "0 B");
  EXPECT_EQ(format_size(1023), "1023 B");
  EXPECT_EQ(format_size(1024), "1.0 KiB");
  EXPECT_EQ(format_size(64u << 20), "64.0 MiB");
  EXPECT_EQ(format_size(3u << 29), "1.5 GiB");
  EXPECT_EQ(format_size((1u << 20) - 1), "1.0 MiB");
  EXPECT_EQ(format_size(std::numeric_limits<std::uint64_t>::max()), "16777216.0 TiB");
  for (std::uint64_t size : {0ull, 512ull, 64ull << 20, 3ull << 29, 5ull << 40}) {
    EXPECT_EQ(parse_size(format_size(size)), size) << format_size(size);
  }
}

// --- Throughput (printed, not asserted) ------------------------------------

TEST(Throughput, PrintsRecordLinesPerSecond) {
  constexpr int kLines = 500'000;
  std::vector<std::string> lines;
  lines.reserve(kLines);
  std::size_t bytes = 0;
  for (int i = 0; i < kLines; ++i) {
    lines.push_back(R"({"key": "user-)" + std::to_string(i) + R"(", "value": {"name": "x", "n": )" +
                    std::to_string(i % 1000) + R"(}, "time": )" + std::to_string(17 + i) +
                    R"(, "diff": 1})");
    bytes += lines.back().size();
  }
  std::size_t checksum = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& line : lines) {
    auto record = parse_record_line(line, RecordMode::kExplicit);
    checksum += record->key.size() + record->value.size();
  }
  const double parse_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Writing the same records back as snapshot lines.
  std::string out;
  const auto write_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kLines; ++i) {
    out.clear();
    out += R"({"key":)";
    append_json_string(&out, "user-12345");
    out += R"(,"value":{"name":"x","n":5},"time":)";
    append_u64(&out, 17 + static_cast<std::uint64_t>(i));
    out += R"(,"diff":)";
    append_i64(&out, 1);
    out += "}\n";
    checksum += out.size();
  }
  const double write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - write_start).count();

  std::printf("parse_record_line: %.2f M lines/s, %.0f MB/s (%d lines, checksum %zu)\n",
              kLines / parse_seconds / 1e6, bytes / parse_seconds / 1e6, kLines, checksum);
  std::printf("record line writing: %.2f M lines/s\n", kLines / write_seconds / 1e6);
}

}  // namespace
}  // namespace tidemark
