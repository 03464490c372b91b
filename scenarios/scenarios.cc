// The scenarios of issue #8; scenarios/README.md describes each.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "scenarios/http.h"
#include "scenarios/workload.h"
#include "sink/committed_name.h"
#include "testing/kafka_mock_process.h"
#include "sink/kafka_reader.h"

namespace tidemark::scenarios {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The server's budget (--memory-limit) under a cap: half of it. The other
// half is what no pool accounts for: the binary and its libraries, thread
// stacks, the part builder and compactor buffers, SQLite's cache.
std::vector<std::string> half_the_cap(std::uint64_t cap) {
  return {"--memory-limit", std::to_string(cap / 2)};
}

// Polls `done` until it holds, the timeout passes, or the server dies on
// its own (nothing more will happen then).
bool wait_until(Run& run, const std::function<bool()>& done, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    if (!run.server().unexpected_exit().empty()) return false;
    if (run.failed()) return false;  // a client's refusal (Ingest) ends the wait
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

// tidemark-kafka-mock in its own process: the broker (which holds every
// message) stays out of the server's cap and survives its SIGKILLs.
std::unique_ptr<KafkaMockProcess> start_broker(Run& run, const std::string& topic) {
  auto broker = KafkaMockProcess::start(TIDEMARK_KAFKA_MOCK, {"--topic", topic});
  if (!broker) {
    run.fail("start the Kafka mock broker: " + broker.error().message);
    return nullptr;
  }
  return std::move(*broker);
}

bool create_sink(Run& run, const std::string& name, const std::string& shard,
                 const std::string& to) {
  const std::string body = "{\"name\":\"" + name + "\",\"shard\":\"" + shard + "\",\"to\":\"" + to +
                           "\",\"envelope\":\"upsert\",\"format\":\"json\"}";
  const Reply reply = create_with_retries(run.port(), "/v1/sinks", body, 201, 409);
  return run.check(
      reply.status == 201,
      "create sink " + name + ": " + std::to_string(reply.status) + " " + reply.body + reply.error);
}

// Waits until the sink has committed everything below `frontier`.
bool wait_for_sink(Run& run, const std::string& name, std::int64_t frontier,
                   std::chrono::seconds timeout) {
  std::string last;
  const bool done = wait_until(
      run,
      [&] {
        const Reply reply = http(run.port(), "GET", "/v1/sinks/" + name);
        last = reply.body + reply.error;
        const auto at = json_integer(reply.body, "frontier");
        return reply.status == 200 && at && *at >= frontier;
      },
      timeout);
  return run.check(done, "sink " + name + " did not reach frontier " + std::to_string(frontier) +
                             " within " + std::to_string(timeout.count()) + " s: " + last);
}

// The committed files of a file sink's directory (names not starting with
// '.'), sorted.
std::vector<fs::path> committed_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with('.') && name.ends_with(".json")) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool has_file_in_progress(const fs::path& dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (is_temporary_name(entry.path().filename().string()) && entry.file_size(error) > 0)
      return true;
  }
  return false;
}

// Every line of every committed file of a file sink, in name order.
void for_each_sink_line(const fs::path& dir, const std::function<void(std::string_view)>& fn) {
  std::string line;
  for (const auto& file : committed_files(dir)) {
    std::ifstream in(file);
    while (std::getline(in, line)) fn(line);
  }
}

std::string kafka_sink_id(const std::string& shard, const std::string& sink) {
  return "tidemark/" + shard + "/" + sink;
}

// What a Kafka sink committed, by its progress records. librdkafka's mock
// broker keeps only the newest few MB of a partition (its built-in log
// limit), so millions of messages cannot be read back; each progress
// record lists the broker-assigned offsets of its transaction's messages,
// so their sum is the number the broker took in committed transactions.
// The messages still retained are read and checked one by one.
struct KafkaTally {
  std::uint64_t committed = 0;     // messages inside the progress records' ranges
  std::uint64_t transactions = 0;  // progress records
  std::uint64_t retained = 0;      // committed messages still on the broker, checked
  std::int64_t frontier = -1;      // the last progress record's frontier
};

