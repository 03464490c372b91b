// Crash test for `tidemark sink run`, into a file:// directory and into
// Kafka (tidemark-kafka-mock in its own process): the sink is killed with
// SIGKILL many times, mid-snapshot and mid-listen, and restarted each time;
// the committed output must then hold exactly the messages a single
// uninterrupted run would have written (no duplicate, no gap, no
// overlapping ranges). Kafka's committed output is read back with a real
// consumer: the messages inside committed transactions' offset ranges (the
// mock does not hide aborted transactions; see
// src/sink/kafka_destination.h).
//
// Setup: a shard whose times 0..4 hold ~200,000 records (among them a hot
// key with 300,000 copies, so the snapshot at as_of 4 fans out to ~500,000
// lines), then a background thread appends the times 5..U-1 one
// `tidemark append` process at a time while the sink is being killed. The
// thread keeps a reference model of everything it appended, from which the
// expected upsert messages are computed:
//   - the snapshot: per key, the values consolidated at time 4; one line
//     {"time":4,"key":K,"value":V} per copy of a positive value, one with
//     value null per before copy left unpaired;
//   - each later (key, time): its values' net diffs at that time; befores
//     (negative) pair with afters (positive), so one line per after copy and
//     a null line per before copy beyond the afters.
// With the upsert envelope a line shows only the after, so the multiset of
// lines does not depend on the order the pairs are formed in.
//
// Rounds: round 0 kills 1-20 ms after the spawn (startup), the next rounds
// kill once the snapshot written so far reached a random fraction of its
// expected size (the file's temporary, or the messages in the topic: a
// mid-snapshot write), the rest after a random 100-1800 ms
// (mid-listen: the sink commits a file per second). After each kill the
// committed files must be contiguous from 0, and every file committed
// earlier must still be there, unchanged. The appender holds back its last
// times until the kill rounds are over, so no killed run can reach U; a
// final run then follows the shard to U and exits 0.
//
// A second test kills a Kafka snapshot committed in small parts
// (--snapshot-part-bytes) between and inside its parts, with a hot key of
// 50,000 copies that spans many parts.
//
// TIDEMARK_SINK_CRASH_SEED=<n> replays a seed (printed at the start). The
// scratch directory is kept when the test fails.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server_process.h"
#include "sink/file_destination.h"
#include "sink/kafka_reader.h"
#include "testing/kafka_mock_process.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Time = std::uint64_t;

constexpr Time kAsOf = 4;
constexpr Time kUntil = 5 + 300;    // U: the sink runs to it
constexpr Time kHoldBack = 30;      // the last times wait for the kill rounds to end
constexpr int kEarlyRounds = 1;     // killed 1-20 ms after the spawn
constexpr int kSnapshotRounds = 3;  // killed mid-write of the snapshot
constexpr int kListenRounds = 6;    // killed after 100-1800 ms
constexpr char kSnapshotTemporaryPrefix[] = ".00000000000000000000-";

using tidemark::testing::slurp;

// Spawns `tidemark --data DATA args...` with stdin from /dev/null and
// stdout/stderr into files. Returns the pid, or -1.
pid_t spawn_tidemark(const fs::path& data, const std::vector<std::string>& args,
                     const fs::path& out, const fs::path& err) {
  std::vector<std::string> words = {"--data", data.string()};
  words.insert(words.end(), args.begin(), args.end());
  return tidemark::testing::spawn_tidemark(words, err, out);
}

