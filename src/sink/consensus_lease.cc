#include "sink/consensus_lease.h"

#include "util/clock.h"
#include "util/ids.h"
#include "util/json.h"

namespace tidemark {
namespace {

constexpr int kAttempts = 8;  // lost races before acquire() gives up

using SteadyClock = std::chrono::steady_clock;

std::optional<std::string> text_field(const JsonValue& json, std::string_view name) {
  const JsonValue* value = json.find(name);
  if (value == nullptr || !value->is_string()) return std::nullopt;
  return value->as_string();
}

std::optional<std::uint64_t> number_field(const JsonValue& json, std::string_view name) {
  const JsonValue* value = json.find(name);
  if (value == nullptr) return std::nullopt;
  return value->as_u64();
}

}  // namespace

std::string LeaseRecord::describe_holder() const {
  std::string out = runner.empty() ? std::string("a sink runner") : runner;
  out += " (";
  if (!owner.empty()) out += "server " + owner + "; ";
  out += describe(process) + ")";
  if (acquired_at_ms > 0) out += ", holding it since " + format_utc(acquired_at_ms);
  if (expires_at_ms > 0) out += ", lease until " + format_utc(expires_at_ms);
  return out;
}

std::string LeaseRecord::to_json() const {
  std::string out = "{\"token\":";
  append_json_string(&out, token);
  out += ",\"subject\":";
  append_json_string(&out, subject);
  out += ",\"sink\":";
  append_json_string(&out, sink);
  out += ",\"owner\":";
  append_json_string(&out, owner);
  out += ",\"runner\":";
  append_json_string(&out, runner);
  out += ",\"host\":";
  append_json_string(&out, process.host);
  out += ",\"machine\":";
  append_json_string(&out, process.machine);
  out += ",\"pid\":";
  append_i64(&out, process.pid);
  out += ",\"start_ticks\":";
  append_u64(&out, process.start_ticks);
  out += ",\"started_at_ms\":";
  append_u64(&out, process.started_at_ms);
  out += ",\"epoch\":";
  append_u64(&out, epoch);
  out += ",\"acquired_at_ms\":";
  append_u64(&out, acquired_at_ms);
  out += ",\"expires_at_ms\":";
  append_u64(&out, expires_at_ms);
  return out + "}";
}

Result<LeaseRecord> LeaseRecord::parse(std::string_view json) {
  auto value = parse_json(json);
  if (!value || !value->is_object()) return corruption("a lease record that is not a JSON object");
  LeaseRecord record;
  auto token = text_field(*value, "token"), subject = text_field(*value, "subject"),
       sink = text_field(*value, "sink"), owner = text_field(*value, "owner"),
       runner = text_field(*value, "runner"), host = text_field(*value, "host"),
       machine = text_field(*value, "machine");
  auto pid = value->find("pid") ? value->find("pid")->as_i64() : std::nullopt;
  auto start_ticks = number_field(*value, "start_ticks"),
       started_at = number_field(*value, "started_at_ms"), epoch = number_field(*value, "epoch"),
       acquired_at = number_field(*value, "acquired_at_ms"),
       expires_at = number_field(*value, "expires_at_ms");
  if (!token || !subject || !sink || !owner || !runner || !host || !machine || !pid ||
      !start_ticks || !started_at || !epoch || !acquired_at || !expires_at) {
    return corruption("a lease record without every field: " + std::string(json));
  }
  record.token = std::move(*token);
  record.subject = std::move(*subject);
  record.sink = std::move(*sink);
  record.owner = std::move(*owner);
  record.runner = std::move(*runner);
  record.process =
      ProcessIdentity{std::move(*host), std::move(*machine), *pid, *start_ticks, *started_at};
  record.epoch = *epoch;
  record.acquired_at_ms = *acquired_at;
  record.expires_at_ms = *expires_at;
  return record;
}

Takeover take_over(const std::optional<LeaseRecord>& current, const LeaseRecord& candidate,
                   std::uint64_t now_ms, Liveness holder) {
  if (!current || current->released()) return Takeover::kFree;
  if (holder == Liveness::kDead) return Takeover::kHolderDead;
  if (!candidate.owner.empty() && candidate.owner == current->owner &&
      candidate.sink == current->sink) {
    return Takeover::kSameRunner;
  }
  // A live holder on this machine keeps it, renewed or not: it may be
  // paused between its check and its write.
  if (holder == Liveness::kAlive) return Takeover::kRefused;
  if (now_ms > current->expires_at_ms) return Takeover::kExpired;
  return Takeover::kRefused;
}

Result<std::unique_ptr<ConsensusLease>> ConsensusLease::acquire(
    std::shared_ptr<Consensus> consensus, std::string key, LeaseRecord holder,
    LeaseOptions options) {
  if (options.margin >= options.duration || options.renew_every <= std::chrono::milliseconds(0)) {
    return invalid_usage("a lease's margin must be shorter than its duration");
  }
  holder.token = random_id();
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    TM_ASSIGN(auto head, consensus->head(key));
    std::optional<LeaseRecord> current;
    if (head) {
      auto parsed = LeaseRecord::parse(head->data);
      if (!parsed) return corruption("lease " + key + ": " + parsed.error().message);
      current = std::move(*parsed);
    }
    const std::uint64_t now = wall_clock_millis();
    const Liveness alive =
        current && !current->released() ? liveness(current->process) : Liveness::kUnknown;
    if (take_over(current, holder, now, alive) == Takeover::kRefused) {
      return make_error(ErrorKind::kHeld,
                        current->subject + " is held by " + current->describe_holder());
    }
    LeaseRecord next = holder;
    next.epoch = (current ? current->epoch : 0) + 1;
    next.acquired_at_ms = now;
    next.expires_at_ms = now + static_cast<std::uint64_t>(options.duration.count());
    const std::optional<SeqNo> expected = head ? std::optional<SeqNo>(head->seqno) : std::nullopt;
    const SeqNo seqno = head ? head->seqno + 1 : 1;
    const auto started = SteadyClock::now();
    auto outcome = consensus->compare_and_set(key, expected, VersionedData{seqno, next.to_json()});
    if (!outcome) {
      if (!outcome.error().is(ErrorKind::kIndeterminate)) {
        return std::unexpected(outcome.error());
      }
      // It may have landed: the head says.
      TM_ASSIGN(auto after, consensus->head(key));
      if (!after || after->seqno != seqno || after->data != next.to_json()) continue;
    } else if (*outcome == CasOutcome::kExpectationMismatch) {
      continue;
    }
    (void)consensus->truncate(key, seqno);  // best effort: older versions are history
    auto lease = std::unique_ptr<ConsensusLease>(
        new ConsensusLease(std::move(consensus), std::move(key), next, options, seqno, started));
    // Cannot renew: released again (the destructor) and refused.
    TM_TRY(
        lease->renewal_.start(options.renew_every, [raw = lease.get()] { return raw->renew(); }));
    return lease;
  }
  return determinate("lease " + key + ": lost " + std::to_string(kAttempts) +
                     " races for it in a row");
}

