#include "scenarios/workload.h"

#include <charconv>
#include <random>
#include <thread>

#include "scenarios/http.h"

namespace tidemark::scenarios {

std::optional<std::int64_t> json_integer(std::string_view json, std::string_view field) {
  const std::string needle = "\"" + std::string(field) + "\":";
  const auto at = json.find(needle);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = json.substr(at + needle.size());
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  if (error != std::errc()) return std::nullopt;
  return value;
}

std::optional<std::string> json_string(std::string_view json, std::string_view field) {
  const std::string needle = "\"" + std::string(field) + "\":\"";
  const auto at = json.find(needle);
  if (at == std::string_view::npos) return std::nullopt;
  const auto start = at + needle.size();
  std::string out;
  for (auto i = start; i < json.size(); ++i) {
    if (json[i] == '\\' && i + 1 < json.size()) {
      out.push_back(json[++i]);
    } else if (json[i] == '"') {
      return out;
    } else {
      out.push_back(json[i]);
    }
  }
  return std::nullopt;
}

// RecordShape -------------------------------------------------------------

RecordShape::RecordShape(std::size_t value_bytes, std::uint64_t seed) : value_bytes_(value_bytes) {
  if (value_bytes_ == 0) return;
  // Letters and digits only: no JSON escaping, and not trivially compressible.
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::mt19937_64 rng(seed);
  pool_.resize(value_bytes_ + (1 << 16));
  for (char& c : pool_) c = kAlphabet[rng() % 62];
}

std::string_view RecordShape::raw_value(std::uint64_t id) const {
  const std::size_t offset = (id * 2654435761u) % (pool_.size() - value_bytes_ + 1);
  return std::string_view(pool_).substr(offset, value_bytes_);
}

std::string RecordShape::value_text(std::uint64_t id) const {
  if (value_bytes_ == 0) return std::to_string(id);
  return "\"" + std::string(raw_value(id)) + "\"";
}

bool RecordShape::value_matches(std::uint64_t id, std::string_view value_json) const {
  if (value_bytes_ == 0) return value_json == std::to_string(id);
  return value_json.size() == value_bytes_ + 2 && value_json.front() == '"' &&
         value_json.back() == '"' && value_json.substr(1, value_bytes_) == raw_value(id);
}

void RecordShape::append_line(std::uint64_t id, std::string& out) const {
  out.append("{\"key\":\"r").append(std::to_string(id)).append("\",\"value\":");
  if (value_bytes_ == 0) {
    out.append(std::to_string(id));
  } else {
    out.push_back('"');
    out.append(raw_value(id));
    out.push_back('"');
  }
  out.append("}\n");
}

std::uint64_t Tracker::count(State state) const {
  std::uint64_t n = 0;
  for (const auto& s : states_) n += s.load(std::memory_order_relaxed) == state;
  return n;
}

// Ingest ------------------------------------------------------------------

Ingest::Ingest(Run& run, std::string shard, const RecordShape& shape, Tracker& tracker,
               std::size_t per_request)
    : run_(run),
      shard_(std::move(shard)),
      shape_(shape),
      tracker_(tracker),
      per_request_(per_request) {}

Ingest::~Ingest() {
  stop();
}

void Ingest::start(int clients, std::uint64_t byte_goal) {
  byte_goal_ = byte_goal;
  stop_ = false;
  for (int i = 0; i < clients; ++i) threads_.emplace_back([this] { client_loop(); });
}

void Ingest::stop() {
  stop_ = true;
  wait();
}

void Ingest::wait() {
  for (auto& t : threads_) t.join();
  threads_.clear();
}

std::string Ingest::last_error() const {
  std::lock_guard lock(mutex_);
  return last_error_;
}

void Ingest::client_loop() {
  std::string body;
  const std::string target = "/v1/shards/" + shard_ + "/append";
  while (!stop_) {
    if (sent_bytes_.load() >= byte_goal_) return;
    const std::uint64_t from = next_id_.fetch_add(per_request_);
    if (from >= tracker_.capacity()) return;
    const std::uint64_t to = std::min<std::uint64_t>(from + per_request_, tracker_.capacity());
    body.clear();
    for (auto id = from; id < to; ++id) shape_.append_line(id, body);
    sent_bytes_ += body.size();
    tracker_.set(from, to, Tracker::kInFlight);
    ++requests_;
    Reply reply = http(run_.port(), "POST", target, body);
    // A refused connection (the server restarting) sent nothing: the same
    // ids go again instead of new ones, so that only the requests a kill
    // cut off leave ids in flight, which the tracker's slack must cover.
    // (Taking new ids, a slow restart once used up large-snapshot's slack
    // before it reached its goal.)
    while (!stop_ && reply.status == 0 && reply.error.starts_with("connect: ")) {
      ++errors_;
      {
        std::lock_guard lock(mutex_);
        last_error_ = reply.error;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      reply = http(run_.port(), "POST", target, body);
    }
    if (reply.status == 200 && json_integer(reply.body, "count") == std::int64_t(to - from)) {
      tracker_.set(from, to, Tracker::kAcked);
      acked_bytes_ += body.size();
      acked_records_ += to - from;
      if (auto time = json_integer(reply.body, "time")) {
        std::int64_t first = first_time_.load();
        while (*time < first && !first_time_.compare_exchange_weak(first, *time)) {
        }
      }
      continue;
    }
    // Left in flight: present at most once. A 200 with a wrong count is a
    // broken promise, not an outage.
    if (reply.status == 200) {
      run_.fail("append of " + std::to_string(to - from) + " records answered " + reply.body);
    }
    // A refusal of the request itself (400, 413) is the scenario's mistake,
    // never an outage: fail now instead of retrying until the timeout.
    if (reply.status == 400 || reply.status == 413) {
      run_.fail("append of " + std::to_string(to - from) + " records refused: " +
                std::to_string(reply.status) + " " + reply.body.substr(0, 300));
      stop_ = true;
    }
    ++errors_;
    {
      std::lock_guard lock(mutex_);
      last_error_ = reply.status ? std::to_string(reply.status) + " " + reply.body : reply.error;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Audit -------------------------------------------------------------------

Audit::Audit(Run& run, const Tracker& tracker, std::string what)
    : run_(run), tracker_(tracker), what_(std::move(what)), seen_(tracker.capacity()) {}

bool Audit::saw(std::string_view key, std::int64_t copies) {
  std::uint64_t id = 0;
  const bool numbered =
      key.size() > 1 && key[0] == 'r' &&
      std::from_chars(key.data() + 1, key.data() + key.size(), id).ec == std::errc() &&
      id < seen_.size();
  if (!numbered) {
    if (foreign_++ < 3) run_.fail(what_ + ": a key that was never sent: " + std::string(key));
    return false;
  }
  const std::int64_t total = seen_[id] + copies;
  seen_[id] = static_cast<std::uint8_t>(std::clamp<std::int64_t>(total, 0, 255));
  return true;
}

std::uint64_t Audit::finish(bool complete) {
  std::uint64_t present = 0, lost = 0, duplicated = 0, phantom = 0;
  std::string examples;
  for (std::uint64_t id = 0; id < seen_.size(); ++id) {
    const auto state = tracker_.get(id);
    const auto n = seen_[id];
    present += n > 0;
    const char* problem = nullptr;
    if (complete && state == Tracker::kAcked && n == 0) {
      problem = "acknowledged but missing", ++lost;
    } else if (n > 1) {
      problem = "present more than once", ++duplicated;
    } else if (state == Tracker::kUnsent && n > 0) {
      problem = "present but never sent", ++phantom;
    }
    if (problem && lost + duplicated + phantom <= 3) {
      examples += " r" + std::to_string(id) + " " + problem + " (" + std::to_string(n) + ");";
    }
  }
  if (lost + duplicated + phantom > 0) {
    run_.fail(what_ + ": " + std::to_string(lost) + " acknowledged records missing, " +
              std::to_string(duplicated) + " duplicated, " + std::to_string(phantom) +
              " never sent:" + examples);
  }
  return present;
}

std::optional<std::int64_t> shard_upper(Run& run, const std::string& shard) {
  const Reply reply = http(run.port(), "GET", "/v1/shards/" + shard);
  if (reply.status != 200) return std::nullopt;
  return json_integer(reply.body, "upper");
}

bool create_shard(Run& run, const std::string& shard) {
  const Reply reply =
      create_with_retries(run.port(), "/v1/shards", "{\"name\":\"" + shard + "\"}", 201, 409);
  return run.check(reply.status == 201, "create shard " + shard + ": " +
                                            std::to_string(reply.status) + " " + reply.body +
                                            reply.error);
}

std::uint64_t audit_snapshot(Run& run, const std::string& shard, const RecordShape& shape,
                             const Tracker& tracker) {
  const auto upper = shard_upper(run, shard);
  if (!run.check(upper.has_value() && *upper > 0, "the shard's upper after the run")) return 0;
  // A read that fails on the server's side (500, or an error line after
  // the 200: injected faults under --random-config) is read again, as a
  // client would; a wrong answer is never retried.
  for (int attempt = 1;; ++attempt) {
    Audit audit(run, tracker, "snapshot of " + shard);
    std::uint64_t lines = 0, bad = 0;
    std::string stream_error;
    const Reply reply = get_lines(
        run.port(), "/v1/shards/" + shard + "/snapshot?as_of=" + std::to_string(*upper - 1),
        [&](std::string_view line) {
          if (line.starts_with("{\"error\"")) {
            stream_error = std::string(line);
            return false;
          }
          ++lines;
          // {"key":"r<id>","value":V,"diff":D}
          const auto key =
              json_string(line.substr(0, std::min<std::size_t>(line.size(), 64)), "key");
          const auto value_at = line.find("\"value\":");
          const auto diff_at = line.rfind(",\"diff\":");
          if (!key || value_at == std::string_view::npos || diff_at == std::string_view::npos ||
              diff_at < value_at) {
            if (bad++ < 3) {
              run.fail("snapshot line " + std::to_string(lines) +
                       " unreadable: " + std::string(line.substr(0, 200)));
            }
            return true;
          }
          const auto diff = json_integer(line.substr(diff_at), "diff");
          if ((!diff || *diff != 1) && bad++ < 3) {
            run.fail("snapshot: " + *key + " has diff " + std::to_string(diff.value_or(0)));
          }
          const std::string_view value = line.substr(value_at + 8, diff_at - value_at - 8);
          if (audit.saw(*key)) {
            const std::uint64_t id = std::stoull(key->substr(1));
            if (!shape.value_matches(id, value) && bad++ < 3) {
              run.fail("snapshot: " + *key + " has a value other than the one sent");
            }
          }
          return true;
        });
    const bool server_error = reply.status == 500 || !stream_error.empty();
    if (server_error && attempt < 10) {
      run.log("snapshot failed on the server (" + reply.body + stream_error + "), reading again");
      continue;
    }
    if (!run.check(reply.status == 200 && reply.error.empty() && stream_error.empty(),
                   "snapshot: " + std::to_string(reply.status) + " " + reply.body + reply.error +
                       stream_error)) {
      return 0;
    }
    const std::uint64_t present = audit.finish();
    run.note("snapshot of " + std::to_string(lines) + " updates (" + std::to_string(present) +
             " records present)");
    return lines;
  }
}

}  // namespace tidemark::scenarios