// Runs a tidemark command to its end; returns its exit code (-1 if it did
// not exit normally) and what it wrote to stderr in `err_text`.
int run_tidemark(const fs::path& data, const std::vector<std::string>& args,
                 const fs::path& scratch, const std::string& tag, std::string* err_text) {
  const fs::path out = scratch / (tag + ".out"), err = scratch / (tag + ".err");
  pid_t pid = spawn_tidemark(data, args, out, err);
  if (pid < 0) {
    *err_text = "spawn failed";
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  *err_text = slurp(err) + slurp(out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// --- the reference model ----------------------------------------------------

using Counts = std::map<std::string, std::int64_t>;  // value -> diff

std::string upsert_line(Time time, const std::string& key, const std::string& value) {
  return "{\"time\":" + std::to_string(time) + ",\"key\":" + key + ",\"value\":" + value + "}";
}

// The upsert lines of one (key, time) group with these net diffs.
void expect_group(Time time, const std::string& key, const Counts& net,
                  std::vector<std::string>* out) {
  std::int64_t befores = 0, afters = 0;
  for (const auto& [value, diff] : net) {
    if (diff > 0) {
      afters += diff;
      for (std::int64_t i = 0; i < diff; ++i) out->push_back(upsert_line(time, key, value));
    } else {
      befores -= diff;
    }
  }
  for (std::int64_t i = afters; i < befores; ++i) out->push_back(upsert_line(time, key, "null"));
}

// What was appended: the current contents, and batches of NDJSON records.
class Model {
 public:
  explicit Model(std::uint64_t seed) : rng_(seed) {}

  // Starts the records of time t.
  void begin(Time t) {
    time_ = t;
    records_.clear();
    net_.clear();
    count_ = 0;
  }
  // The NDJSON of the time begun, and its record count.
  const std::string& records() const { return records_; }
  std::uint64_t count() const { return count_; }
  // The expected lines of the time begun (for times after as_of).
  void expect_time(std::vector<std::string>* out) const {
    for (const auto& [key, net] : net_) {
      Counts nonzero;
      for (const auto& [value, diff] : net) {
        if (diff != 0) nonzero[value] = diff;
      }
      expect_group(time_, key, nonzero, out);
    }
  }
  // The expected lines of the snapshot at `as_of` (after its times).
  void expect_snapshot(Time as_of, std::vector<std::string>* out) const {
    for (const auto& [key, values] : state_) expect_group(as_of, key, values, out);
  }

  void add(const std::string& key, const std::string& value, std::int64_t diff) {
    records_ += "{\"key\":" + key + ",\"value\":" + value + ",\"time\":" + std::to_string(time_) +
                ",\"diff\":" + std::to_string(diff) + "}\n";
    ++count_;
    net_[key][value] += diff;
    Counts& values = state_[key];
    if ((values[value] += diff) == 0) values.erase(value);
  }

  // A key never used before: a string, a number or an object.
  std::string new_key() {
    const std::uint64_t n = next_key_++;
    std::string key;
    switch (n % 3) {
      case 0:
        key = "\"k" + std::to_string(n) + "\"";
        break;
      case 1:
        key = std::to_string(1000000 + n);
        break;
      default:
        key = "{\"id\":" + std::to_string(n) + "}";
    }
    keys_.push_back(key);
    return key;
  }
  std::string new_value() {
    const std::uint64_t n = next_value_++;
    switch (pick(4)) {
      case 0:
        return std::to_string(n);
      case 1:
        return "\"s" + std::to_string(n) + "\"";
      case 2:
        return "{\"v\":" + std::to_string(n) + ",\"tags\":[\"a\",\"b\"]}";
      default:
        return "[" + std::to_string(n) + ",true]";
    }
  }
  std::uint64_t pick(std::uint64_t n) {
    return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng_);
  }

  // One random change of a few records: insert, update, delete, an insert
  // retracted in the same time, or a double insert.
  void random_op() {
    const std::uint64_t kind = pick(100);
    if (kind < 25 || keys_.empty()) {
      add(new_key(), new_value(), 1);
      return;
    }
    const std::string key = keys_[pick(keys_.size())];
    const auto live = live_value(key);
    if (kind < 70) {  // update (or re-insert of a deleted key)
      if (live) add(key, *live, -1);
      add(key, new_value(), 1);
    } else if (kind < 85) {  // delete
      if (live) add(key, *live, -1);
    } else if (kind < 95) {  // inserted and retracted in the same time: no message
      const std::string value = new_value();
      add(key, value, 1);
      add(key, value, -1);
    } else {  // two copies: a primary-key violation, two lines
      add(new_key(), new_value(), 2);
    }
  }

  // Moves every copy of the hot key to one new value, or a part of them.
  void hot_change(bool all) {
    const Counts values = state_[kHot];
    const std::string target = "\"h" + std::to_string(next_value_++) + "\"";
    for (const auto& [value, count] : values) {
      if (count <= 0) continue;
      const std::int64_t moved = all ? count : std::min<std::int64_t>(count, 1000);
      add(kHot, value, -moved);
      add(kHot, target, all ? moved : moved / 2);
      if (!all) break;
    }
  }

  static constexpr const char* kHot = "\"hot\"";

 private:
  std::optional<std::string> live_value(const std::string& key) {
    auto it = state_.find(key);
    if (it == state_.end()) return std::nullopt;
    for (const auto& [value, count] : it->second) {
      if (count > 0) return value;
    }
    return std::nullopt;
  }

  std::mt19937_64 rng_;
  Time time_ = 0;
  std::string records_;
  std::uint64_t count_ = 0;
  std::map<std::string, Counts> net_;    // of the time begun
  std::map<std::string, Counts> state_;  // everything appended
  std::vector<std::string> keys_;
  std::uint64_t next_key_ = 0;
  std::uint64_t next_value_ = 0;
};

// --- the destination --------------------------------------------------------

struct Committed {
  Time lower = 0;
  Time upper = 0;
  std::string name;
  std::uintmax_t size = 0;
};

struct Listing {
  std::vector<Committed> committed;  // sorted by name (= by lower)
  std::vector<std::string> temporaries;
  std::vector<std::string> other;
};

std::optional<Committed> parse_name(const std::string& name) {
  if (name.size() != 46 || name[20] != '-' || name.substr(41) != ".json") return std::nullopt;
  for (std::size_t i : {std::size_t{0}, std::size_t{21}}) {
    for (std::size_t j = i; j < i + 20; ++j) {
      if (name[j] < '0' || name[j] > '9') return std::nullopt;
    }
  }
  return Committed{std::stoull(name.substr(0, 20)), std::stoull(name.substr(21, 20)), name, 0};
}

Listing list_destination(const fs::path& dir) {
  Listing listing;
  if (!fs::exists(dir)) return listing;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    std::error_code ec;
    if (name == tidemark::FileDestination::kLockFileName) continue;  // held by each run
    if (name.starts_with(".")) {
      listing.temporaries.push_back(name);
    } else if (auto committed = parse_name(name)) {
      committed->size = fs::file_size(entry.path(), ec);
      listing.committed.push_back(*committed);
    } else {
      listing.other.push_back(name);
    }
  }
  std::sort(listing.committed.begin(), listing.committed.end(),
            [](const Committed& a, const Committed& b) { return a.name < b.name; });
  std::sort(listing.temporaries.begin(), listing.temporaries.end());
  return listing;
}

// The size of the snapshot's temporary being written, if any: one not in
// `stale` (a killed run's leftover, sorted).
std::optional<std::uintmax_t> snapshot_temporary_size(const fs::path& dir,
                                                      const std::vector<std::string>& stale) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(kSnapshotTemporaryPrefix) &&
        !std::binary_search(stale.begin(), stale.end(), name)) {
      std::error_code size_ec;
      auto size = fs::file_size(it->path(), size_ec);
      if (!size_ec) return size;
    }
  }
  return std::nullopt;
}

// Committed files are contiguous from 0 and do not overlap; every file seen
// before is still there with the same size.
void check_committed(const Listing& listing, std::map<std::string, std::uintmax_t>& seen) {
  Time expected_lower = 0;
  for (const Committed& file : listing.committed) {
    ASSERT_EQ(file.lower, expected_lower) << "gap or overlap at " << file.name;
    ASSERT_LT(file.lower, file.upper) << file.name;
    expected_lower = file.upper;
  }
  std::map<std::string, std::uintmax_t> now;
  for (const Committed& file : listing.committed) now[file.name] = file.size;
  for (const auto& [name, size] : seen) {
    auto it = now.find(name);
    ASSERT_NE(it, now.end()) << "committed file " << name << " disappeared";
    ASSERT_EQ(it->second, size) << "committed file " << name << " changed";
  }
  seen = std::move(now);
}

// Progress lines ("sink s: frontier F, ...") a run printed.
int progress_lines(const std::string& err) {
  int n = 0;
  for (std::size_t at = 0; (at = err.find("sink s: frontier ", at)) != std::string::npos; ++at) ++n;
  return n;
}

// --- the destinations ---------------------------------------------------------

// What a killed run left behind.
struct Observed {
  bool snapshot_committed = false;
  bool snapshot_open = false;  // the killed run had written part of the snapshot
  bool listen_open = false;    // the killed run had a listen interval open
  std::size_t commits = 0;     // committed files / transactions so far
  Time frontier = 0;
  std::size_t cleaned = 0;  // leftovers of earlier kills the run cleaned up
};