std::optional<KafkaTally> tally_kafka_sink(
    Run& run, const std::string& brokers, const std::string& topic, const std::string& sink_id,
    const std::function<void(const KafkaMessageView&)>& retained) {
  KafkaTally tally;
  std::map<std::int32_t, std::vector<std::pair<std::int64_t, std::int64_t>>> ranges;
  Status read =
      consume_topic(brokers, topic + "-progress", 120s, [&](const KafkaMessageView& m) -> Status {
        if (m.key != sink_id || !m.value) return {};
        ++tally.transactions;
        tally.frontier = json_integer(*m.value, "frontier").value_or(-1);
        // "offsets": [[partition, first, last], ...]
        std::string_view rest = m.value->substr(m.value->find("\"offsets\""));
        for (auto open = rest.find("[", 10); open != std::string_view::npos;
             open = rest.find("[", open + 1)) {
          std::int64_t p = 0, first = 0, last = 0;
          if (std::sscanf(std::string(rest.substr(open, 64)).c_str(), "[%ld,%ld,%ld]", &p, &first,
                          &last) == 3) {
            ranges[static_cast<std::int32_t>(p)].emplace_back(first, last);
          }
        }
        return {};
      });
  if (!run.check(read.has_value(), "read the Kafka progress topic: " +
                                       (read ? std::string() : read.error().message))) {
    return std::nullopt;
  }
  for (auto& [partition, list] : ranges) {
    std::sort(list.begin(), list.end());
    for (std::size_t i = 0; i < list.size(); ++i) {
      tally.committed += list[i].second - list[i].first + 1;
      run.check(i == 0 || list[i].first > list[i - 1].second,
                "Kafka progress records overlap in partition " + std::to_string(partition));
    }
  }
  read = consume_topic(brokers, topic, 120s, [&](const KafkaMessageView& m) -> Status {
    auto it = ranges.find(m.partition);
    if (it == ranges.end()) return {};
    for (const auto& [first, last] : it->second) {
      if (m.offset >= first && m.offset <= last) {
        ++tally.retained;
        retained(m);
        break;
      }
    }
    return {};
  });
  run.check(read.has_value(),
            "read the Kafka topic: " + (read ? std::string() : read.error().message));
  return tally;
}

// hot-key fan-out -----------------------------------------------------------

void hot_key_fanout(Run& run) {
  constexpr std::int64_t kDiff = 10'000'000;
  const auto broker = start_broker(run, "hot");
  if (!broker) return;
  if (!run.start() || !create_shard(run, "hot")) return;
  const Reply appended =
      http(run.port(), "POST", "/v1/shards/hot/append?lower=0&upper=1",
           "{\"key\":\"hot\",\"value\":1,\"time\":0,\"diff\":" + std::to_string(kDiff) + "}\n");
  if (!run.check(appended.status == 200, "append the hot update: " + appended.body)) return;
  const fs::path files = run.data_dir() / "sinks" / "hot";
  if (!create_sink(run, "hot-file", "hot", "file://" + files.string()) ||
      !create_sink(run, "hot-kafka", "hot", "kafka://" + broker->brokers() + "/hot")) {
    return;
  }
  // Killed while the sinks are fanning the update out.
  const auto delay = std::chrono::milliseconds(300 + run.rng()() % 1500);
  std::this_thread::sleep_for(delay);
  run.log("SIGKILL " + std::to_string(delay.count()) + " ms into the fan-out");
  if (!run.kill_and_restart()) return;
  if (!wait_for_sink(run, "hot-file", 1, 300s) || !wait_for_sink(run, "hot-kafka", 1, 600s)) return;

  std::int64_t file_messages = 0, wrong = 0;
  for_each_sink_line(files, [&](std::string_view line) {
    ++file_messages;
    if (line != R"({"time":0,"key":"hot","value":1})" && wrong++ < 3) {
      run.fail("file sink line unlike the update: " + std::string(line.substr(0, 200)));
    }
  });
  run.check(file_messages == kDiff, "file sink: " + std::to_string(file_messages) +
                                        " messages, not " + std::to_string(kDiff));
  auto kafka = tally_kafka_sink(run, broker->brokers(), "hot", kafka_sink_id("hot", "hot-kafka"),
                                [&](const KafkaMessageView& m) {
                                  if ((m.key != "\"hot\"" || m.value != "1") && wrong++ < 3) {
                                    run.fail("Kafka message unlike the update");
                                  }
                                });
  if (!kafka) return;
  run.check(kafka->committed == std::uint64_t(kDiff) && kafka->frontier == 1,
            "Kafka sink: " + std::to_string(kafka->committed) + " committed messages, not " +
                std::to_string(kDiff));
  run.note("10,000,000 messages in files (" + std::to_string(committed_files(files).size()) +
           " committed files) and in Kafka (" + std::to_string(kafka->transactions) +
           " transactions; the " + std::to_string(kafka->retained) +
           " the mock broker still holds read and checked)");
}

