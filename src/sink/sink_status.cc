#include "sink/sink_status.h"

#include <utility>

#include "util/clock.h"
#include "util/json.h"
#include "util/try.h"

namespace tidemark {
namespace {

constexpr int kAttempts = 4;  // lost races (a previous runner's write) before giving up

}  // namespace

std::string sink_status_key(std::string_view sink_name) {
  return "sink/status/" + std::string(sink_name);
}

std::string SinkStatusRecord::to_json() const {
  std::string out = "{\"status\":";
  append_json_string(&out, status);
  out += ",\"error\":";
  if (error) {
    append_json_string(&out, *error);
  } else {
    out += "null";
  }
  // A frontier is {"at": T} or {"closed": true}; null when not known.
  out += ",\"frontier\":";
  if (!frontier) {
    out += "null";
  } else if (frontier->is_closed()) {
    out += "{\"closed\":true}";
  } else {
    out += "{\"at\":";
    append_u64(&out, frontier->time());
    out += "}";
  }
  out += ",\"runner\":";
  append_json_string(&out, runner);
  out += ",\"owner\":";
  append_json_string(&out, owner);
  out += ",\"written_at_ms\":";
  append_u64(&out, written_at_ms);
  return out + "}";
}

Result<SinkStatusRecord> SinkStatusRecord::parse(std::string_view json) {
  auto value = parse_json(json);
  if (!value || !value->is_object()) return corruption("a sink status that is not a JSON object");
  auto status = value->find_string("status"), runner = value->find_string("runner"),
       owner = value->find_string("owner");
  const JsonValue* error = value->find("error");
  const JsonValue* frontier = value->find("frontier");
  const JsonValue* written = value->find("written_at_ms");
  if (!status || !runner || !owner || error == nullptr || frontier == nullptr ||
      written == nullptr || !written->as_u64() || !(error->is_null() || error->is_string()) ||
      !(frontier->is_null() || frontier->is_object())) {
    return corruption("a sink status without every field: " + std::string(json));
  }
  SinkStatusRecord record;
  record.status = std::move(*status);
  record.runner = std::move(*runner);
  record.owner = std::move(*owner);
  record.written_at_ms = *written->as_u64();
  if (error->is_string()) record.error = error->as_string();
  if (frontier->is_object()) {
    if (const JsonValue* at = frontier->find("at"); at != nullptr && at->as_u64()) {
      record.frontier = Frontier::at(*at->as_u64());
    } else if (const JsonValue* closed = frontier->find("closed");
               closed != nullptr && closed->is_bool() && closed->as_bool()) {
      record.frontier = Frontier::closed();
    } else {
      return corruption("a sink status with a frontier that is neither a time nor closed: " +
                        std::string(json));
    }
  }
  return record;
}

Result<std::optional<SinkStatusRecord>> read_sink_status(Consensus& consensus,
                                                         std::string_view sink_name) {
  const std::string key = sink_status_key(sink_name);
  TM_ASSIGN(auto head, consensus.head(key));
  if (!head) return std::nullopt;
  auto record = SinkStatusRecord::parse(head->data);
  if (!record) return corruption(key + ": " + record.error().message);
  return std::optional<SinkStatusRecord>(std::move(*record));
}

SinkStatusPublisher::SinkStatusPublisher(std::shared_ptr<Consensus> consensus,
                                         std::string sink_name, std::string runner,
                                         std::string owner,
                                         std::chrono::milliseconds frontier_every)
    : consensus_(std::move(consensus)),
      key_(sink_status_key(sink_name)),
      frontier_every_(frontier_every) {
  record_.runner = std::move(runner);
  record_.owner = std::move(owner);
}

Status SinkStatusPublisher::set_status(std::string status, std::optional<std::string> error) {
  {
    std::lock_guard lock(mu_);
    record_.status = std::move(status);
    record_.error = std::move(error);
    pending_ = true;
  }
  return publish();
}

void SinkStatusPublisher::stage_status(std::string status, std::optional<std::string> error) {
  std::lock_guard lock(mu_);
  record_.status = std::move(status);
  record_.error = std::move(error);
  pending_ = true;
}

void SinkStatusPublisher::set_frontier(const Frontier& frontier) {
  {
    std::lock_guard lock(mu_);
    if (record_.frontier == frontier) return;
    record_.frontier = frontier;
    pending_ = true;
    if (last_write_ && std::chrono::steady_clock::now() - *last_write_ < frontier_every_) return;
  }
  (void)publish();
}

void SinkStatusPublisher::flush() {
  {
    std::lock_guard lock(mu_);
    if (!pending_) return;
  }
  (void)publish();
}

Status SinkStatusPublisher::publish() {
  std::lock_guard write(write_mu_);
  SinkStatusRecord record;
  {
    std::lock_guard lock(mu_);
    if (!pending_) return {};  // a write that started after this change carried it
    record = record_;
    pending_ = false;
    last_write_ = std::chrono::steady_clock::now();
  }
  record.written_at_ms = wall_clock_millis();
  auto failed = [&](Error error) -> Status {
    std::lock_guard lock(mu_);
    pending_ = true;
    return std::unexpected(std::move(error));
  };
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (!seqno_known_) {
      auto head = consensus_->head(key_);
      if (!head) return failed(head.error());
      seqno_ = *head ? std::optional<SeqNo>((*head)->seqno) : std::nullopt;
      seqno_known_ = true;
    }
    const SeqNo next = seqno_ ? *seqno_ + 1 : 1;
    auto outcome = consensus_->compare_and_set(key_, seqno_, VersionedData{next, record.to_json()});
    if (!outcome) {
      seqno_known_ = false;  // it may have landed: read the head before the next write
      return failed(outcome.error());
    }
    if (*outcome == CasOutcome::kCommitted) {
      seqno_ = next;
      if (next % kTruncateEvery == 0) (void)consensus_->truncate(key_, next);  // history
      return {};
    }
    seqno_known_ = false;  // another writer's version (a previous runner): read it, try again
  }
  return failed(
      determinate(key_ + ": lost " + std::to_string(kAttempts) + " races to write it").error());
}

}  // namespace tidemark