class CrashDestination {
 public:
  virtual ~CrashDestination() = default;
  virtual std::string url() const = 0;
  // Before each spawn.
  virtual void before_round() = 0;
  // How much of the snapshot the running sink has written (bytes or
  // messages, in the unit of snapshot_size), nullopt when it is not writing
  // one; and whether the snapshot is committed.
  virtual std::optional<std::uintmax_t> snapshot_written() = 0;
  virtual bool snapshot_committed() = 0;
  virtual std::uintmax_t snapshot_size(std::size_t pairs, std::uintmax_t bytes) const = 0;
  virtual std::chrono::microseconds poll_interval() const = 0;
  // Whether snapshot_written() is slow enough (many broker round trips)
  // that the sink must stand still (SIGSTOP) while it is measured: else,
  // on a loaded machine, the sink can pass the threshold and commit
  // during one measurement, and the kill misses the write it aims at.
  virtual bool measure_stopped() const { return false; }
  // After a kill: checks what must hold (nothing committed changed, no gap)
  // and says what the kill interrupted.
  virtual void after_kill(Observed* observed) = 0;
  // After the final run: checks the destination and collects the lines.
  virtual void final_lines(std::vector<std::string>* lines) = 0;
};

class FileCrashDestination final : public CrashDestination {
 public:
  explicit FileCrashDestination(fs::path dir) : dir_(std::move(dir)) {}
  std::string url() const override { return "file://" + dir_.string(); }
  void before_round() override { stale_ = list_destination(dir_).temporaries; }
  std::optional<std::uintmax_t> snapshot_written() override {
    return snapshot_temporary_size(dir_, stale_);
  }
  bool snapshot_committed() override { return !list_destination(dir_).committed.empty(); }
  std::uintmax_t snapshot_size(std::size_t, std::uintmax_t bytes) const override { return bytes; }
  std::chrono::microseconds poll_interval() const override {
    return std::chrono::microseconds(100);
  }

  void after_kill(Observed* observed) override {
    const Listing listing = list_destination(dir_);
    ASSERT_NO_FATAL_FAILURE(check_committed(listing, seen_));
    ASSERT_TRUE(listing.other.empty()) << listing.other.front();
    observed->snapshot_committed = !listing.committed.empty();
    for (const std::string& name : listing.temporaries) {
      if (std::binary_search(stale_.begin(), stale_.end(), name)) continue;
      (name.starts_with(kSnapshotTemporaryPrefix) ? observed->snapshot_open
                                                  : observed->listen_open) = true;
    }
    for (const std::string& name : stale_) {
      if (!std::binary_search(listing.temporaries.begin(), listing.temporaries.end(), name)) {
        ++observed->cleaned;
      }
    }
    observed->commits = listing.committed.size();
    observed->frontier = listing.committed.empty() ? 0 : listing.committed.back().upper;
  }

  void final_lines(std::vector<std::string>* lines) override {
    const Listing listing = list_destination(dir_);
    ASSERT_NO_FATAL_FAILURE(check_committed(listing, seen_));
    EXPECT_TRUE(listing.temporaries.empty()) << listing.temporaries.front();
    EXPECT_TRUE(listing.other.empty());
    ASSERT_FALSE(listing.committed.empty());
    EXPECT_EQ(listing.committed.front().upper, kAsOf + 1) << "the snapshot file";
    EXPECT_EQ(listing.committed.back().upper, kUntil);
    for (const Committed& file : listing.committed) {
      std::ifstream in(dir_ / file.name, std::ios::binary);
      for (std::string line; std::getline(in, line);) {
        ASSERT_TRUE(line.starts_with("{\"time\":")) << file.name << ": " << line;
        const Time time = std::stoull(line.substr(8));
        if (file.lower == 0) {
          ASSERT_EQ(time, kAsOf) << file.name << ": " << line;
        } else {
          ASSERT_TRUE(time >= file.lower && time < file.upper) << file.name << ": " << line;
        }
        lines->push_back(std::move(line));
      }
    }
  }

 private:
  fs::path dir_;
  std::vector<std::string> stale_;  // killed runs' leftovers, before this round
  std::map<std::string, std::uintmax_t> seen_;
};

// The Kafka sink against tidemark-kafka-mock, read back with a real
// consumer. The mock shows aborted transactions to every consumer, so the
// committed messages are those inside the progress records' offset ranges
// (tidemark::audit_kafka_sink; see src/sink/kafka_destination.h).
class KafkaCrashDestination final : public CrashDestination {
 public:
  static constexpr char kSinkId[] = "tidemark/s/s";
  static constexpr std::chrono::seconds kTimeout{30};

