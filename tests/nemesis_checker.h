// The nemesis test's checker (tests/nemesis_test.cc): what the clients sent
// and were told, what the readers saw, and the verdicts on all of it. It
// works from the servers' raw NDJSON lines with code of its own (no engine
// code decides a verdict), so a bug shared by the engine and its parsers
// cannot hide here.
//
// Records are JSON objects {"key": K, "value": V} whose keys are unique
// across the run, each appended with diff 1. Times are the shard's.
//
//   - SnapshotFollower and ListenFollower take a stream's lines as they
//     arrive, check what can be checked at once (order, diffs, progress),
//     keep a digest (snapshot) or the updates (listen), and say how to
//     resume after a broken connection or an error line.
//   - check_history() gives the verdicts at the end, against the history
//     read after the faults healed (a listen from 0 to the final upper).
//
// Thread-compatible: a follower is fed by one thread; Observations are
// gathered under the test's own lock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace tidemark::testing::nemesis {

using Time = std::uint64_t;

// A multiset of (key, value) with diffs, as the sum of diff x hash(key,
// value) and the sum of diffs: two collections that differ almost surely
// have different digests, and digests subtract.
struct Digest {
  std::int64_t count = 0;
  std::uint64_t sum = 0;

  static std::uint64_t hash(std::string_view key, std::string_view value) {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a SplitMix64 finaliser
    const auto mix = [&h](std::string_view bytes) {
      for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
    };
    mix(key);
    mix(std::string_view("\x1f", 1));
    mix(value);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
  }
  void add(std::string_view key, std::string_view value, std::int64_t diff) {
    count += diff;
    sum += static_cast<std::uint64_t>(diff) * hash(key, value);
  }
  Digest operator-(const Digest& other) const {
    return Digest{count - other.count, sum - other.sum};
  }
  bool operator==(const Digest&) const = default;
  std::string describe() const {
    return std::to_string(count) + " rows (hash " + std::to_string(sum) + ")";
  }
};

// One update of a listen, or of the history. key and value are JSON text
// as the server wrote it.
struct Update {
  Time time = 0;
  std::string key;
  std::string value;
  std::int64_t diff = 0;
};

// --- parsing the lines -------------------------------------------------------

// The JSON string token at the start of `text` (quotes and escapes kept),
// or nullopt when there is none.
inline std::optional<std::string_view> json_string_token(std::string_view text) {
  if (text.empty() || text[0] != '"') return std::nullopt;
  for (std::size_t i = 1; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '"') {
      return text.substr(0, i + 1);
    }
  }
  return std::nullopt;
}

// The decoded contents of a JSON string token (the escapes a server writes
// for ASCII: \" \\ \/ \b \f \n \r \t and \u00XX).
inline std::string json_unquote(std::string_view token) {
  std::string out;
  for (std::size_t i = 1; i + 1 < token.size(); ++i) {
    if (token[i] != '\\') {
      out += token[i];
      continue;
    }
    const char c = token[++i];
    switch (c) {
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u':
        out += static_cast<char>(std::stoi(std::string(token.substr(i + 1, 4)), nullptr, 16));
        i += 4;
        break;
      default:
        out += c;
    }
  }
  return out;
}

// An integer JSON token at the start of `text`, and its length.
inline std::optional<std::pair<std::int64_t, std::size_t>> json_integer(std::string_view text) {
  std::size_t i = 0;
  if (i < text.size() && text[i] == '-') ++i;
  const std::size_t digits = i;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  if (i == digits || i - digits > 18) return std::nullopt;
  return std::pair{std::stoll(std::string(text.substr(0, i))), i};
}

// A row line {"key":K,"value":V[,"time":T],"diff":D}: K a JSON string, V an
// integer (the records of this test), T present iff `with_time`.
inline std::optional<Update> parse_row(std::string_view line, bool with_time) {
  constexpr std::string_view kKey = "{\"key\":", kValue = ",\"value\":", kTime = ",\"time\":",
                             kDiff = ",\"diff\":";
  if (!line.starts_with(kKey)) return std::nullopt;
  std::string_view rest = line.substr(kKey.size());
  auto key = json_string_token(rest);
  if (!key) return std::nullopt;
  rest.remove_prefix(key->size());
  if (!rest.starts_with(kValue)) return std::nullopt;
  rest.remove_prefix(kValue.size());
  auto value = json_integer(rest);
  if (!value) return std::nullopt;
  Update update{.time = 0,
                .key = std::string(*key),
                .value = std::string(rest.substr(0, value->second)),
                .diff = 0};
  rest.remove_prefix(value->second);
  if (with_time) {
    if (!rest.starts_with(kTime)) return std::nullopt;
    rest.remove_prefix(kTime.size());
    auto time = json_integer(rest);
    if (!time || time->first < 0) return std::nullopt;
    update.time = static_cast<Time>(time->first);
    rest.remove_prefix(time->second);
  }
  if (!rest.starts_with(kDiff)) return std::nullopt;
  rest.remove_prefix(kDiff.size());
  auto diff = json_integer(rest);
  if (!diff || rest.substr(diff->second) != "}") return std::nullopt;
  update.diff = diff->first;
  return update;
}