// huge records --------------------------------------------------------------

constexpr std::uint64_t kHugeRecordBytes = 16 * kMiB;
constexpr std::uint64_t kHugeRecordLimit = 17 * kMiB;

std::vector<std::string> huge_record_args(std::uint64_t cap) {
  // A 17 MiB record limit needs a budget of at least 4 x 17 MiB (a record
  // must fit a quarter: the requests pool).
  const std::uint64_t budget = std::max<std::uint64_t>(cap * 5 / 8, 4 * kHugeRecordLimit);
  return {"--memory-limit", std::to_string(budget), "--max-record-bytes",
          std::to_string(kHugeRecordLimit)};
}

void huge_records(Run& run) {
  // One client: each connection may overdraw the requests pool by one
  // partial line (server.h), so concurrent 16 MiB records multiply that.
  constexpr int kRecords = 12, kClients = 1;
  // Each line is 16 MiB exactly: {"key":"r<id>","value":"..."}\n
  const RecordShape shape(kHugeRecordBytes - 32, run.seed());
  Tracker tracker(kRecords);
  if (!run.start() || !create_shard(run, "huge")) return;

  // One record over the limit: 413, the server unharmed, nothing appended.
  std::string over;
  RecordShape(kHugeRecordLimit + 16, run.seed()).append_line(0, over);
  const Reply refused = http(run.port(), "POST", "/v1/shards/huge/append", over);
  run.check(refused.status == 413, "a record of " + std::to_string(over.size()) +
                                       " bytes answered " + std::to_string(refused.status) + " " +
                                       refused.body + refused.error + ", not 413");
  over = std::string();

  Ingest ingest(run, "huge", shape, tracker, 1);
  ingest.start(kClients, UINT64_MAX);
  wait_until(
      run, [&] { return ingest.acked_records() >= kRecords / 2; }, 300s);
  run.log("SIGKILL after " + std::to_string(ingest.acked_records()) + " records acknowledged");
  if (!run.kill_and_restart()) return;
  ingest.wait();
  // The record in flight at the kill got an error; it may or may not be in
  // the shard, and the audit allows either.
  run.note(std::to_string(tracker.count(Tracker::kAcked)) + " records of 16 MiB acknowledged, " +
           std::to_string(tracker.count(Tracker::kInFlight)) + " in flight at the kill");
  run.check(tracker.count(Tracker::kAcked) >= kRecords - kClients,
            "too few records acknowledged: " + ingest.last_error());
  audit_snapshot(run, "huge", shape, tracker);
}

// big ingest ----------------------------------------------------------------

void big_ingest(Run& run) {
  constexpr std::uint64_t kGoal = 2048 * kMiB;
  constexpr std::size_t kValueBytes = 1000, kPerRequest = 256;
  constexpr int kClients = 200;
  const RecordShape shape(kValueBytes, run.seed());
  Tracker tracker(kGoal / (kValueBytes + 20) + 2 * kClients * kPerRequest);
  if (!run.start() || !create_shard(run, "ingest")) return;
  Ingest ingest(run, "ingest", shape, tracker, kPerRequest);
  ingest.start(kClients, kGoal);
  const std::uint64_t kill_at = kGoal / 4 + run.rng()() % (kGoal / 2);
  wait_until(
      run, [&] { return ingest.acked_bytes() >= kill_at; }, 1800s);
  run.log("SIGKILL after " + format_mib(ingest.acked_bytes()) + " acknowledged");
  if (!run.kill_and_restart()) return;
  ingest.wait();
  run.note(format_mib(ingest.acked_bytes()) + " acknowledged in " +
           std::to_string(ingest.requests()) + " requests from 200 clients (" +
           std::to_string(ingest.errors()) + " failed around the kill)");
  audit_snapshot(run, "ingest", shape, tracker);
}