  explicit KafkaCrashDestination(std::string brokers)
      : address_(*tidemark::KafkaAddress::parse("kafka://" + brokers + "/out")) {
    char errstr[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), errstr, sizeof errstr);
    rd_kafka_conf_set(conf, "group.id", "crash-test-watermarks", errstr, sizeof errstr);
    watcher_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
  }
  ~KafkaCrashDestination() override {
    if (watcher_ != nullptr) rd_kafka_destroy(watcher_);
  }
  std::string url() const override { return "kafka://" + address_.brokers + "/out"; }

  void before_round() override {
    round_start_end_ = data_end();
    outside_before_ = audit_.outside;
  }
  std::optional<std::uintmax_t> snapshot_written() override {
    const std::int64_t end = data_end();
    if (end <= round_start_end_) return std::nullopt;
    return static_cast<std::uintmax_t>(end - round_start_end_);
  }
  bool snapshot_committed() override {
    auto frontier = read_frontier();
    return frontier.has_value();
  }
  std::uintmax_t snapshot_size(std::size_t pairs, std::uintmax_t) const override { return pairs; }
  // The sink runs this long between measurements, each of which queries
  // every partition's watermarks with the sink stopped.
  std::chrono::microseconds poll_interval() const override { return std::chrono::milliseconds(5); }
  bool measure_stopped() const override { return true; }

  void after_kill(Observed* observed) override {
    const tidemark::KafkaSinkAudit before = audit_;
    ASSERT_NO_FATAL_FAILURE(audit(nullptr));
    // Nothing committed is ever taken back.
    if (before.frontier) {
      ASSERT_TRUE(audit_.frontier.has_value());
      ASSERT_FALSE(*audit_.frontier < *before.frontier);
    }
    ASSERT_GE(audit_.committed, before.committed);
    ASSERT_GE(audit_.transactions, before.transactions);
    observed->snapshot_committed = audit_.frontier.has_value();
    const bool left_uncommitted = audit_.outside > outside_before_;
    if (!observed->snapshot_committed) {
      observed->snapshot_open = left_uncommitted;
    } else if (before.frontier) {
      observed->listen_open = left_uncommitted;
    }
    observed->commits = audit_.transactions;
    observed->frontier = audit_.frontier ? audit_.frontier->time() : 0;
  }

  void final_lines(std::vector<std::string>* lines) override {
    ASSERT_NO_FATAL_FAILURE(audit(lines));
    ASSERT_TRUE(audit_.frontier.has_value());
    EXPECT_EQ(*audit_.frontier, tidemark::Frontier::at(kUntil));
    // The first committed progress is the snapshot's.
    std::optional<Time> first;
    // The first record that is not a part of the snapshot.
    auto read =
        tidemark::consume_topic(address_.brokers, address_.progress_topic, kTimeout,
                                [&](const tidemark::KafkaMessageView& m) -> tidemark::Status {
                                  if (first || m.key != kSinkId || !m.value) return {};
                                  auto record = tidemark::KafkaProgressRecord::parse(*m.value);
                                  if (!record->snapshot) first = record->frontier.time();
                                  return {};
                                });
    ASSERT_TRUE(read) << read.error().message;
    EXPECT_EQ(first, kAsOf + 1) << "the snapshot transaction";
    std::printf("kafka: %llu committed transactions, %llu messages outside them (aborted)\n",
                static_cast<unsigned long long>(audit_.transactions),
                static_cast<unsigned long long>(audit_.outside));
  }

 private:
  // The sum of the data topic's partitions' end offsets.
  std::int64_t data_end() {
    std::int64_t sum = 0;
    for (std::int32_t p = 0; p < kPartitions; ++p) {
      std::int64_t low = 0, high = 0;
      if (rd_kafka_query_watermark_offsets(watcher_, "out", p, &low, &high, 5000) ==
          RD_KAFKA_RESP_ERR_NO_ERROR) {
        sum += high;
      }
    }
    return sum;
  }

  std::optional<tidemark::Frontier> read_frontier() {
    std::optional<tidemark::Frontier> frontier;
    // A part of the snapshot is no frontier yet.
    auto read =
        tidemark::consume_topic(address_.brokers, address_.progress_topic, kTimeout,
                                [&](const tidemark::KafkaMessageView& m) -> tidemark::Status {
                                  if (m.key != kSinkId || !m.value) return {};
                                  auto record = tidemark::KafkaProgressRecord::parse(*m.value);
                                  if (!record->snapshot) frontier = record->frontier;
                                  return {};
                                });
    EXPECT_TRUE(read) << read.error().message;
    return frontier;
  }

  void audit(std::vector<std::string>* lines) {
    std::string bad;
    auto audited = tidemark::audit_kafka_sink(
        address_, kSinkId, kTimeout, [&](const tidemark::KafkaMessageView& m) -> tidemark::Status {
          if (lines == nullptr) return {};
          if (!m.time) {
            bad = "a message without a tidemark-time header";
            return {};
          }
          lines->push_back("{\"time\":" + std::string(*m.time) + ",\"key\":" + std::string(m.key) +
                           ",\"value\":" + std::string(m.value.value_or("null")) + "}");
          return {};
        });
    ASSERT_TRUE(audited) << audited.error().message;
    ASSERT_EQ(bad, "");
    audit_ = *audited;
  }

 public:
  // Many partitions: the mock keeps only about 5 MB per partition.
  static constexpr int kPartitions = 64;

 private:
  tidemark::KafkaAddress address_;
  rd_kafka_t* watcher_ = nullptr;
  tidemark::KafkaSinkAudit audit_;
  std::int64_t round_start_end_ = 0;
  std::uint64_t outside_before_ = 0;
};

// --- the test ---------------------------------------------------------------