// {"progress":P}: P, or nullopt for another line (a closed frontier, null,
// never happens here: the shard is never closed).
inline std::optional<Time> parse_progress(std::string_view line) {
  constexpr std::string_view kProgress = "{\"progress\":";
  if (!line.starts_with(kProgress)) return std::nullopt;
  auto time = json_integer(line.substr(kProgress.size()));
  if (!time || time->first < 0 || line.substr(kProgress.size() + time->second) != "}") {
    return std::nullopt;
  }
  return static_cast<Time>(time->first);
}

// {"error":E,"resume":Q}: (E, Q) decoded, or nullopt for another line.
inline std::optional<std::pair<std::string, std::string>> parse_error_line(std::string_view line) {
  constexpr std::string_view kError = "{\"error\":", kResume = ",\"resume\":";
  if (!line.starts_with(kError)) return std::nullopt;
  std::string_view rest = line.substr(kError.size());
  auto error = json_string_token(rest);
  if (!error) return std::nullopt;
  rest.remove_prefix(error->size());
  if (!rest.starts_with(kResume)) return std::pair{json_unquote(*error), std::string()};
  rest.remove_prefix(kResume.size());
  auto resume = json_string_token(rest);
  if (!resume || rest.substr(resume->size()) != "}") return std::nullopt;
  return std::pair{json_unquote(*error), json_unquote(*resume)};
}

// The number after `"name":` in a one-line JSON object, nullopt when it is
// absent, null or not an integer.
inline std::optional<std::int64_t> integer_field(std::string_view json, std::string_view name) {
  const std::string start = "\"" + std::string(name) + "\":";
  const auto at = json.find(start);
  if (at == std::string_view::npos) return std::nullopt;
  auto number = json_integer(json.substr(at + start.size()));
  if (!number) return std::nullopt;
  return number->first;
}

// Percent-encoding of everything but A-Z a-z 0-9 - _ . ~
inline std::string url_encode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// --- following streams -------------------------------------------------------

enum class LineKind { kRow, kProgress, kError, kMalformed };

// A snapshot at `as_of`, over as many requests as it takes.
struct SnapshotObservation {
  Time as_of = 0;
  Digest digest;
  std::size_t rows = 0;
  int resumes = 0;
  std::vector<std::string> problems;
};

class SnapshotFollower {
 public:
  explicit SnapshotFollower(Time as_of) { observation_.as_of = as_of; }

  // The query of the first request.
  std::string query() const { return "as_of=" + std::to_string(observation_.as_of); }

  LineKind feed(std::string_view line) {
    if (auto error = parse_error_line(line)) {
      error_ = error->first;
      resume_ = error->second;
      if (!resume_.starts_with(query())) {
        problem("an error line's resume query \"" + resume_ + "\" does not continue " + query());
      }
      return LineKind::kError;
    }
    auto row = parse_row(line, /*with_time=*/false);
    if (!row) {
      problem("malformed snapshot line: " + std::string(line));
      return LineKind::kMalformed;
    }
    if (row->diff != 1)
      problem("snapshot row with diff " + std::to_string(row->diff) + ": " + std::string(line));
    if (last_ && std::tie(row->key, row->value) <= std::tie(last_->first, last_->second)) {
      problem("snapshot rows out of order (or twice): " + std::string(line) + " after " +
              last_->first + " " + last_->second);
    }
    last_ = std::pair{row->key, row->value};
    observation_.digest.add(row->key, row->value, row->diff);
    ++observation_.rows;
    return LineKind::kRow;
  }

