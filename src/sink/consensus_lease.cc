#include "sink/consensus_lease.h"

#include <algorithm>
#include <map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "util/clock.h"
#include "util/ids.h"
#include "util/json.h"
#include "util/periodic.h"
#include "util/try.h"

namespace tidemark {
namespace {

constexpr int kAttempts = 8;  // lost races before acquire() gives up

using SteadyClock = std::chrono::steady_clock;

std::optional<std::uint64_t> number_field(const JsonValue& json, std::string_view name) {
  const JsonValue* value = json.find(name);
  if (value == nullptr) return std::nullopt;
  return value->as_u64();
}

}  // namespace

// The leases of this process on one Consensus with one renewal period:
// one timer task renews them all, in batches (see the header).
class RenewalGroup {
 public:
  // The live group for (consensus, every), or a new one with its task
  // started. An error when the task cannot be started.
  [[nodiscard]] static Result<std::shared_ptr<RenewalGroup>> of(
      const std::shared_ptr<Consensus>& consensus, std::chrono::milliseconds every);

  RenewalGroup(std::shared_ptr<Consensus> consensus, std::chrono::milliseconds every)
      : consensus_(std::move(consensus)), every_(every) {}
  ~RenewalGroup();
  RenewalGroup(const RenewalGroup&) = delete;
  RenewalGroup& operator=(const RenewalGroup&) = delete;

  void join(const std::shared_ptr<ConsensusLease::State>& lease);
  // No round starts a renewal of `lease` after this; one in progress may
  // still land (release() allows for it).
  void leave(const std::shared_ptr<ConsensusLease::State>& lease);

 private:
  using Key = std::pair<const Consensus*, std::int64_t>;
  // Every live group, weakly: a group lives while a lease holds it.
  static std::mutex& registry_mu();
  static std::map<Key, std::weak_ptr<RenewalGroup>>& registry();

  // One round: every member renewed, kRenewalBatch to a write.
  void renew_all();