void run_crash_test(const std::string& kind) {
  const fs::path scratch =
      fs::temp_directory_path() / ("tidemark-sinkcrash-" + kind + "-" + std::to_string(getpid()));
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const fs::path data = scratch / "data";
  std::unique_ptr<tidemark::KafkaMockProcess> broker;
  std::unique_ptr<CrashDestination> destination;
  if (kind == "kafka") {
    auto started = tidemark::KafkaMockProcess::start(
        TIDEMARK_KAFKA_MOCK,
        {"--topic", "out:" + std::to_string(KafkaCrashDestination::kPartitions), "--topic",
         "out-progress:1"});
    ASSERT_TRUE(started) << started.error().message;
    broker = std::move(*started);
    destination = std::make_unique<KafkaCrashDestination>(broker->brokers());
  } else {
    destination = std::make_unique<FileCrashDestination>(scratch / "out");
  }
  const std::string url = destination->url();
  std::uint64_t seed = std::random_device{}();
  if (const char* env = std::getenv("TIDEMARK_SINK_CRASH_SEED")) seed = std::stoull(env);
  std::printf("seed %llu, scratch %s\n", static_cast<unsigned long long>(seed),
              scratch.string().c_str());
  SCOPED_TRACE("seed " + std::to_string(seed) + ", scratch " + scratch.string());
  std::mt19937_64 rng(seed);
  const auto started = Clock::now();
  auto elapsed_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
  };

  std::string err;
  ASSERT_EQ(run_tidemark(data, {"shard", "create", "s"}, scratch, "create", &err), 0) << err;

  // Times 0..4 in one append: ~200,000 records, the hot key's 300,000 copies
  // (10,000 into Kafka: all copies go to one partition, and the mock keeps
  // only about 5 MB per partition).
  const std::int64_t hot_copies = kind == "kafka" ? 10000 : 300000;
  Model model(seed ^ 0x5eed);
  std::string setup;
  std::uint64_t setup_records = 0;
  for (Time t = 0; t <= kAsOf; ++t) {
    model.begin(t);
    if (t == 0) {
      for (int i = 0; i < 40000; ++i) model.add(model.new_key(), model.new_value(), 1);
    } else {
      while (model.count() < 40000) model.random_op();
    }
    if (t == 2) model.add(Model::kHot, "\"h\"", hot_copies);
    if (t == 3) model.hot_change(false);
    setup += model.records();
    setup_records += model.count();
  }
  std::vector<std::string> expected;
  model.expect_snapshot(kAsOf, &expected);
  const std::size_t snapshot_pairs = expected.size();
  std::uintmax_t snapshot_bytes = 0;
  for (const std::string& line : expected) snapshot_bytes += line.size() + 1;
  std::ofstream(scratch / "setup.ndjson", std::ios::binary) << setup;
  setup.clear();
  ASSERT_EQ(run_tidemark(data,
                         {"append", "s", "--lower", "0", "--upper", std::to_string(kAsOf + 1),
                          "--input", (scratch / "setup.ndjson").string()},
                         scratch, "setup", &err),
            0)
      << err;
  fs::remove(scratch / "setup.ndjson");
  std::printf("setup: %llu records at times 0..%llu, snapshot %zu pairs (%ju bytes), %lld ms\n",
              static_cast<unsigned long long>(setup_records),
              static_cast<unsigned long long>(kAsOf), snapshot_pairs, snapshot_bytes,
              static_cast<long long>(elapsed_ms()));

  // The background appender: times kAsOf+1 .. kUntil-1, one process each.
  std::atomic<bool> rounds_done{false};
  std::atomic<bool> stop_appender{false};
  std::atomic<Time> appended_upper{kAsOf + 1};
  std::mutex appender_mutex;
  std::string appender_error;
  std::uint64_t listen_records = 0;
  std::vector<std::string> listen_expected;
  std::thread appender([&] {
    std::mt19937_64 pace(seed + 1);
    for (Time t = kAsOf + 1; t < kUntil && !stop_appender; ++t) {
      while (t >= kUntil - kHoldBack && !rounds_done && !stop_appender) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (stop_appender) return;
      model.begin(t);
      const int ops = static_cast<int>(5 + model.pick(40));
      for (int i = 0; i < ops; ++i) model.random_op();
      if (t == kAsOf + 60 || t == kUntil - 10) model.hot_change(true);
      if (t % 37 == 0) model.hot_change(false);
      const fs::path input = scratch / "append.ndjson";
      std::ofstream(input, std::ios::binary) << model.records();
      std::string append_err;
      const int status = run_tidemark(data,
                                      {"append", "s", "--lower", std::to_string(t), "--upper",
                                       std::to_string(t + 1), "--input", input.string()},
                                      scratch, "append", &append_err);
      if (status != 0) {
        std::lock_guard lock(appender_mutex);
        appender_error = "append at " + std::to_string(t) + " exited " + std::to_string(status) +
                         ": " + append_err;
        return;
      }
      listen_records += model.count();
      model.expect_time(&listen_expected);
      appended_upper = t + 1;
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 15)(pace)));
    }
  });
  struct JoinOnExit {
    std::thread& thread;
    std::atomic<bool>& stop;
    ~JoinOnExit() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } join_on_exit{appender, stop_appender};

  // The kill rounds.
  const std::string until = std::to_string(kUntil);
  const std::vector<std::string> sink_args = {
      "sink", "run", "s", "--to", url, "--as-of", std::to_string(kAsOf), "--until", until};
  int kills = 0, kills_before_snapshot = 0, kills_mid_snapshot_write = 0, kills_after_snapshot = 0,
      kills_with_open_listen_file = 0, killed_progress_lines = 0, temporaries_cleaned = 0;
  const int rounds = kEarlyRounds + kSnapshotRounds + kListenRounds;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    {
      std::lock_guard lock(appender_mutex);
      ASSERT_EQ(appender_error, "");
    }
    destination->before_round();
    const bool snapshot_committed_before = destination->snapshot_committed();
    const fs::path err_path = scratch / ("sink-" + std::to_string(round) + ".err");
    const auto spawned = Clock::now();
    pid_t pid = spawn_tidemark(data, sink_args, scratch / "sink.out", err_path);
    ASSERT_GT(pid, 0);
    // When to kill: a deadline, or (mid-snapshot rounds) once the snapshot's
    // temporary holds `threshold` bytes.
    std::optional<std::uintmax_t> threshold;
    auto deadline = spawned;
    std::string mode;
    if (round < kEarlyRounds) {
      mode = "startup";
      deadline += std::chrono::milliseconds(std::uniform_int_distribution<int>(1, 20)(rng));
    } else if (round < kEarlyRounds + kSnapshotRounds && !snapshot_committed_before) {
      mode = "snapshot";
      threshold = static_cast<std::uintmax_t>(
          static_cast<double>(destination->snapshot_size(snapshot_pairs, snapshot_bytes)) *
          std::uniform_real_distribution<double>(0.05, 0.9)(rng));
      // A fallback only: a sink measured stopped writes slowly when the
      // machine is loaded (6.7 s to a kill with three busy loops on two
      // cores).
      deadline += std::chrono::seconds(30);
    } else {
      mode = "listen";
      // From the snapshot's commit on (a killed run restarts it).
      while (!destination->snapshot_committed() &&
             Clock::now() - spawned < std::chrono::seconds(20)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      deadline = Clock::now() +
                 std::chrono::milliseconds(std::uniform_int_distribution<int>(100, 1800)(rng));
    }
    bool exited = false;
    int status = 0;
    for (;;) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        exited = true;
        break;
      }
      if (Clock::now() >= deadline) break;
      if (threshold) {
        const bool stop = destination->measure_stopped();
        if (stop) {
          // Stopped, the sink cannot write on or commit while it is
          // measured; it is killed stopped, or continued.
          if (kill(pid, SIGSTOP) != 0) break;
          const pid_t r = waitpid(pid, &status, WUNTRACED);
          if (r == pid && !WIFSTOPPED(status)) {
            exited = true;
            break;
          }
        }
        auto size = destination->snapshot_written();
        if (size && *size >= *threshold) break;
        if (stop) kill(pid, SIGCONT);
        // Already committed (the threshold was not met in time): kill now.
        if (!size && destination->snapshot_committed()) break;
      }
      std::this_thread::sleep_for(threshold ? destination->poll_interval()
                                            : std::chrono::microseconds(500));
    }
    ASSERT_FALSE(exited) << "the sink exited on its own (status " << status
                         << "): " << slurp(err_path);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status << ": " << slurp(err_path);
    const auto lived =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - spawned).count();
    ++kills;
    const std::string run_err = slurp(err_path);
    killed_progress_lines += progress_lines(run_err);

    Observed observed;
    ASSERT_NO_FATAL_FAILURE(destination->after_kill(&observed));
    temporaries_cleaned += static_cast<int>(observed.cleaned);
    if (observed.snapshot_committed) {
      ++kills_after_snapshot;
      if (observed.listen_open) ++kills_with_open_listen_file;
    } else {
      ++kills_before_snapshot;
      if (observed.snapshot_open) ++kills_mid_snapshot_write;
    }
    std::printf(
        "round %d (%s): killed after %lld ms; %s%s; %zu commits, frontier %llu; shard upper %llu; "
        "%d progress lines\n",
        round, mode.c_str(), static_cast<long long>(lived),
        observed.snapshot_committed
            ? "after the snapshot commit"
            : (observed.snapshot_open ? "mid-snapshot write" : "before the snapshot write"),
        observed.listen_open ? ", a listen interval open" : "", observed.commits,
        static_cast<unsigned long long>(observed.frontier),
        static_cast<unsigned long long>(appended_upper.load()), progress_lines(run_err));
  }
  rounds_done = true;

  // The final run follows the shard to U and exits 0.
  // The final run gets 60 s from when the appender is done (a slow build,
  // such as ASan's, appends slowly too).
  auto final_started = Clock::now();
  const fs::path final_err = scratch / "sink-final.err";
  pid_t pid = spawn_tidemark(data, sink_args, scratch / "sink.out", final_err);
  ASSERT_GT(pid, 0);
  int status = 0;
  for (;;) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    {
      std::lock_guard lock(appender_mutex);
      if (!appender_error.empty()) kill(pid, SIGKILL);
    }
    if (appended_upper.load() < kUntil) final_started = Clock::now();
    if (Clock::now() - final_started > std::chrono::seconds(60)) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL() << "the final run did not reach " << kUntil
             << " within 60 s of the last append: " << slurp(final_err);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string final_text = slurp(final_err);
  appender.join();
  ASSERT_EQ(appender_error, "");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "final run status " << status << ": " << final_text;
  ASSERT_EQ(appended_upper.load(), kUntil);

  std::vector<std::string> lines;
  ASSERT_NO_FATAL_FAILURE(destination->final_lines(&lines));
  expected.insert(expected.end(), listen_expected.begin(), listen_expected.end());
  std::sort(lines.begin(), lines.end());
  std::sort(expected.begin(), expected.end());
  if (lines != expected) {
    std::vector<std::string> missing, extra;
    std::set_difference(expected.begin(), expected.end(), lines.begin(), lines.end(),
                        std::back_inserter(missing));
    std::set_difference(lines.begin(), lines.end(), expected.begin(), expected.end(),
                        std::back_inserter(extra));
    std::string sample;
    for (std::size_t i = 0; i < std::min<std::size_t>(5, missing.size()); ++i) {
      sample += "\n  missing " + missing[i];
    }
    for (std::size_t i = 0; i < std::min<std::size_t>(5, extra.size()); ++i) {
      sample += "\n  extra " + extra[i];
    }
    FAIL() << lines.size() << " lines written, " << expected.size() << " expected; "
           << missing.size() << " missing, " << extra.size() << " extra (duplicates)" << sample;
  }

  std::printf(
      "%d kills: %d before the snapshot commit (%d mid-snapshot write), %d after it (%d with a "
      "listen file open); %d progress lines from killed runs, %d from the final run; %d "
      "temporaries of killed runs "
      "deleted by the next run\n"
      "%zu pairs verified (%zu snapshot, %zu from %llu records at times %llu..%llu), %lld ms\n",
      kills, kills_before_snapshot, kills_mid_snapshot_write, kills_after_snapshot,
      kills_with_open_listen_file, killed_progress_lines, progress_lines(final_text),
      temporaries_cleaned, lines.size(), snapshot_pairs, lines.size() - snapshot_pairs,
      static_cast<unsigned long long>(listen_records), static_cast<unsigned long long>(kAsOf + 1),
      static_cast<unsigned long long>(kUntil - 1), static_cast<long long>(elapsed_ms()));
  EXPECT_GE(kills_before_snapshot, 1) << "no kill landed before the snapshot was committed";
  EXPECT_GE(kills_mid_snapshot_write, 1) << "no kill landed while the snapshot was written";
  EXPECT_GE(kills_after_snapshot, 1) << "no kill landed after the snapshot was committed";
  EXPECT_GE(kills_with_open_listen_file, 1) << "no kill landed with a listen interval open";
  if (!::testing::Test::HasFailure()) fs::remove_all(scratch);
}