ConsensusLease::ConsensusLease(std::shared_ptr<Consensus> consensus, std::string key,
                               LeaseRecord record, LeaseOptions options, SeqNo seqno,
                               SteadyClock::time_point landed)
    : consensus_(std::move(consensus)),
      key_(std::move(key)),
      record_(std::move(record)),
      options_(options),
      seqno_(seqno),
      landed_(landed) {}

ConsensusLease::~ConsensusLease() {
  renewal_.stop();
  release();
}

std::unexpected<Error> ConsensusLease::taken_over(const LeaseRecord& holder) const {
  return make_error(ErrorKind::kHeld,
                    record_.subject + " was taken over by " + holder.describe_holder());
}

bool ConsensusLease::renew() {
  const auto started = SteadyClock::now();
  SeqNo expected;
  {
    std::lock_guard lock(mu_);
    expected = seqno_;
  }
  // One write when nothing changed: our last landed version is the head
  // unless someone took the lease (or an indeterminate write of ours
  // landed), which the read below tells apart.
  LeaseRecord next = record_;
  next.expires_at_ms = wall_clock_millis() + static_cast<std::uint64_t>(options_.duration.count());
  const SeqNo seqno = expected + 1;
  auto outcome = consensus_->compare_and_set(key_, expected, VersionedData{seqno, next.to_json()});
  if (outcome && *outcome == CasOutcome::kCommitted) {
    {
      std::lock_guard lock(mu_);
      seqno_ = seqno;
      landed_ = started;
    }
    if (seqno % kTruncateEvery == 0) (void)consensus_->truncate(key_, seqno);
    return true;
  }
  auto head = consensus_->head(key_);
  if (!head || !*head) return true;  // try again next time (a missing head is lost at check())
  auto current = LeaseRecord::parse((*head)->data);
  if (!current) return true;
  if (current->token != record_.token) {
    std::lock_guard lock(mu_);
    lost_to_ = std::move(*current);
    return false;
  }
  // Still ours, at another seqno (a write of ours that seemed to fail
  // landed): renew from there next time. landed_ stays: when that write
  // started is not known.
  std::lock_guard lock(mu_);
  seqno_ = (*head)->seqno;
  return true;
}

Status ConsensusLease::check() {
  {
    std::lock_guard lock(mu_);
    if (lost_to_) return taken_over(*lost_to_);
    const auto trusted_until = landed_ + options_.duration - options_.margin;
    if (SteadyClock::now() > trusted_until) {
      return determinate(record_.subject + ": the lease was not renewed in time (is " + key_ +
                         "'s consensus reachable?); not writing until it is taken again");
    }
  }
  auto head = consensus_->head(key_);
  if (!head) {
    Error error = head.error();
    error.message = record_.subject + ": checking the lease: " + error.message;
    return std::unexpected(std::move(error));
  }
  if (!*head) {
    return make_error(ErrorKind::kHeld,
                      record_.subject + ": the lease " + key_ + " was deleted: it is not ours");
  }
  auto current = LeaseRecord::parse((*head)->data);
  if (!current) return corruption("lease " + key_ + ": " + current.error().message);
  if (current->token != record_.token) {
    std::lock_guard lock(mu_);
    lost_to_ = *current;
    return taken_over(*current);
  }
  return {};
}

void ConsensusLease::release() {
  auto head = consensus_->head(key_);
  if (!head || !*head) return;
  auto current = LeaseRecord::parse((*head)->data);
  if (!current || current->token != record_.token) return;  // not ours any more
  LeaseRecord released = *current;
  released.token.clear();
  released.expires_at_ms = 0;
  const SeqNo seqno = (*head)->seqno + 1;
  auto outcome =
      consensus_->compare_and_set(key_, (*head)->seqno, VersionedData{seqno, released.to_json()});
  if (outcome && *outcome == CasOutcome::kCommitted) (void)consensus_->truncate(key_, seqno);
}

}  // namespace tidemark