  const std::shared_ptr<Consensus> consensus_;
  const std::chrono::milliseconds every_;
  std::mutex round_mu_;  // one round at a time
  std::mutex members_mu_;
  std::unordered_set<std::shared_ptr<ConsensusLease::State>> members_;  // guarded by members_mu_
  PeriodicTask task_;
};

std::mutex& RenewalGroup::registry_mu() {
  static auto* mu = new std::mutex;  // never destroyed: leases may outlive statics
  return *mu;
}

std::map<RenewalGroup::Key, std::weak_ptr<RenewalGroup>>& RenewalGroup::registry() {
  static auto* groups = new std::map<Key, std::weak_ptr<RenewalGroup>>;
  return *groups;
}

Result<std::shared_ptr<RenewalGroup>> RenewalGroup::of(const std::shared_ptr<Consensus>& consensus,
                                                       std::chrono::milliseconds every) {
  std::lock_guard lock(registry_mu());
  std::weak_ptr<RenewalGroup>& entry = registry()[Key{consensus.get(), every.count()}];
  if (auto group = entry.lock()) return group;
  auto group = std::make_shared<RenewalGroup>(consensus, every);
  // The task holds the group weakly: the last lease to leave ends both.
  TM_TRY(group->task_.start(every, [weak = std::weak_ptr<RenewalGroup>(group)] {
    auto self = weak.lock();
    if (!self) return false;
    self->renew_all();
    return true;
  }));
  entry = group;
  return group;
}

RenewalGroup::~RenewalGroup() {
  task_.stop();
  std::lock_guard lock(registry_mu());
  auto entry = registry().find(Key{consensus_.get(), every_.count()});
  // Another group may have taken the key since this one's last lease left.
  if (entry != registry().end() && entry->second.expired()) registry().erase(entry);
}

void RenewalGroup::join(const std::shared_ptr<ConsensusLease::State>& lease) {
  std::lock_guard lock(members_mu_);
  members_.insert(lease);
}

void RenewalGroup::leave(const std::shared_ptr<ConsensusLease::State>& lease) {
  {
    std::lock_guard lock(lease->mu);
    lease->released = true;  // a round that copied it already skips it
  }
  std::lock_guard lock(members_mu_);
  members_.erase(lease);
}

void RenewalGroup::renew_all() {
  std::lock_guard round(round_mu_);
  std::vector<std::shared_ptr<ConsensusLease::State>> members;
  {
    std::lock_guard lock(members_mu_);
    members.assign(members_.begin(), members_.end());
  }
  std::vector<ConsensusLease::State*> renewing;
  std::vector<CasRequest> requests;
  std::vector<std::pair<std::string, SeqNo>> truncations;
  for (std::size_t from = 0; from < members.size(); from += ConsensusLease::kRenewalBatch) {
    const std::size_t to = std::min(members.size(), from + ConsensusLease::kRenewalBatch);
    renewing.clear();
    requests.clear();
    truncations.clear();
    for (std::size_t i = from; i < to; ++i) {
      if (auto request = members[i]->next_renewal()) {
        renewing.push_back(members[i].get());
        requests.push_back(std::move(*request));
      }
    }
    if (requests.empty()) continue;
    const auto started = SteadyClock::now();
    std::vector<Result<CasOutcome>> outcomes = consensus_->compare_and_set_many(requests);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      Result<CasOutcome> outcome = i < outcomes.size()
                                       ? std::move(outcomes[i])
                                       : Result<CasOutcome>(determinate("no outcome"));
      if (renewing[i]->renewed(requests[i], outcome, started)) {
        truncations.emplace_back(requests[i].key, requests[i].next.seqno);
      }
    }
    // Best effort: older versions are history.
    if (!truncations.empty()) (void)consensus_->truncate_many(truncations);
  }
}

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
  auto token = value->find_string("token"), subject = value->find_string("subject"),
       sink = value->find_string("sink"), owner = value->find_string("owner"),
       runner = value->find_string("runner"), host = value->find_string("host"),
       machine = value->find_string("machine");
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

Result<std::optional<LeaseRecord>> read_lease(Consensus& consensus, std::string_view key) {
  TM_ASSIGN(auto head, consensus.head(key));
  if (!head) return std::nullopt;
  auto record = LeaseRecord::parse(head->data);
  if (!record) return corruption("lease " + std::string(key) + ": " + record.error().message);
  return std::optional<LeaseRecord>(std::move(*record));
}

Takeover take_over(const std::optional<LeaseRecord>& current, const LeaseRecord& candidate,
                   std::uint64_t now_ms, Liveness holder) {
  if (!current || current->released()) return Takeover::kFree;
  if (holder == Liveness::kDead) return Takeover::kHolderDead;
  if (!candidate.owner.empty() && candidate.owner == current->owner &&
      candidate.sink == current->sink) {
    return Takeover::kSameRunner;
  }
  // A live holder on this machine keeps it, renewed or not (it may be
  // paused between its check and its write, and it can be killed), unless
  // both are servers: a server's sink moves to another server once its
  // runner stops renewing, wherever that runner is (cluster failover).
  const bool between_servers = !candidate.owner.empty() && !current->owner.empty();
  if (holder == Liveness::kAlive && !between_servers) return Takeover::kRefused;
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
    auto lease = std::unique_ptr<ConsensusLease>(new ConsensusLease(std::make_shared<State>(
        std::move(consensus), std::move(key), next, options, seqno, started)));
    // Cannot renew: released again (the destructor) and refused.
    TM_ASSIGN(lease->group_, RenewalGroup::of(lease->state_->consensus, options.renew_every));
    lease->group_->join(lease->state_);
    return lease;
  }
  return determinate("lease " + key + ": lost " + std::to_string(kAttempts) +
                     " races for it in a row");
}

ConsensusLease::~ConsensusLease() {
  if (group_) group_->leave(state_);
  release();
}