TEST(SinkCrashTest, FileSinkKilledMidSnapshotAndMidListenRestartsExactlyOnce) {
  run_crash_test("file");
}

TEST(SinkCrashTest, KafkaSinkKilledMidSnapshotAndMidListenRestartsExactlyOnce) {
  run_crash_test("kafka");
}

// The shard "s" the snapshot-in-parts tests read: 20,000 keys and a hot
// key of `hot_copies` copies at time 0, then 10,000 random changes at 1,
// appended with the real binary. `expected`: the snapshot's lines at
// as_of, sorted.
void create_parts_shard(const fs::path& data, const fs::path& scratch, std::uint64_t seed,
                        Time as_of, std::int64_t hot_copies, std::vector<std::string>* expected) {
  std::string err;
  ASSERT_EQ(run_tidemark(data, {"shard", "create", "s"}, scratch, "create", &err), 0) << err;
  Model model(seed ^ 0x5eed);
  std::string setup;
  model.begin(0);
  for (int i = 0; i < 20000; ++i) model.add(model.new_key(), model.new_value(), 1);
  model.add(Model::kHot, "\"h\"", hot_copies);
  setup += model.records();
  model.begin(1);
  while (model.count() < 10000) model.random_op();
  setup += model.records();
  model.expect_snapshot(as_of, expected);
  std::sort(expected->begin(), expected->end());
  std::ofstream(scratch / "setup.ndjson", std::ios::binary) << setup;
  ASSERT_EQ(run_tidemark(data,
                         {"append", "s", "--lower", "0", "--upper", std::to_string(as_of + 1),
                          "--input", (scratch / "setup.ndjson").string()},
                         scratch, "setup", &err),
            0)
      << err;
}

// Fails naming the counts and one missing and one extra line, unless the
// sorted `lines` are the sorted `expected`.
void expect_same_lines(const std::vector<std::string>& lines,
                       const std::vector<std::string>& expected) {
  if (lines == expected) return;
  std::vector<std::string> missing, extra;
  std::set_difference(expected.begin(), expected.end(), lines.begin(), lines.end(),
                      std::back_inserter(missing));
  std::set_difference(lines.begin(), lines.end(), expected.begin(), expected.end(),
                      std::back_inserter(extra));
  FAIL() << lines.size() << " lines written, " << expected.size() << " expected; " << missing.size()
         << " missing, " << extra.size() << " extra (duplicates)"
         << (missing.empty() ? "" : "\n  missing " + missing.front())
         << (extra.empty() ? "" : "\n  extra " + extra.front());
}