// large snapshot -------------------------------------------------------------

void large_snapshot(Run& run) {
  constexpr std::uint64_t kUpdates = 20'000'000;
  // 100,000 records (about 3.8 MB) a request: each request is all or
  // nothing (no producer), so its body must be within --max-record-bytes
  // (8 MiB at this cap); 500,000 a request were refused with 413 since
  // all-or-nothing appends came in (a94a7ba), and the scenario waited out
  // its timeout.
  constexpr std::size_t kPerRequest = 100'000;
  constexpr int kClients = 4;
  const RecordShape shape(0, run.seed());
  // Room for new ids to replace the requests the kill cut off: the shard
  // ends with at least kUpdates acknowledged updates.
  Tracker tracker(kUpdates + 2 * kClients * kPerRequest);
  if (!run.start() || !create_shard(run, "large")) return;
  {
    Ingest ingest(run, "large", shape, tracker, kPerRequest);
    ingest.start(kClients, UINT64_MAX);
    wait_until(
        run, [&] { return ingest.acked_records() >= kUpdates / 2; }, 1800s);
    run.log("SIGKILL after " + std::to_string(ingest.acked_records()) + " updates acknowledged");
    if (!run.kill_and_restart()) return;
    wait_until(
        run, [&] { return ingest.acked_records() >= kUpdates; }, 1800s);
    ingest.stop();
    run.check(ingest.acked_records() >= kUpdates,
              "only " + std::to_string(ingest.acked_records()) +
                  " updates acknowledged: " + ingest.last_error());
  }
  double started = run.elapsed();
  const std::uint64_t lines = audit_snapshot(run, "large", shape, tracker);
  run.note("snapshot read in " + std::to_string(int(run.elapsed() - started)) + " s");
  const auto upper = shard_upper(run, "large");
  if (!upper) return;
  // Listen from 0 to the upper: every update once, in time order.
  started = run.elapsed();
  Audit audit(run, tracker, "listen of large");
  std::uint64_t updates = 0, progress = 0;
  std::int64_t last_time = 0;
  const Reply reply = get_lines(
      run.port(), "/v1/shards/large/listen?from=0&until=" + std::to_string(*upper),
      [&](std::string_view line) {
        if (line.starts_with("{\"progress\"")) {
          ++progress;
          return true;
        }
        ++updates;
        const auto key = json_string(line, "key");
        const auto time = json_integer(line, "time");
        if (!key || !time || *time < last_time) {
          run.fail("listen line out of order or unreadable: " + std::string(line.substr(0, 200)));
          return false;
        }
        last_time = *time;
        audit.saw(*key, json_integer(line, "diff").value_or(0));
        return true;
      });
  if (!run.check(reply.status == 200 && reply.error.empty(),
                 "listen: " + std::to_string(reply.status) + " " + reply.body + reply.error)) {
    return;
  }
  audit.finish();
  run.check(updates == lines, "listen gave " + std::to_string(updates) + " updates, the snapshot " +
                                  std::to_string(lines));
  run.note("listen of " + std::to_string(updates) + " updates and " + std::to_string(progress) +
           " progress lines in " + std::to_string(int(run.elapsed() - started)) + " s");
}

// slow blob ------------------------------------------------------------------

constexpr double kFlatTolerance = 1.10;

std::vector<std::string> slow_blob_args(std::uint64_t cap) {
  auto args = half_the_cap(cap);
  args.insert(args.end(), {"--inject-blob-latency-ms", "200"});
  return args;
}