std::unexpected<Error> ConsensusLease::taken_over(const LeaseRecord& holder) const {
  return make_error(ErrorKind::kHeld,
                    state_->record.subject + " was taken over by " + holder.describe_holder());
}

std::optional<CasRequest> ConsensusLease::State::next_renewal() {
  SeqNo expected;
  {
    std::lock_guard lock(mu);
    if (lost_to || released) return std::nullopt;
    expected = seqno;
  }
  // One write when nothing changed: our last landed version is the head
  // unless someone took the lease (or an indeterminate write of ours
  // landed), which renewed() tells apart.
  LeaseRecord next = record;
  next.expires_at_ms = wall_clock_millis() + static_cast<std::uint64_t>(options.duration.count());
  return CasRequest{key, expected, VersionedData{expected + 1, next.to_json()}};
}

bool ConsensusLease::State::renewed(const CasRequest& request, const Result<CasOutcome>& outcome,
                                    SteadyClock::time_point started) {
  if (outcome && *outcome == CasOutcome::kCommitted) {
    std::lock_guard lock(mu);
    seqno = request.next.seqno;
    landed = started;
    return seqno % kTruncateEvery == 0;
  }
  // The backend failed: the next round tries again (a write of ours that
  // landed after all shows there as a mismatch). No read now: with the
  // backend down, a read per lease would hold up the round by a timeout
  // each, and every other lease's renewal after it.
  if (!outcome) return false;
  auto head = consensus->head(key);
  if (!head || !*head) return false;  // try again next time (a missing head is lost at check())
  auto current = LeaseRecord::parse((*head)->data);
  if (!current) return false;
  std::lock_guard lock(mu);
  if (current->token != record.token) {
    lost_to = std::move(*current);
    return false;
  }
  // Still ours, at another seqno (a write of ours that seemed to fail
  // landed): renew from there next time. landed stays: when that write
  // started is not known.
  seqno = (*head)->seqno;
  return false;
}

Status ConsensusLease::check() {
  State& state = *state_;
  {
    std::lock_guard lock(state.mu);
    if (state.lost_to) return taken_over(*state.lost_to);
    const auto trusted_until = state.landed + state.options.duration - state.options.margin;
    if (SteadyClock::now() > trusted_until) {
      return determinate(state.record.subject + ": the lease was not renewed in time (is " +
                         state.key +
                         "'s consensus reachable?); not writing until it is taken again");
    }
  }
  auto head = state.consensus->head(state.key);
  if (!head) {
    Error error = head.error();
    error.message = state.record.subject + ": checking the lease: " + error.message;
    return std::unexpected(std::move(error));
  }
  if (!*head) {
    return make_error(ErrorKind::kHeld, state.record.subject + ": the lease " + state.key +
                                            " was deleted: it is not ours");
  }
  auto current = LeaseRecord::parse((*head)->data);
  if (!current) return corruption("lease " + state.key + ": " + current.error().message);
  if (current->token != state.record.token) {
    std::lock_guard lock(state.mu);
    state.lost_to = *current;
    return taken_over(*current);
  }
  return {};
}

void ConsensusLease::release() {
  State& state = *state_;
  // A renewal already in flight when the lease left its group may land
  // after the head read here: then the release meets it and tries again.
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto head = state.consensus->head(state.key);
    if (!head || !*head) return;
    auto current = LeaseRecord::parse((*head)->data);
    if (!current || current->token != state.record.token) return;  // not ours any more
    LeaseRecord released = *current;
    released.token.clear();
    released.expires_at_ms = 0;
    const SeqNo seqno = (*head)->seqno + 1;
    auto outcome = state.consensus->compare_and_set(state.key, (*head)->seqno,
                                                    VersionedData{seqno, released.to_json()});
    if (!outcome) return;  // best effort: an unreleased lease expires or is found dead
    if (*outcome == CasOutcome::kCommitted) {
      (void)state.consensus->truncate(state.key, seqno);
      return;
    }
  }
}
}  // namespace tidemark