// A Kafka snapshot in parts (a transaction per --snapshot-part-bytes),
// killed with SIGKILL a random 0-40 ms after one of its parts commits, so
// that the kill lands between two parts or inside the next one, and
// restarted each time: the final output must be the snapshot exactly, no
// message twice, none missing. A hot key with a diff of 50,000 sorts among
// the first keys and spans many parts, so parts begin and end inside its
// fan-out and a resumed run skips into the middle of it.
TEST(SinkCrashTest, KafkaSnapshotInPartsKilledBetweenPartsResumesExactlyOnce) {
  constexpr Time kPartsAsOf = 1;
  constexpr std::int64_t kHotCopies = 50'000;
  constexpr int kRounds = 6;
  constexpr char kSinkId[] = "tidemark/s/s";
  const fs::path scratch =
      fs::temp_directory_path() / ("tidemark-sinkparts-" + std::to_string(getpid()));
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const fs::path data = scratch / "data";
  auto broker = tidemark::KafkaMockProcess::start(
      TIDEMARK_KAFKA_MOCK, {"--topic", "out:16", "--topic", "out-progress:1"});
  ASSERT_TRUE(broker) << broker.error().message;
  const auto address = *tidemark::KafkaAddress::parse("kafka://" + (*broker)->brokers() + "/out");
  std::uint64_t seed = std::random_device{}();
  if (const char* env = std::getenv("TIDEMARK_SINK_CRASH_SEED")) seed = std::stoull(env);
  std::printf("seed %llu, scratch %s\n", static_cast<unsigned long long>(seed),
              scratch.string().c_str());
  SCOPED_TRACE("seed " + std::to_string(seed) + ", scratch " + scratch.string());
  std::mt19937_64 rng(seed);

  std::vector<std::string> expected;
  ASSERT_NO_FATAL_FAILURE(
      create_parts_shard(data, scratch, seed, kPartsAsOf, kHotCopies, &expected));

  // The progress topic's end offset: grows by one with each commit.
  char errstr[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", address.brokers.c_str(), errstr, sizeof errstr);
  rd_kafka_conf_set(conf, "group.id", "parts-test-watermarks", errstr, sizeof errstr);
  std::unique_ptr<rd_kafka_t, void (*)(rd_kafka_t*)> watcher(
      rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr), &rd_kafka_destroy);
  ASSERT_NE(watcher, nullptr) << errstr;
  auto progress_end = [&] {
    std::int64_t low = 0, high = 0;
    return rd_kafka_query_watermark_offsets(watcher.get(), "out-progress", 0, &low, &high, 5000) ==
                   RD_KAFKA_RESP_ERR_NO_ERROR
               ? high
               : std::int64_t{-1};
  };
  auto audit = [&](std::vector<std::string>* lines) {
    return tidemark::audit_kafka_sink(
        address, kSinkId, std::chrono::seconds(30),
        [&](const tidemark::KafkaMessageView& m) -> tidemark::Status {
          if (lines != nullptr) {
            lines->push_back("{\"time\":" + std::string(m.time.value_or("?")) +
                             ",\"key\":" + std::string(m.key) +
                             ",\"value\":" + std::string(m.value.value_or("null")) + "}");
          }
          return {};
        });
  };

  const std::vector<std::string> sink_args = {"sink",
                                              "run",
                                              "s",
                                              "--to",
                                              "kafka://" + address.brokers + "/out",
                                              "--as-of",
                                              std::to_string(kPartsAsOf),
                                              "--until",
                                              std::to_string(kPartsAsOf + 1),
                                              "--snapshot-part-bytes",
                                              "32768"};
  int kills_mid_snapshot = 0;
  std::uint64_t last_pairs = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::int64_t start_end = progress_end();
    const fs::path err_path = scratch / ("sink-" + std::to_string(round) + ".err");
    pid_t pid = spawn_tidemark(data, sink_args, scratch / "sink.out", err_path);
    ASSERT_GT(pid, 0);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    int status = 0;
    bool exited = false;
    for (;;) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      ASSERT_LT(Clock::now(), deadline) << "no part committed: " << slurp(err_path);
      if (progress_end() > start_end) break;  // a part committed in this run
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (exited) {  // it finished the snapshot before the kill
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(err_path);
      break;
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 40)(rng)));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    auto audited = audit(nullptr);
    ASSERT_TRUE(audited) << audited.error().message;
    if (audited->frontier) {
      std::printf("round %d: the snapshot completed before the kill\n", round);
      break;
    }
    ASSERT_TRUE(audited->snapshot.has_value());
    EXPECT_GT(audited->snapshot->pairs, last_pairs) << "no progress in this round";
    last_pairs = audited->snapshot->pairs;
    ++kills_mid_snapshot;
    std::printf("round %d: killed mid-snapshot, %llu pairs committed in %llu transactions\n", round,
                static_cast<unsigned long long>(last_pairs),
                static_cast<unsigned long long>(audited->transactions));
  }

  // The final run completes the snapshot and exits 0.
  {
    std::string final_err;
    ASSERT_EQ(run_tidemark(data, sink_args, scratch, "sink-final", &final_err), 0) << final_err;
  }
  std::vector<std::string> lines;
  auto audited = audit(&lines);
  ASSERT_TRUE(audited) << audited.error().message;
  EXPECT_EQ(audited->frontier, tidemark::Frontier::at(kPartsAsOf + 1));
  EXPECT_FALSE(audited->snapshot.has_value());

  // The parts: several, and at least one ends inside the hot key's fan-out.
  std::size_t parts = 0, parts_inside_hot = 0;
  auto read = tidemark::consume_topic(
      address.brokers, address.progress_topic, std::chrono::seconds(30),
      [&](const tidemark::KafkaMessageView& m) -> tidemark::Status {
        if (m.key != kSinkId || !m.value) return {};
        auto record = tidemark::KafkaProgressRecord::parse(*m.value);
        if (!record) return std::unexpected(record.error());
        if (!record->snapshot) return {};
        ++parts;
        EXPECT_EQ(record->frontier, tidemark::Frontier::at(0));
        EXPECT_EQ(record->snapshot->as_of, kPartsAsOf);
        if (record->snapshot->key == Model::kHot &&
            record->snapshot->key_pairs < static_cast<std::uint64_t>(kHotCopies)) {
          ++parts_inside_hot;
        }
        return {};
      });
  ASSERT_TRUE(read) << read.error().message;
  std::sort(lines.begin(), lines.end());
  ASSERT_NO_FATAL_FAILURE(expect_same_lines(lines, expected));
  std::printf(
      "%d kills mid-snapshot; %zu snapshot parts (%zu ending inside the hot key) and the last "
      "transaction, %llu transactions committed in all, %llu messages outside them (aborted); "
      "%zu pairs verified\n",
      kills_mid_snapshot, parts, parts_inside_hot,
      static_cast<unsigned long long>(audited->transactions),
      static_cast<unsigned long long>(audited->outside), lines.size());
  EXPECT_GE(kills_mid_snapshot, 2) << "too few kills landed mid-snapshot";
  EXPECT_GE(parts, 3u);
  EXPECT_GE(parts_inside_hot, 1u);
  if (!::testing::Test::HasFailure()) fs::remove_all(scratch);
}