  // After a broken connection: goes on after the last row received, as
  // the README says a client may (the row's JSON text, URL-encoded).
  std::string resume_after_break() {
    ++observation_.resumes;
    if (!last_) return query();
    return query() + "&after_key=" + url_encode(last_->first) +
           "&after_value=" + url_encode(last_->second);
  }
  // After an error line: the query it named.
  std::string resume_after_error() {
    ++observation_.resumes;
    return resume_;
  }
  const std::string& last_error() const { return error_; }

  SnapshotObservation& observation() { return observation_; }

 private:
  void problem(std::string text) {
    if (observation_.problems.size() < 5) observation_.problems.push_back(std::move(text));
  }

  SnapshotObservation observation_;
  std::optional<std::pair<std::string, std::string>> last_;  // the last row's key and value
  std::string error_, resume_;
};

// A listen from `from` (until `until`, if any), over as many requests as it
// takes. `updates` are kept in arrival order; `progress` lists each
// progress P with how many updates came before it.
struct ListenObservation {
  Time from = 0;
  std::optional<Time> until;
  std::vector<Update> updates;
  std::vector<std::pair<Time, std::size_t>> progress;
  int resumes_after_break = 0;
  int resumes_after_error = 0;
  std::vector<std::string> problems;
  // Snapshots the reader took for this listen (indexes into
  // Observations::snapshots): at `from`, and at P - 1 for some progress P.
  std::optional<std::size_t> snapshot_at_from;
  std::vector<std::pair<Time, std::size_t>> snapshots_at_progress;
};

class ListenFollower {
 public:
  ListenFollower(Time from, std::optional<Time> until) {
    observation_.from = from;
    observation_.until = until;
  }

  std::string query() const { return query_from(observation_.from); }

  LineKind feed(std::string_view line) {
    if (auto error = parse_error_line(line)) {
      error_ = error->first;
      resume_ = error->second;
      if (!resume_.starts_with("from=")) problem("an error line's resume query: " + resume_);
      return LineKind::kError;
    }
    if (auto progress = parse_progress(line)) {
      on_progress(*progress);
      return LineKind::kProgress;
    }
    auto row = parse_row(line, /*with_time=*/true);
    if (!row) {
      problem("malformed listen line: " + std::string(line));
      return LineKind::kMalformed;
    }
    on_update(std::move(*row), line);
    return LineKind::kRow;
  }

  // After a broken connection: from the last progress, dropping what came
  // after it (the new request sends it again).
  std::string resume_after_break() {
    ++observation_.resumes_after_break;
    fresh_connection_ = true;
    if (observation_.progress.empty()) {
      observation_.updates.clear();
      last_.reset();
      return query();
    }
    const auto [progress, count] = observation_.progress.back();
    observation_.updates.resize(count);
    // What the new request sends must still come after what was kept.
    if (count == 0) {
      last_.reset();
    } else {
      last_ = observation_.updates.back();
    }
    return query_from(progress - 1);
  }
  // After an error line: the query it named (which skips what was sent).
  std::string resume_after_error() {
    ++observation_.resumes_after_error;
    fresh_connection_ = true;
    return resume_;
  }
  const std::string& last_error() const { return error_; }

  // Whether the last progress reached `until`.
  bool done() const {
    return observation_.until && !observation_.progress.empty() &&
           observation_.progress.back().first >= *observation_.until;
  }
  std::optional<Time> last_progress() const {
    if (observation_.progress.empty()) return std::nullopt;
    return observation_.progress.back().first;
  }

  // Drops the updates after the last progress (a listen abandoned midway):
  // what remains is checkable.
  void cut_at_last_progress() {
    observation_.updates.resize(
        observation_.progress.empty() ? 0 : observation_.progress.back().second);
  }

  ListenObservation& observation() { return observation_; }

 private:
  std::string query_from(Time from) const {
    std::string q = "from=" + std::to_string(from);
    if (observation_.until) q += "&until=" + std::to_string(*observation_.until);
    return q;
  }

  void on_update(Update update, std::string_view line) {
    const std::string text(line);
    if (update.diff != 1)
      problem("listen update with diff " + std::to_string(update.diff) + ": " + text);
    if (update.time <= observation_.from) problem("listen update at or before from: " + text);
    if (observation_.until && update.time >= *observation_.until)
      problem("listen update at or after until: " + text);
    if (auto progress = last_progress(); progress && update.time < *progress) {
      problem("listen update below the last progress " + std::to_string(*progress) + ": " + text);
    }
    if (last_ && std::tie(update.time, update.key, update.value) <=
                     std::tie(last_->time, last_->key, last_->value)) {
      problem("listen updates out of (time, key, value) order (or twice): " + text + " after " +
              std::to_string(last_->time) + " " + last_->key);
    }
    last_ = update;
    observation_.updates.push_back(std::move(update));
  }

