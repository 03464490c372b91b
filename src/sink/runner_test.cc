// run_sink over the in-memory backends: the snapshot once, then the
// changes, into committed files; a restart resumes without re-emitting.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "location/mem_blob.h"
#include "location/mem_consensus.h"
#include "sink/committed_name.h"
#include "sink/file_destination.h"
#include "sink/kafka_reader.h"
#include "testing/kafka_mock_process.h"
#include "tidemark/sink.h"
#include "tidemark/write.h"
#include "util/try.h"

namespace tidemark {
namespace {

namespace fs = std::filesystem;

// The upsert json lines a sink must emit for `updates`: the snapshot at
// as_of (all at time as_of), then each later time's changes, paired.
std::vector<std::string> expected_lines(const std::vector<Update>& updates, Time as_of,
                                        Time until) {
  // (time, key) -> value -> diff, with times <= as_of folded into as_of.
  std::map<std::pair<Time, std::string>, std::map<std::string, Diff>> groups;
  for (const Update& u : updates) {
    if (u.time >= until) continue;
    groups[{std::max(u.time, as_of), u.key}][u.value] += u.diff;
  }
  std::vector<std::string> lines;
  for (const auto& [group, values] : groups) {
    std::vector<std::string> befores, afters;
    for (const auto& [value, diff] : values) {
      for (Diff i = 0; i < -diff; ++i) befores.push_back(value);
      for (Diff i = 0; i < diff; ++i) afters.push_back(value);
    }
    const std::size_t pairs = std::max(befores.size(), afters.size());
    for (std::size_t i = 0; i < pairs; ++i) {
      const std::string value = i < afters.size() ? afters[i] : "null";
      lines.push_back("{\"time\":" + std::to_string(group.first) + ",\"key\":" + group.second +
                      ",\"value\":" + value + "}");
    }
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

class FileSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tidemark-sink-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    ClientOptions options;
    options.listen_poll_interval = std::chrono::milliseconds(1);
    options.background_compaction = false;
    client_ = *Client::open(Location{std::make_shared<MemBlob>(), std::make_shared<MemConsensus>()},
                            options);
    ASSERT_TRUE(client_->create_shard("s"));
    shard_ = *client_->open_shard("s");
    writer_ = std::move(*shard_->open_writer());
  }
  void TearDown() override { fs::remove_all(dir_); }

  void append_at(Time t, std::vector<Update> updates) {
    for (Update& u : updates) u.time = t;
    std::vector<Batch> batches;
    batches.push_back(*writer_->batch(updates, Frontier::at(t), Frontier::at(t + 1)));
    ASSERT_TRUE(writer_->compare_and_append(batches, Frontier::at(t), Frontier::at(t + 1)));
    all_.insert(all_.end(), updates.begin(), updates.end());
  }

  // What the snapshot-in-parts tests write, about 100 KB at times 0-2:
  // 2,000 keys, a key whose 20,000 copies span parts, two values of one
  // key, and four unpaired befores (nulls).
  void append_parts_data() {
    std::vector<Update> first;
    for (int i = 0; i < 2000; ++i) {
      first.push_back({"\"k" + std::to_string(i) + "\"", std::to_string(i), 0, 1});
    }
    first.push_back({"\"m\"", "1", 0, 20'000});
    first.push_back({"\"n\"", "1", 0, 3});
    first.push_back({"\"n\"", "2", 0, 2});
    first.push_back({"\"o\"", "1", 0, -4});
    append_at(0, first);
    append_at(1, {{"\"k7\"", "7", 0, -1}, {"\"k7\"", "70", 0, 1}, {"\"m\"", "1", 0, -100}});
    append_at(2, {{"\"k8\"", "8", 0, -1}});
  }

  // Every line of every committed file, sorted; fails on a file whose
  // range overlaps another's.
  std::vector<std::string> committed_lines() {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      std::string name = entry.path().filename().string();
      if (name == FileDestination::kLockFileName) continue;
      EXPECT_FALSE(name.starts_with(".")) << "a temporary was left: " << name;
      if (name.ends_with(".json")) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    std::vector<std::string> lines;
    std::string previous_upper = std::string(20, '0');
    for (const std::string& name : names) {
      // A snapshot's parts come before its last file, which they share
      // their range with.
      auto part = parse_snapshot_part(dir_.string(), name);
      EXPECT_TRUE(part) << part.error().message;
      if (!part || !*part) {
        EXPECT_GE(name.substr(0, 20), previous_upper) << "overlapping files";
        previous_upper = name.substr(21, 20);
      }
      std::ifstream in(dir_ / name);
      for (std::string line; std::getline(in, line);) lines.push_back(line);
    }
    std::sort(lines.begin(), lines.end());
    return lines;
  }

  Result<SinkProgress> run(Time until, std::optional<Time> as_of = std::nullopt) {
    TM_ASSIGN(auto destination,
              FileDestination::open(dir_.string(), Envelope::kUpsert, SinkFormat::kJson));
    SinkOptions options;
    options.sink_name = "files";
    options.as_of = as_of;
    options.until = until;
    options.poll_interval = std::chrono::milliseconds(1);
    options.commit_interval = std::chrono::milliseconds(0);  // a file per interval
    return run_sink(*shard_, *destination, options);
  }

  fs::path dir_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Shard> shard_;
  std::unique_ptr<WriteHandle> writer_;
  std::vector<Update> all_;
};

TEST_F(FileSinkTest, SnapshotThenChangesThenResume) {
  append_at(0, {{"\"a\"", "1", 0, 1}, {"\"b\"", "2", 0, 1}});
  append_at(1, {{"\"a\"", "1", 0, -1}, {"\"a\"", "3", 0, 1}});  // an update of a
  append_at(2, {{"\"hot\"", "7", 0, 1000}});                    // fan-out
  // A writer keeps appending while the sink follows.
  std::thread more([&] {
    for (Time t = 3; t < 12; ++t) {
      append_at(t, {{"\"k" + std::to_string(t % 4) + "\"", std::to_string(t), 0, 1},
                    {"\"b\"", "2", 0, t % 2 == 0 ? -1 : 1}});
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  auto first = run(8, /*as_of=*/1);
  more.join();
  ASSERT_TRUE(first) << first.error().to_string();
  EXPECT_EQ(first->frontier, Frontier::at(8));
  EXPECT_EQ(committed_lines(), expected_lines(all_, 1, 8));

  // A restart resumes at 8: nothing emitted twice, nothing skipped.
  auto second = run(12);
  ASSERT_TRUE(second) << second.error().to_string();
  EXPECT_EQ(second->frontier, Frontier::at(12));
  EXPECT_EQ(committed_lines(), expected_lines(all_, 1, 12));
  // The sink's hold keeps the history it still needs, and no more.
  EXPECT_EQ(shard_->inspect()->since, Frontier::at(11));
}

TEST_F(FileSinkTest, AHotKeyFansOutLazily) {
  append_at(0, {{"\"hot\"", "1", 0, 200'000}});
  append_at(1, {{"\"hot\"", "1", 0, -200'000}, {"\"hot\"", "2", 0, 200'000}});
  auto ran = run(2, /*as_of=*/0);
  ASSERT_TRUE(ran) << ran.error().to_string();
  EXPECT_EQ(ran->pairs, 400'000u);
  auto lines = committed_lines();
  EXPECT_EQ(lines.size(), 400'000u);
  EXPECT_EQ(lines.front(), "{\"time\":0,\"key\":\"hot\",\"value\":1}");
  EXPECT_EQ(lines.back(), "{\"time\":1,\"key\":\"hot\",\"value\":2}");
}

TEST_F(FileSinkTest, AnOpenIntervalIsCommittedWhenTheShardGoesQuiet) {
  append_at(0, {{"\"a\"", "1", 0, 1}});
  append_at(1, {{"\"b\"", "2", 0, 1}});
  append_at(2, {{"\"c\"", "3", 0, 1}});
  // The upper stays at 3 from now on: the interval [1, 3) must still be
  // committed once it is commit_interval old, not only at the next append.
  auto destination = FileDestination::open(dir_.string(), Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_TRUE(destination);
  SinkOptions options;
  options.sink_name = "files";
  options.as_of = 0;
  options.poll_interval = std::chrono::milliseconds(1);
  options.commit_interval = std::chrono::milliseconds(50);
  std::atomic<bool> reached{false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  options.on_progress = [&](const SinkProgress& p) {
    // Not the commit a stopping sink makes on its way out.
    if (p.frontier == Frontier::at(3) && std::chrono::steady_clock::now() < deadline) {
      reached = true;
    }
  };
  options.stop = [&] { return reached || std::chrono::steady_clock::now() > deadline; };
  auto ran = run_sink(*shard_, **destination, options);
  ASSERT_TRUE(ran) << ran.error().to_string();
  EXPECT_TRUE(reached) << "the open interval was committed only when the sink stopped";
  EXPECT_EQ(committed_lines(), expected_lines(all_, 0, 3));
}

// A snapshot into files in bounded parts, each a file named with its
// position; a run stopped mid-snapshot keeps its parts, and the next run
// goes on at the same as_of (though asked for another), skips exactly the
// pairs the parts hold (with a hot key cut across parts) and commits the
// rest: every pair once, the parts first in name order.
TEST_F(FileSinkTest, ASnapshotIntoFilesCommitsInBoundedPartsAndResumes) {
  append_parts_data();

  std::uint64_t parts_seen = 0;
  auto run_parts = [&](Time until, std::optional<Time> as_of,
                       std::uint64_t stop_after_parts) -> Result<SinkProgress> {
    TM_ASSIGN(auto destination,
              FileDestination::open(dir_.string(), Envelope::kUpsert, SinkFormat::kJson));
    SinkOptions options;
    options.sink_name = "files";
    options.as_of = as_of;
    options.until = until;
    options.poll_interval = std::chrono::milliseconds(1);
    options.snapshot_part_bytes = 8 << 10;
    std::uint64_t parts = 0;
    options.on_progress = [&](const SinkProgress& p) {
      if (p.snapshot) ++parts, ++parts_seen;
    };
    options.stop = [&] { return stop_after_parts > 0 && parts >= stop_after_parts; };
    return run_sink(*shard_, *destination, options);
  };
  auto part_names = [&] {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      auto part = parse_snapshot_part(dir_.string(), name);
      EXPECT_TRUE(part) << part.error().message;
      if (part && *part) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  auto stopped = run_parts(3, /*as_of=*/1, /*stop_after_parts=*/3);
  ASSERT_TRUE(stopped) << stopped.error().to_string();
  EXPECT_EQ(stopped->frontier, Frontier::at(0));
  EXPECT_TRUE(stopped->snapshot);
  EXPECT_EQ(parts_seen, 3u);
  // Three parts, nothing else committed: a prefix of the snapshot, and
  // the last part's name says how many pairs that is.
  const std::vector<std::string> three = part_names();
  ASSERT_EQ(three.size(), 3u);
  const std::vector<std::string> prefix = committed_lines();
  auto reopened = FileDestination::open(dir_.string(), Envelope::kUpsert, SinkFormat::kJson);
  ASSERT_TRUE(reopened) << reopened.error().message;
  EXPECT_EQ((*reopened)->progress(), std::nullopt);
  ASSERT_TRUE((*reopened)->snapshot_position().has_value());
  EXPECT_EQ((*reopened)->snapshot_position()->as_of, 1u);
  EXPECT_EQ((*reopened)->snapshot_position()->pairs, prefix.size());
  EXPECT_TRUE((*reopened)->snapshot_position()->check.has_value());
  reopened->reset();  // the directory's lock
  // The sink's hold has not moved past as_of.
  EXPECT_FALSE(Frontier::at(1) < shard_->inspect()->since);

  // Resumed, at as_of 1 although asked for 2: to the end.
  auto resumed = run_parts(3, /*as_of=*/2, 0);
  ASSERT_TRUE(resumed) << resumed.error().to_string();
  EXPECT_EQ(resumed->frontier, Frontier::at(3));
  // About 100 KB of keys and values in 8 KiB parts, the first three kept.
  EXPECT_GE(parts_seen, 10u);
  const std::vector<std::string> all_parts = part_names();
  ASSERT_GE(all_parts.size(), parts_seen - 1);
  EXPECT_TRUE(std::equal(three.begin(), three.end(), all_parts.begin()));
  EXPECT_EQ(committed_lines(), expected_lines(all_, 1, 3));
  // The parts, in name order, then the snapshot's last file: the order
  // the pairs were written (keys increasing).
  std::vector<std::string> in_order;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".json")) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), all_parts.size() + 2);  // + [0, 2) and [2, 3)
  EXPECT_EQ(names[all_parts.size()], committed_name(0, 2, "json"));
  std::string previous_key;
  for (std::size_t i = 0; i + 1 < names.size(); ++i) {
    std::ifstream in(dir_ / names[i]);
    for (std::string line; std::getline(in, line);) {
      const std::string key = line.substr(line.find("\"key\":") + 6);
      const std::string key_only = key.substr(0, key.find(",\"value\""));
      EXPECT_GE(key_only, previous_key) << "in " << names[i];
      previous_key = key_only;
    }
  }
}

// A directory whose parts do not fit the snapshot read again is refused,
// not continued: parts of another shard's snapshot.
TEST_F(FileSinkTest, ResumingPartsOfAnotherSnapshotIsCorruption) {
  append_at(0, {{"\"a\"", "1", 0, 1}, {"\"b\"", "2", 0, 1}, {"\"c\"", "3", 0, 1}});
  {
    auto destination = FileDestination::open(dir_.string(), Envelope::kUpsert, SinkFormat::kJson);
    ASSERT_TRUE(destination) << destination.error().message;
    ASSERT_TRUE((*destination)->begin(Frontier::at(0)));
    SnapshotPosition position{
        .as_of = 0, .key = "\"b\"", .key_pairs = 2, .pairs = 2, .check = std::nullopt};
    ASSERT_TRUE((*destination)->commit_snapshot_part(position));
  }
  auto ran = run(1, 0);
  ASSERT_FALSE(ran);
  EXPECT_EQ(ran.error().kind, ErrorKind::kCorruption) << ran.error().message;
  EXPECT_NE(ran.error().message.find("other pairs"), std::string::npos) << ran.error().message;
}

// The same runner into Kafka (tidemark-kafka-mock in its own process): the
// snapshot, changes while a writer appends, and a restart that resumes from
// the progress topic.
TEST_F(FileSinkTest, IntoKafkaSnapshotThenChangesThenResume) {
  if (kUnderTsan) GTEST_SKIP() << kKafkaUnderTsan;
  auto mock = KafkaMockProcess::start(TIDEMARK_KAFKA_MOCK, {"--topic", "out:4"});
  ASSERT_TRUE(mock) << mock.error().message;
  const KafkaAddress address = *KafkaAddress::parse("kafka://" + (*mock)->brokers() + "/out");
  auto run_kafka = [&](Time until, std::optional<Time> as_of) -> Result<SinkProgress> {
    KafkaDestinationOptions kafka;
    kafka.sink_id = "runner-test";
    kafka.queue_bytes = 256 << 10;
    TM_ASSIGN(auto destination, KafkaDestination::open(address, Envelope::kUpsert, kafka));
    SinkOptions options;
    options.sink_name = "kafka";
    options.as_of = as_of;
    options.until = until;
    options.poll_interval = std::chrono::milliseconds(1);
    options.commit_interval = std::chrono::milliseconds(0);
    return run_sink(*shard_, *destination, options);
  };
  append_at(0, {{"\"a\"", "1", 0, 1}, {"\"b\"", "2", 0, 1}});
  append_at(1, {{"\"a\"", "1", 0, -1}, {"\"a\"", "3", 0, 1}});
  append_at(2, {{"\"hot\"", "7", 0, 5000}});
  std::thread more([&] {
    for (Time t = 3; t < 12; ++t) {
      append_at(t, {{"\"k" + std::to_string(t % 4) + "\"", std::to_string(t), 0, 1},
                    {"\"b\"", "2", 0, t % 2 == 0 ? -1 : 1}});
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  auto first = run_kafka(8, 1);
  more.join();
  ASSERT_TRUE(first) << first.error().to_string();
  EXPECT_EQ(first->frontier, Frontier::at(8));
  auto second = run_kafka(12, std::nullopt);
  ASSERT_TRUE(second) << second.error().to_string();
  EXPECT_EQ(second->frontier, Frontier::at(12));

  std::vector<std::string> lines;
  auto audit = audit_kafka_sink(
      address, "runner-test", std::chrono::seconds(20), [&](const KafkaMessageView& m) -> Status {
        lines.push_back("{\"time\":" + std::string(m.time.value_or("?")) +
                        ",\"key\":" + std::string(m.key) +
                        ",\"value\":" + std::string(m.value.value_or("null")) + "}");
        return {};
      });
  ASSERT_TRUE(audit) << audit.error().message;
  EXPECT_EQ(audit->frontier, Frontier::at(12));
  EXPECT_EQ(audit->outside, 0u);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, expected_lines(all_, 1, 12));
}

// A snapshot into Kafka in bounded parts: several transactions, each with
// its position in the progress topic; a run stopped mid-snapshot keeps its
// parts, the sink's hold stays at or below as_of, and the next run goes on
// at the same as_of (though asked for another) and skips exactly what is
// committed: every pair once.
TEST_F(FileSinkTest, IntoKafkaASnapshotCommitsInBoundedPartsAndResumes) {
  if (kUnderTsan) GTEST_SKIP() << kKafkaUnderTsan;
  auto mock = KafkaMockProcess::start(TIDEMARK_KAFKA_MOCK, {"--topic", "out:4"});
  ASSERT_TRUE(mock) << mock.error().message;
  const KafkaAddress address = *KafkaAddress::parse("kafka://" + (*mock)->brokers() + "/out");
  append_parts_data();

  std::uint64_t parts_seen = 0;
  auto run_kafka = [&](Time until, std::optional<Time> as_of,
                       std::uint64_t stop_after_parts) -> Result<SinkProgress> {
    KafkaDestinationOptions kafka;
    kafka.sink_id = "runner-test";
    kafka.queue_bytes = 256 << 10;
    TM_ASSIGN(auto destination, KafkaDestination::open(address, Envelope::kUpsert, kafka));
    SinkOptions options;
    options.sink_name = "kafka";
    options.as_of = as_of;
    options.until = until;
    options.poll_interval = std::chrono::milliseconds(1);
    options.snapshot_part_bytes = 8 << 10;
    std::uint64_t parts = 0;
    options.on_progress = [&](const SinkProgress& p) {
      if (p.snapshot) ++parts, ++parts_seen;
    };
    options.stop = [&] { return stop_after_parts > 0 && parts >= stop_after_parts; };
    return run_sink(*shard_, *destination, options);
  };
  auto stopped = run_kafka(3, /*as_of=*/1, /*stop_after_parts=*/3);
  ASSERT_TRUE(stopped) << stopped.error().to_string();
  EXPECT_EQ(stopped->frontier, Frontier::at(0));
  EXPECT_TRUE(stopped->snapshot);
  EXPECT_EQ(parts_seen, 3u);

  // Three parts committed, and nothing more: a prefix of the snapshot.
  auto audit_lines = [&](std::vector<std::string>* lines) {
    return audit_kafka_sink(
        address, "runner-test", std::chrono::seconds(20), [&](const KafkaMessageView& m) -> Status {
          lines->push_back("{\"time\":" + std::string(m.time.value_or("?")) +
                           ",\"key\":" + std::string(m.key) +
                           ",\"value\":" + std::string(m.value.value_or("null")) + "}");
          return {};
        });
  };
  std::vector<std::string> prefix;
  auto audit = audit_lines(&prefix);
  ASSERT_TRUE(audit) << audit.error().message;
  EXPECT_EQ(audit->frontier, std::nullopt);
  ASSERT_TRUE(audit->snapshot.has_value());
  EXPECT_EQ(audit->snapshot->as_of, 1u);
  EXPECT_EQ(audit->transactions, 3u);
  EXPECT_EQ(audit->snapshot->pairs, prefix.size());
  EXPECT_GT(prefix.size(), 0u);
  // The sink's hold has not moved past as_of.
  auto info = shard_->inspect();
  ASSERT_TRUE(info) << info.error().to_string();
  bool held = false;
  for (const auto& reader : info->readers) {
    if (reader.id == "c-sink-kafka") {
      held = true;
      EXPECT_FALSE(Frontier::at(1) < reader.since) << reader.since.to_string();
    }
  }
  EXPECT_TRUE(held);
  EXPECT_FALSE(Frontier::at(1) < info->since);

  // Resumed, at as_of 1 although asked for 2: to the end.
  auto resumed = run_kafka(3, /*as_of=*/2, 0);
  ASSERT_TRUE(resumed) << resumed.error().to_string();
  EXPECT_EQ(resumed->frontier, Frontier::at(3));
  std::vector<std::string> lines;
  audit = audit_lines(&lines);
  ASSERT_TRUE(audit) << audit.error().message;
  EXPECT_EQ(audit->frontier, Frontier::at(3));
  EXPECT_EQ(audit->snapshot, std::nullopt);
  EXPECT_EQ(audit->outside, 0u);
  // About 100 KB of keys and values (19,900 pairs of "m" at 4 bytes, 2,000
  // others at about 10) in 8 KiB parts.
  EXPECT_GE(parts_seen, 10u);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, expected_lines(all_, 1, 3));
}

// A part is also bounded in time: with snapshot_part_interval 0 each pair
// is a transaction of its own, and the snapshot still arrives whole.
TEST_F(FileSinkTest, IntoKafkaASnapshotPartIsBoundedInTimeToo) {
  if (kUnderTsan) GTEST_SKIP() << kKafkaUnderTsan;
  auto mock = KafkaMockProcess::start(TIDEMARK_KAFKA_MOCK, {"--topic", "out:2"});
  ASSERT_TRUE(mock) << mock.error().message;
  const KafkaAddress address = *KafkaAddress::parse("kafka://" + (*mock)->brokers() + "/out");
  append_at(0, {{"\"a\"", "1", 0, 1}, {"\"b\"", "2", 0, 3}, {"\"c\"", "3", 0, -2}});
  KafkaDestinationOptions kafka;
  kafka.sink_id = "runner-test";
  kafka.queue_bytes = 256 << 10;
  auto destination = KafkaDestination::open(address, Envelope::kUpsert, kafka);
  ASSERT_TRUE(destination) << destination.error().message;
  SinkOptions options;
  options.sink_name = "kafka";
  options.as_of = 0;
  options.until = 1;
  options.snapshot_part_interval = std::chrono::milliseconds(0);
  std::uint64_t parts = 0;
  options.on_progress = [&](const SinkProgress& p) { parts += p.snapshot ? 1 : 0; };
  auto ran = run_sink(*shard_, **destination, options);
  ASSERT_TRUE(ran) << ran.error().to_string();
  EXPECT_EQ(parts, 6u);  // 1 + 3 + 2 pairs
  std::vector<std::string> lines;
  auto audit = audit_kafka_sink(
      address, "runner-test", std::chrono::seconds(20), [&](const KafkaMessageView& m) -> Status {
        lines.push_back("{\"time\":" + std::string(m.time.value_or("?")) +
                        ",\"key\":" + std::string(m.key) +
                        ",\"value\":" + std::string(m.value.value_or("null")) + "}");
        return {};
      });
  ASSERT_TRUE(audit) << audit.error().message;
  EXPECT_EQ(audit->frontier, Frontier::at(1));
  EXPECT_EQ(audit->transactions, 7u);  // the last one holds only the progress
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, expected_lines(all_, 0, 1));
}

}  // namespace
}  // namespace tidemark