// Memory is flat when the peak RSS over the second half of a window is no
// more than 10% above the peak over its first half.
void check_flat(Run& run, double from, double to, const std::string& what) {
  std::uint64_t first = 0, second = 0;
  const double middle = (from + to) / 2;
  for (const auto& s : run.server().samples()) {
    if (s.seconds < from || s.seconds > to) continue;
    (s.seconds < middle ? first : second) =
        std::max(s.seconds < middle ? first : second, s.rss_bytes);
  }
  run.note(what + ": RSS peak " + format_mib(first) + " in the first half, " + format_mib(second) +
           " in the second");
  run.check(first > 0 && second <= first * kFlatTolerance,
            what + ": memory grew from " + format_mib(first) + " to " + format_mib(second));
}

void slow_blob(Run& run) {
  constexpr std::size_t kValueBytes = 200, kPerRequest = 100;
  constexpr auto kPhase = 20s;
  const RecordShape shape(kValueBytes, run.seed());
  Tracker tracker(4'000'000);
  if (!run.start() || !create_shard(run, "slow")) return;
  Ingest ingest(run, "slow", shape, tracker, kPerRequest);
  ingest.start(32, UINT64_MAX);
  const double start1 = run.elapsed();
  std::this_thread::sleep_for(kPhase);
  check_flat(run, start1 + 2, run.elapsed(), "before the kill");
  const std::uint64_t before = ingest.acked_bytes();
  run.log("SIGKILL after " + format_mib(before) + " acknowledged");
  if (!run.kill_and_restart()) return;
  const double start2 = run.elapsed();
  std::this_thread::sleep_for(kPhase);
  check_flat(run, start2 + 2, run.elapsed(), "after the restart");
  ingest.stop();
  run.note(format_mib(ingest.acked_bytes()) + " acknowledged at 200 ms a blob call (" +
           format_mib(before) + " before the kill)");
  run.check(ingest.acked_bytes() > before, "no appends went through after the restart");
  // The audit reads every part at full speed: at 200 ms a read it would
  // take minutes (the steady state is what this scenario measures).
  run.server().stop();
  run.server().set_serve_args(half_the_cap(run.cap()));
  if (!run.start()) return;
  audit_snapshot(run, "slow", shape, tracker);
}

// sink restart ----------------------------------------------------------------

// Checks a sink's committed output: each record once, at most, as the
// tracker allows.
void audit_file_sink(Run& run, const fs::path& dir, const Tracker& tracker) {
  Audit audit(run, tracker, "file sink");
  std::uint64_t lines = 0;
  for_each_sink_line(dir, [&](std::string_view line) {
    ++lines;
    if (auto key = json_string(line, "key")) audit.saw(*key);
  });
  const auto present = audit.finish();
  run.note("file sink: " + std::to_string(lines) + " messages in " +
           std::to_string(committed_files(dir).size()) + " files, " + std::to_string(present) +
           " records");
}

// Each record is one message: the committed count must equal the records
// in the shard (none twice, none missing); the retained ones are checked
// against the tracker.
void audit_kafka(Run& run, const KafkaMockProcess& broker, const std::string& topic,
                 const std::string& sink, const Tracker& tracker, std::uint64_t records) {
  Audit audit(run, tracker, "Kafka sink (retained messages)");
  auto kafka = tally_kafka_sink(run, broker.brokers(), topic, kafka_sink_id("events", sink),
                                [&](const KafkaMessageView& m) {
                                  if (m.key.size() > 2)
                                    audit.saw(m.key.substr(1, m.key.size() - 2));
                                });
  if (!kafka) return;
  audit.finish(/*complete=*/false);
  run.check(kafka->committed == records, "Kafka sink committed " +
                                             std::to_string(kafka->committed) + " messages for " +
                                             std::to_string(records) + " records");
  run.note("Kafka sink: " + std::to_string(kafka->committed) + " messages in " +
           std::to_string(kafka->transactions) + " transactions, the last " +
           std::to_string(kafka->retained) + " read back");
}

struct FileSnapshot {
  std::map<std::string, std::uintmax_t> sizes;
};

FileSnapshot list_files(const fs::path& dir) {
  FileSnapshot out;
  for (const auto& file : committed_files(dir))
    out.sizes[file.filename().string()] = fs::file_size(file);
  return out;
}