  void on_progress(Time progress) {
    if (auto previous = last_progress()) {
      // A resumed request may report the progress it resumed from again.
      if (progress < *previous || (progress == *previous && !fresh_connection_)) {
        problem("listen progress " + std::to_string(progress) + " after " +
                std::to_string(*previous));
      }
    }
    if (observation_.until && progress > *observation_.until) {
      problem("listen progress " + std::to_string(progress) + " past until");
    }
    if (last_ && last_->time >= progress) {
      problem("listen progress " + std::to_string(progress) + " not above the update at " +
              std::to_string(last_->time) + " before it");
    }
    fresh_connection_ = false;
    observation_.progress.emplace_back(progress, observation_.updates.size());
  }

  void problem(std::string text) {
    if (observation_.problems.size() < 5) observation_.problems.push_back(std::move(text));
  }

  ListenObservation observation_;
  std::optional<Update> last_;  // the last update kept
  bool fresh_connection_ = true;
  std::string error_, resume_;
};

// --- the verdicts ------------------------------------------------------------

// One idempotent producer: its records are "<prefix><n>" for n = 0, 1, ...
struct ProducerLog {
  std::string id;
  std::string key_prefix;
  std::uint64_t sent = 0;   // records 0 .. sent - 1 were sent
  std::uint64_t acked = 0;  // records 0 .. acked - 1 were acknowledged
  // The last number the shard committed for it, as the server says at the
  // end (-1: none; nullopt: not asked).
  std::optional<std::int64_t> committed_sequence;
};

// One explicit compare_and_append of one record at `at`, [at, at + 1).
struct ExplicitAttempt {
  enum class Outcome { kWon, kLost, kUnknown };
  std::string key;
  Time at = 0;
  Outcome outcome = Outcome::kUnknown;
};

// One managed append without a producer (all or nothing).
struct GroupAttempt {
  std::vector<std::string> keys;
  bool acked = false;
};

struct Observations {
  std::vector<ProducerLog> producers;
  std::vector<ExplicitAttempt> explicits;
  std::vector<GroupAttempt> groups;
  std::set<std::string> other_sent;  // keys sent otherwise (the genesis record)
  std::vector<SnapshotObservation> snapshots;
  std::vector<ListenObservation> listens;
};

struct Verdict {
  std::vector<std::string> violations;
  // Figures for the report.
  std::size_t records = 0, producer_records = 0, explicit_won = 0, explicit_lost = 0,
              explicit_unknown = 0, explicit_unknown_present = 0, groups_acked = 0,
              groups_unknown = 0, groups_unknown_present = 0, producer_unacked_present = 0,
              snapshots_checked = 0, listens_checked = 0, listen_frontiers_checked = 0,
              snapshot_pairs_checked = 0;

  void violation(std::string text) {
    if (violations.size() < 200) violations.push_back(std::move(text));
  }
};

// The history, as a listen from 0 saw it (plus anything at time 0), sorted
// by time, with cumulative digests for the collection at or below a time.
class History {
 public:
  explicit History(std::vector<Update> updates) : updates_(std::move(updates)) {
    std::stable_sort(updates_.begin(), updates_.end(),
                     [](const Update& a, const Update& b) { return a.time < b.time; });
    Digest running;
    for (const Update& u : updates_) {
      running.add(u.key, u.value, u.diff);
      cumulative_.push_back(running);
    }
  }
  // The collection at `time`: every update at or below it.
  Digest at(Time time) const {
    auto end = std::upper_bound(updates_.begin(), updates_.end(), time,
                                [](Time t, const Update& u) { return t < u.time; });
    const auto n = static_cast<std::size_t>(end - updates_.begin());
    return n == 0 ? Digest{} : cumulative_[n - 1];
  }
  // The updates at times in (from, below).
  Digest between(Time from, Time below) const {
    return below == 0 ? Digest{} : at(below - 1) - at(from);
  }
  const std::vector<Update>& updates() const { return updates_; }

 private:
  std::vector<Update> updates_;
  std::vector<Digest> cumulative_;
};

// The digest of the first `count` updates of a listen.
inline Digest digest_of(const std::vector<Update>& updates, std::size_t count) {
  Digest digest;
  for (std::size_t i = 0; i < count && i < updates.size(); ++i) {
    digest.add(updates[i].key, updates[i].value, updates[i].diff);
  }
  return digest;
}

