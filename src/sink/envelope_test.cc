#include "sink/envelope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "testing/sink_util.h"

namespace tidemark {
namespace {

using testing::insert;
using testing::remove;
using testing::update;

std::string file_lines(Envelope envelope, SinkFormat format, const std::vector<DiffPair>& pairs) {
  MessageEncoder encoder(envelope, format);
  std::string out = encoder.file_header();
  for (const DiffPair& pair : pairs) encoder.append_file_line(pair, &out);
  return out;
}

// ---------------------------------------------------------------------------
// Parsing.

TEST(ParseEnvelope, AcceptsTheTwoWords) {
  EXPECT_EQ(parse_envelope("upsert").value(), Envelope::kUpsert);
  EXPECT_EQ(parse_envelope("debezium").value(), Envelope::kDebezium);
}

TEST(ParseEnvelope, RejectsAnythingElseNamingTheAllowedWords) {
  for (std::string_view text : {"", "Upsert", "DEBEZIUM", "upsert ", "append"}) {
    auto envelope = parse_envelope(text);
    ASSERT_FALSE(envelope.has_value()) << text;
    EXPECT_EQ(envelope.error().kind, ErrorKind::kInvalidUsage);
    EXPECT_NE(envelope.error().message.find("upsert or debezium"), std::string::npos)
        << envelope.error().message;
  }
}

TEST(ParseSinkFormat, AcceptsTheTwoWords) {
  EXPECT_EQ(parse_sink_format("json").value(), SinkFormat::kJson);
  EXPECT_EQ(parse_sink_format("csv").value(), SinkFormat::kCsv);
}

TEST(ParseSinkFormat, RejectsAnythingElseNamingTheAllowedWords) {
  for (std::string_view text : {"", "JSON", "Csv", "ndjson", " json"}) {
    auto format = parse_sink_format(text);
    ASSERT_FALSE(format.has_value()) << text;
    EXPECT_EQ(format.error().kind, ErrorKind::kInvalidUsage);
    EXPECT_NE(format.error().message.find("json or csv"), std::string::npos)
        << format.error().message;
  }
}

// ---------------------------------------------------------------------------
// Files, json.

TEST(MessageEncoderJson, HasNoHeader) {
  EXPECT_EQ(MessageEncoder(Envelope::kUpsert, SinkFormat::kJson).file_header(), "");
  EXPECT_EQ(MessageEncoder(Envelope::kDebezium, SinkFormat::kJson).file_header(), "");
}

TEST(MessageEncoderJson, UpsertWritesTheAfterOrNullForATombstone) {
  EXPECT_EQ(file_lines(Envelope::kUpsert, SinkFormat::kJson,
                       {insert(R"("k1")", 5, R"({"a":1})"), update(R"("k2")", 6, "1", "2"),
                        remove(R"("k3")", 18446744073709551615ull, "[1,2]")}),
            "{\"time\":5,\"key\":\"k1\",\"value\":{\"a\":1}}\n"
            "{\"time\":6,\"key\":\"k2\",\"value\":2}\n"
            "{\"time\":18446744073709551615,\"key\":\"k3\",\"value\":null}\n");
}

TEST(MessageEncoderJson, DebeziumWritesBothSidesWithNullForAMissingOne) {
  EXPECT_EQ(file_lines(Envelope::kDebezium, SinkFormat::kJson,
                       {insert("42", 0, R"("v")"), update("{\"id\":7}", 3, "true", "false"),
                        remove(R"("k")", 9, "null")}),
            "{\"time\":0,\"key\":42,\"before\":null,\"after\":\"v\"}\n"
            "{\"time\":3,\"key\":{\"id\":7},\"before\":true,\"after\":false}\n"
            "{\"time\":9,\"key\":\"k\",\"before\":null,\"after\":null}\n");
}

TEST(MessageEncoderJson, AppendsToWhatIsAlreadyThere) {
  MessageEncoder encoder(Envelope::kUpsert, SinkFormat::kJson);
  std::string out = "earlier\n";
  encoder.append_file_line(insert("1", 1, "2"), &out);
  EXPECT_EQ(out, "earlier\n{\"time\":1,\"key\":1,\"value\":2}\n");
}

// ---------------------------------------------------------------------------
// Files, csv.

TEST(MessageEncoderCsv, HeaderNamesTheColumns) {
  EXPECT_EQ(MessageEncoder(Envelope::kUpsert, SinkFormat::kCsv).file_header(), "time,key,value\n");
  EXPECT_EQ(MessageEncoder(Envelope::kDebezium, SinkFormat::kCsv).file_header(),
            "time,key,before,after\n");
}

TEST(MessageEncoderCsv, UpsertWritesTheAfterOrNullForATombstone) {
  EXPECT_EQ(
      file_lines(Envelope::kUpsert, SinkFormat::kCsv,
                 {insert("1", 5, "10"), update("2", 6, "true", "false"), remove("3", 7, "null")}),
      "time,key,value\n"
      "5,1,10\n"
      "6,2,false\n"
      "7,3,null\n");
}

TEST(MessageEncoderCsv, DebeziumWritesBothSidesWithNullForAMissingOne) {
  EXPECT_EQ(file_lines(Envelope::kDebezium, SinkFormat::kCsv,
                       {insert("1", 5, "10"), update("2", 6, "1.5", "-2e3"), remove("3", 7, "[]")}),
            "time,key,before,after\n"
            "5,1,null,10\n"
            "6,2,1.5,-2e3\n"
            "7,3,[],null\n");
}

TEST(MessageEncoderCsv, QuotesCellsWithCommasOrQuotesAndDoublesTheQuotes) {
  EXPECT_EQ(file_lines(Envelope::kDebezium, SinkFormat::kCsv,
                       {update(R"("k1")", 1, R"({"a":1,"b":2})", "[1,2]")}),
            "time,key,before,after\n"
            R"(1,"""k1""","{""a"":1,""b"":2}","[1,2]")"
            "\n");
}

TEST(MessageEncoderCsv, AnEscapedNewlineInAJsonStringStaysTwoCharacters) {
  // The JSON text "a\nb" holds a backslash and an n, not a line feed: the
  // cell is quoted for its double quotes only, and the row stays one line.
  const std::string lines =
      file_lines(Envelope::kUpsert, SinkFormat::kCsv, {insert("1", 1, R"("a\nb")")});
  EXPECT_EQ(lines,
            "time,key,value\n"
            R"(1,1,"""a\nb""")"
            "\n");
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 2);
  // With a comma in the string too, the same quoting covers both.
  EXPECT_EQ(file_lines(Envelope::kUpsert, SinkFormat::kCsv, {insert("1", 1, R"("a\nb,c")")}),
            "time,key,value\n"
            R"(1,1,"""a\nb,c""")"
            "\n");
}

TEST(MessageEncoderCsv, QuotesCellsWithALiteralLineBreak) {
  // Stored JSON text never holds a raw CR or LF, but the cell must still be
  // a single CSV field if it did.
  EXPECT_EQ(file_lines(Envelope::kUpsert, SinkFormat::kCsv,
                       {insert("1", 1, "[1,\n2]"), insert("2", 1, "[\r]")}),
            "time,key,value\n"
            "1,1,\"[1,\n2]\"\n"
            "1,2,\"[\r]\"\n");
}

TEST(MessageEncoderCsv, AJsonStringNullIsDistinctFromAMissingSide) {
  EXPECT_EQ(file_lines(Envelope::kDebezium, SinkFormat::kCsv, {insert("1", 1, R"("null")")}),
            "time,key,before,after\n"
            R"(1,1,null,"""null""")"
            "\n");
}

// ---------------------------------------------------------------------------
// Kafka.

TEST(MessageEncoderKafka, UpsertValueIsTheAfterOrATombstone) {
  MessageEncoder encoder(Envelope::kUpsert, SinkFormat::kJson);
  KafkaMessage inserted = encoder.kafka_message(insert(R"("k1")", 1, R"({"a":1})"));
  EXPECT_EQ(inserted.key, R"("k1")");
  EXPECT_EQ(inserted.value, std::optional<std::string>(R"({"a":1})"));
  KafkaMessage updated = encoder.kafka_message(update("7", 2, "1", "2"));
  EXPECT_EQ(updated.key, "7");
  EXPECT_EQ(updated.value, std::optional<std::string>("2"));
  KafkaMessage removed = encoder.kafka_message(remove(R"({"id":1})", 3, "1"));
  EXPECT_EQ(removed.key, R"({"id":1})");
  EXPECT_EQ(removed.value, std::nullopt);
}

TEST(MessageEncoderKafka, AJsonNullValueIsNotATombstone) {
  MessageEncoder encoder(Envelope::kUpsert, SinkFormat::kJson);
  EXPECT_EQ(encoder.kafka_message(insert("1", 1, "null")).value,
            std::optional<std::string>("null"));
}

TEST(MessageEncoderKafka, DebeziumValueHasBothSides) {
  MessageEncoder encoder(Envelope::kDebezium, SinkFormat::kCsv);
  KafkaMessage inserted = encoder.kafka_message(insert(R"("k")", 1, R"({"a":1})"));
  EXPECT_EQ(inserted.key, R"("k")");
  EXPECT_EQ(inserted.value, std::optional<std::string>(R"({"before":null,"after":{"a":1}})"));
  KafkaMessage updated = encoder.kafka_message(update(R"("k")", 2, "1", "2"));
  EXPECT_EQ(updated.value, std::optional<std::string>(R"({"before":1,"after":2})"));
  KafkaMessage removed = encoder.kafka_message(remove(R"("k")", 3, "2"));
  EXPECT_EQ(removed.value, std::optional<std::string>(R"({"before":2,"after":null})"));
}

// ---------------------------------------------------------------------------
// Primary-key violations.

// Two (key, time) groups of three pairs each.
std::vector<DiffPair> two_groups_of_three() {
  std::vector<DiffPair> pairs;
  for (std::string_view key : {R"("a")", R"("b")"}) {
    for (std::uint64_t i = 0; i < 3; ++i) {
      pairs.push_back(DiffPair{key, 4, std::nullopt, "1", i});
    }
  }
  return pairs;
}

TEST(MessageEncoderViolations, UpsertCountsEachGroupOnceAndLogsOnceAnInterval) {
  for (SinkFormat format : {SinkFormat::kJson, SinkFormat::kCsv}) {
    MessageEncoder encoder(Envelope::kUpsert, format);
    std::string out;
    ::testing::internal::CaptureStderr();
    for (const DiffPair& pair : two_groups_of_three()) encoder.append_file_line(pair, &out);
    std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(encoder.primary_key_violations(), 2u);
    // Both groups fall in one interval: one line, about the first.
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
    EXPECT_NE(log.find(R"(key "a")"), std::string::npos) << log;
    EXPECT_NE(log.find("time 4"), std::string::npos) << log;
    EXPECT_NE(log.find("1 violations so far"), std::string::npos) << log;
  }
}

TEST(MessageEncoderViolations, KafkaMessagesAreCountedToo) {
  MessageEncoder encoder(Envelope::kUpsert, SinkFormat::kJson);
  ::testing::internal::CaptureStderr();
  for (const DiffPair& pair : two_groups_of_three()) (void)encoder.kafka_message(pair);
  (void)::testing::internal::GetCapturedStderr();
  EXPECT_EQ(encoder.primary_key_violations(), 2u);
}

TEST(MessageEncoderViolations, DebeziumNeverCounts) {
  MessageEncoder encoder(Envelope::kDebezium, SinkFormat::kJson);
  std::string out;
  ::testing::internal::CaptureStderr();
  for (const DiffPair& pair : two_groups_of_three()) {
    encoder.append_file_line(pair, &out);
    (void)encoder.kafka_message(pair);
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(encoder.primary_key_violations(), 0u);
}

TEST(MessageEncoderViolations, ALongKeyIsTruncatedInTheLog) {
  MessageEncoder encoder(Envelope::kUpsert, SinkFormat::kJson);
  const std::string key = "\"" + std::string(10000, 'x') + "\"";
  std::string out;
  ::testing::internal::CaptureStderr();
  encoder.append_file_line(DiffPair{key, 1, std::nullopt, "1", 0}, &out);
  encoder.append_file_line(DiffPair{key, 1, std::nullopt, "2", 1}, &out);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(encoder.primary_key_violations(), 1u);
  EXPECT_LT(log.size(), 400u) << log.size();
  EXPECT_NE(log.find("xxx..."), std::string::npos) << log;
  // The lines themselves carry the whole key.
  EXPECT_NE(out.find(key), std::string::npos);
}

}  // namespace
}  // namespace tidemark