void sink_restart(Run& run) {
  constexpr std::uint64_t kRecords = 2'000'000;
  constexpr std::size_t kPerRequest = 50'000;
  const RecordShape shape(40, run.seed());
  Tracker tracker(kRecords);
  const auto broker = start_broker(run, "events");
  if (!broker) return;
  if (!run.start() || !create_shard(run, "events")) return;
  const fs::path files = run.data_dir() / "sinks" / "events";

  // Phase 1: a shard of 1,000,000 records, then both sinks; killed while
  // they write the snapshot.
  Ingest ingest(run, "events", shape, tracker, kPerRequest);
  ingest.start(2, kRecords / 2 * 60);
  ingest.wait();
  auto upper = shard_upper(run, "events");
  if (!run.check(upper.has_value(), "the shard's upper")) return;
  if (!create_sink(run, "events-file", "events", "file://" + files.string()) ||
      !create_sink(run, "events-kafka", "events", "kafka://" + broker->brokers() + "/events")) {
    return;
  }
  const bool writing = wait_until(
      run, [&] { return has_file_in_progress(files); }, 60s);
  run.check(writing, "the file sink never started its snapshot file");
  std::this_thread::sleep_for(std::chrono::milliseconds(run.rng()() % 300));
  run.check(committed_files(files).empty(), "the snapshot was committed before the kill");
  run.log("SIGKILL in the middle of the sinks' snapshot");
  if (!run.kill_and_restart()) return;
  if (!wait_for_sink(run, "events-file", *upper, 300s) ||
      !wait_for_sink(run, "events-kafka", *upper, 300s)) {
    return;
  }
  const FileSnapshot after_snapshot = list_files(files);

  // Phase 2: appends while the sinks follow; killed once they have
  // committed something past the snapshot.
  ingest.start(2, UINT64_MAX);
  const bool followed = wait_until(
      run, [&] { return list_files(files).sizes.size() > after_snapshot.sizes.size(); }, 120s);
  run.check(followed, "the file sink committed nothing after the snapshot");
  const FileSnapshot before_kill = list_files(files);
  run.log("SIGKILL while the sinks follow (" + std::to_string(before_kill.sizes.size()) +
          " files committed)");
  if (!run.kill_and_restart()) return;
  ingest.wait();
  upper = shard_upper(run, "events");
  if (!run.check(upper.has_value(), "the shard's upper")) return;
  if (!wait_for_sink(run, "events-file", *upper, 300s) ||
      !wait_for_sink(run, "events-kafka", *upper, 300s)) {
    return;
  }
  // What was committed before the kill is still there, unchanged.
  const FileSnapshot final_files = list_files(files);
  for (const auto& [name, size] : before_kill.sizes) {
    auto it = final_files.sizes.find(name);
    run.check(it != final_files.sizes.end() && it->second == size,
              "committed file " + name + " changed or vanished after the restart");
  }
  audit_file_sink(run, files, tracker);
  const std::uint64_t records = audit_snapshot(run, "events", shape, tracker);
  audit_kafka(run, *broker, "events", "events-kafka", tracker, records);
}

}  // namespace

const std::vector<Scenario>& all_scenarios() {
  static const std::vector<Scenario> scenarios = {
      {"hot-key-fanout",
       "one update with diff 10,000,000 sunk to files and to Kafka; killed mid fan-out", 128 * kMiB,
       true, half_the_cap, hot_key_fanout},
      {"huge-records",
       "records of 16 MiB, each all or nothing, one over the limit (413); killed mid-way",
       128 * kMiB, true, huge_record_args, huge_records},
      {"big-ingest", "2 GiB of 1 KiB records from 200 concurrent clients; killed mid-way",
       128 * kMiB, false, half_the_cap, big_ingest},
      {"large-snapshot", "20,000,000 updates, then snapshot and listen over HTTP; killed mid-load",
       128 * kMiB, false, half_the_cap, large_snapshot},
      {"slow-blob", "steady ingest from 32 clients at 200 ms per blob call; killed at 20 s",
       128 * kMiB, false, slow_blob_args, slow_blob},
      {"sink-restart",
       "file and Kafka sinks killed mid-snapshot and mid-follow; resume without re-emitting",
       128 * kMiB, true, half_the_cap, sink_restart},
  };
  return scenarios;
}

}  // namespace tidemark::scenarios