inline Verdict check_history(const Observations& seen, const History& history) {
  Verdict verdict;
  // Each record once, with diff 1, at one time.
  std::map<std::string, const Update*> present;  // by the key's decoded text
  for (const Update& u : history.updates()) {
    const std::string key = json_unquote(u.key);
    if (u.diff != 1) verdict.violation("record " + key + " has diff " + std::to_string(u.diff));
    auto [it, inserted] = present.emplace(key, &u);
    if (!inserted) {
      verdict.violation("record " + key + " is present twice (times " +
                        std::to_string(it->second->time) + " and " + std::to_string(u.time) + ")");
    }
  }
  verdict.records = present.size();
  std::map<Time, std::size_t> records_at;
  for (const Update& u : history.updates()) ++records_at[u.time];

  // Nothing that was never sent.
  std::set<std::string> sent = seen.other_sent;
  std::map<std::string, const ProducerLog*> producer_of_prefix;
  for (const ProducerLog& p : seen.producers) producer_of_prefix[p.key_prefix] = &p;
  for (const ExplicitAttempt& e : seen.explicits) sent.insert(e.key);
  for (const GroupAttempt& g : seen.groups) sent.insert(g.keys.begin(), g.keys.end());
  std::map<const ProducerLog*, std::set<std::uint64_t>> producer_present;
  for (const auto& [key, update] : present) {
    if (sent.contains(key)) continue;
    bool producer_record = false;
    for (const auto& [prefix, producer] : producer_of_prefix) {
      if (!key.starts_with(prefix)) continue;
      const std::string number = key.substr(prefix.size());
      if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::uint64_t n = std::stoull(number);
      if (n < producer->sent && update->value == number) {
        producer_present[producer].insert(n);
        producer_record = true;
      }
    }
    if (!producer_record) verdict.violation("record " + key + " was never sent");
  }

  // Producers: what the shard committed of each is a prefix of what it
  // sent, holding every acknowledged record, and the shard's sequence says
  // where the prefix ends.
  for (const ProducerLog& p : seen.producers) {
    const std::set<std::uint64_t>& numbers = producer_present[&p];
    verdict.producer_records += numbers.size();
    const std::uint64_t count = numbers.size();
    if (count > 0 && *numbers.rbegin() != count - 1) {
      std::uint64_t gap = 0;
      while (numbers.contains(gap)) ++gap;
      verdict.violation("producer " + p.id +
                        ": its records are not a prefix: " + std::to_string(count) +
                        " present, the highest " + std::to_string(*numbers.rbegin()) + ", record " +
                        std::to_string(gap) + " missing");
    }
    if (count < p.acked) {
      verdict.violation("producer " + p.id + ": " + std::to_string(p.acked) +
                        " records acknowledged, " + std::to_string(count) + " present");
    }
    if (count > p.acked) verdict.producer_unacked_present += count - p.acked;
    if (p.committed_sequence && *p.committed_sequence != static_cast<std::int64_t>(count) - 1) {
      verdict.violation("producer " + p.id + ": the shard's sequence is " +
                        std::to_string(*p.committed_sequence) + " but " + std::to_string(count) +
                        " of its records are present");
    }
  }

  // Explicit appends: a winner present once at its time, alone there; a
  // loser absent; an unknown outcome at most once, and if present, at its
  // time and alone.
  std::map<Time, std::vector<const ExplicitAttempt*>> winners_at;
  for (const ExplicitAttempt& e : seen.explicits) {
    auto found = present.find(e.key);
    switch (e.outcome) {
      case ExplicitAttempt::Outcome::kWon:
        ++verdict.explicit_won;
        winners_at[e.at].push_back(&e);
        if (found == present.end())
          verdict.violation("explicit record " + e.key + " won at " + std::to_string(e.at) +
                            " but is missing");
        break;
      case ExplicitAttempt::Outcome::kLost:
        ++verdict.explicit_lost;
        if (found != present.end())
          verdict.violation("explicit record " + e.key + " lost (409) at " + std::to_string(e.at) +
                            " but is present at " + std::to_string(found->second->time));
        break;
      case ExplicitAttempt::Outcome::kUnknown:
        ++verdict.explicit_unknown;
        if (found != present.end()) {
          ++verdict.explicit_unknown_present;
          winners_at[e.at].push_back(&e);
        }
        break;
    }
    if (found == present.end()) continue;
    if (found->second->time != e.at) {
      verdict.violation("explicit record " + e.key + " appended at " + std::to_string(e.at) +
                        " is at time " + std::to_string(found->second->time));
    } else if (records_at[e.at] != 1) {
      verdict.violation("explicit record " + e.key + " at " + std::to_string(e.at) +
                        " shares its time with " + std::to_string(records_at[e.at] - 1) +
                        " other records");
    }
  }
  for (const auto& [at, winners] : winners_at) {
    if (winners.size() > 1) {
      verdict.violation("two explicit appends won from the upper " + std::to_string(at) + ": " +
                        winners[0]->key + " and " + winners[1]->key);
    }
  }

  // Managed appends without a producer: all or nothing, at one time.
  for (const GroupAttempt& g : seen.groups) {
    std::size_t found = 0;
    std::set<Time> times;
    for (const std::string& key : g.keys) {
      auto it = present.find(key);
      if (it == present.end()) continue;
      ++found;
      times.insert(it->second->time);
    }
    if (g.acked) {
      ++verdict.groups_acked;
    } else {
      ++verdict.groups_unknown;
      if (found > 0) ++verdict.groups_unknown_present;
    }
    if (g.acked && found != g.keys.size()) {
      verdict.violation("acknowledged append " + g.keys.front() + "...: " + std::to_string(found) +
                        " of " + std::to_string(g.keys.size()) + " records present");
    } else if (found != 0 && found != g.keys.size()) {
      verdict.violation("append " + g.keys.front() +
                        "... (no producer, outcome unknown) is partly present: " +
                        std::to_string(found) + " of " + std::to_string(g.keys.size()));
    }
    if (times.size() > 1)
      verdict.violation("append " + g.keys.front() + "... committed at " +
                        std::to_string(times.size()) + " times");
  }

  // Snapshots equal the history at their time.
  for (const SnapshotObservation& s : seen.snapshots) {
    for (const std::string& problem : s.problems)
      verdict.violation("snapshot at " + std::to_string(s.as_of) + ": " + problem);
    const Digest expected = history.at(s.as_of);
    if (s.digest != expected) {
      verdict.violation("snapshot at " + std::to_string(s.as_of) + " has " + s.digest.describe() +
                        ", the history " + expected.describe() + " (" + std::to_string(s.resumes) +
                        " resumes)");
    }
    ++verdict.snapshots_checked;
  }

  // Listens: in order (checked as they came), and at each progress P what
  // they gathered is the history in (from, P), and the snapshots taken at
  // P - 1 minus the one at from.
  for (const ListenObservation& l : seen.listens) {
    const std::string name = "listen from " + std::to_string(l.from);
    for (const std::string& problem : l.problems) verdict.violation(name + ": " + problem);
    Digest gathered;
    std::size_t counted = 0;
    for (const auto& [progress, count] : l.progress) {
      for (; counted < count && counted < l.updates.size(); ++counted) {
        gathered.add(l.updates[counted].key, l.updates[counted].value, l.updates[counted].diff);
      }
      const Digest expected = history.between(l.from, progress);
      if (gathered != expected) {
        verdict.violation(name + " up to progress " + std::to_string(progress) + " gathered " +
                          gathered.describe() + ", the history has " + expected.describe() + " (" +
                          std::to_string(l.resumes_after_break) + " resumes after a break, " +
                          std::to_string(l.resumes_after_error) + " after an error line)");
        break;
      }
      ++verdict.listen_frontiers_checked;
    }
    if (l.snapshot_at_from) {
      const SnapshotObservation& at_from = seen.snapshots[*l.snapshot_at_from];
      for (const auto& [progress, index] : l.snapshots_at_progress) {
        auto reached = std::find_if(l.progress.begin(), l.progress.end(),
                                    [p = progress](const auto& e) { return e.first == p; });
        if (reached == l.progress.end()) continue;
        const Digest listened = digest_of(l.updates, reached->second);
        const Digest expected = seen.snapshots[index].digest - at_from.digest;
        if (listened != expected) {
          verdict.violation(name + " up to progress " + std::to_string(progress) + " gathered " +
                            listened.describe() + ", but snapshot(" + std::to_string(progress - 1) +
                            ") - snapshot(" + std::to_string(l.from) + ") is " +
                            expected.describe());
        }
        ++verdict.snapshot_pairs_checked;
      }
    }
    ++verdict.listens_checked;
  }
  return verdict;
}

}  // namespace tidemark::testing::nemesis