// The same for a file sink: each part a file named with its position,
// SIGKILLed a random 0-40 ms after a part's file appears, restarted each
// time. The directory must end with the snapshot exactly (no line twice,
// none missing), its parts first in name order and keys increasing
// throughout, and `sink audit` must agree at every kill. A kill that lands
// after a restart resumed inside the hot key checks that a resumed run
// records the key of its next part's last pair (the part's check).
TEST(SinkCrashTest, FileSnapshotInPartsKilledBetweenPartsResumesExactlyOnce) {
  constexpr Time kPartsAsOf = 1;
  constexpr std::int64_t kHotCopies = 50'000;
  constexpr int kRounds = 10;
  const fs::path scratch =
      fs::temp_directory_path() / ("tidemark-fileparts-" + std::to_string(getpid()));
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const fs::path data = scratch / "data";
  const fs::path out_dir = scratch / "out";
  std::uint64_t seed = std::random_device{}();
  if (const char* env = std::getenv("TIDEMARK_SINK_CRASH_SEED")) seed = std::stoull(env);
  std::printf("seed %llu, scratch %s\n", static_cast<unsigned long long>(seed),
              scratch.string().c_str());
  SCOPED_TRACE("seed " + std::to_string(seed) + ", scratch " + scratch.string());
  std::mt19937_64 rng(seed);

  std::vector<std::string> expected;
  ASSERT_NO_FATAL_FAILURE(
      create_parts_shard(data, scratch, seed, kPartsAsOf, kHotCopies, &expected));

  // The committed names of the directory, sorted: parts first.
  auto output_names = [&] {
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!name.starts_with(".") && name.ends_with(".json")) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  auto is_part = [](const std::string& name) { return name.size() > 46; };
  // `sink audit`'s summary line, as text.
  auto audit = [&](const std::string& tag) {
    std::string text;
    const int status = run_tidemark(
        data, {"sink", "audit", "s", "--to", "file://" + out_dir.string()}, scratch, tag, &text);
    EXPECT_EQ(status, 0) << text;
    return text;
  };

  const std::vector<std::string> sink_args = {"sink",
                                              "run",
                                              "s",
                                              "--to",
                                              "file://" + out_dir.string(),
                                              "--as-of",
                                              std::to_string(kPartsAsOf),
                                              "--until",
                                              std::to_string(kPartsAsOf + 1),
                                              "--snapshot-part-bytes",
                                              "8192"};
  int kills_mid_snapshot = 0;
  std::size_t last_parts = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::size_t start_parts = output_names().size();
    const fs::path err_path = scratch / ("sink-" + std::to_string(round) + ".err");
    pid_t pid = spawn_tidemark(data, sink_args, scratch / "sink.out", err_path);
    ASSERT_GT(pid, 0);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    int status = 0;
    bool exited = false;
    for (;;) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      ASSERT_LT(Clock::now(), deadline) << "no part committed: " << slurp(err_path);
      if (output_names().size() > start_parts) break;  // a part committed in this run
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (exited) {  // it finished the snapshot before the kill
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(err_path);
      break;
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 40)(rng)));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    const std::vector<std::string> names = output_names();
    if (!names.empty() && !is_part(names.back())) {
      std::printf("round %d: the snapshot completed before the kill\n", round);
      break;
    }
    EXPECT_GT(names.size(), last_parts) << "no progress in this round";
    last_parts = names.size();
    const std::string summary = audit("audit-" + std::to_string(round));
    EXPECT_NE(
        summary.find("\"frontier\":null,\"snapshot\":{\"as_of\":" + std::to_string(kPartsAsOf)),
        std::string::npos)
        << summary;
    ++kills_mid_snapshot;
    std::printf("round %d: killed mid-snapshot, %zu parts committed\n", round, names.size());
  }

  // The final run completes the snapshot and exits 0.
  {
    std::string final_err;
    ASSERT_EQ(run_tidemark(data, sink_args, scratch, "sink-final", &final_err), 0) << final_err;
  }
  const std::string summary = audit("audit-final");
  EXPECT_NE(summary.find("\"frontier\":" + std::to_string(kPartsAsOf + 1) + ",\"files\":"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("\"outside\":0}"), std::string::npos) << summary;

  // Every line, in name order: keys never go down (the snapshot's order),
  // and the parts' cuts, some inside the hot key.
  const std::vector<std::string> names = output_names();
  ASSERT_GE(names.size(), 4u);
  EXPECT_FALSE(is_part(names.back())) << names.back();
  std::vector<std::string> lines;
  std::size_t cuts_inside_hot = 0;
  const std::string hot_prefix =
      "{\"time\":" + std::to_string(kPartsAsOf) + ",\"key\":" + std::string(Model::kHot) + ",";
  for (const std::string& name : names) {
    std::ifstream in(out_dir / name, std::ios::binary);
    bool first = true;
    for (std::string line; std::getline(in, line); first = false) {
      if (first && !lines.empty() && lines.back().starts_with(hot_prefix) &&
          line.starts_with(hot_prefix)) {
        ++cuts_inside_hot;
      }
      lines.push_back(line);
    }
  }
  std::vector<std::string> sorted_lines = lines;
  std::sort(sorted_lines.begin(), sorted_lines.end());
  ASSERT_NO_FATAL_FAILURE(expect_same_lines(sorted_lines, expected));
  std::printf(
      "%d kills mid-snapshot; %zu parts and the last file (%zu cuts inside the hot key); "
      "%zu pairs verified\n",
      kills_mid_snapshot, names.size() - 1, cuts_inside_hot, lines.size());
  EXPECT_GE(kills_mid_snapshot, 2) << "too few kills landed mid-snapshot";
  EXPECT_GE(cuts_inside_hot, 1u);
  if (!::testing::Test::HasFailure()) fs::remove_all(scratch);
}

}  // namespace
