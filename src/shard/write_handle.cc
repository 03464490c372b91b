#include <algorithm>
#include <thread>

#include "shard/batch_ownership.h"
#include "shard/compactor.h"
#include "shard/context.h"
#include "shard/spine.h"
#include "shard/state.h"
#include "tidemark/write.h"
#include "util/clock.h"
#include "util/ids.h"
#include "util/periodic.h"
#include "util/try.h"

namespace tidemark {
namespace {

// Writes the inline parts among `parts` to the blob store under their keys;
// they are blob parts from then on.
Status write_inline_parts(ShardContext& context, std::vector<PartRef>& parts) {
  for (PartRef& part : parts) {
    if (!part.is_inline()) continue;
    TM_TRY(with_retries(context.options.write_retry,
                        [&] { return context.location.blob->set(part.key, *part.data); }));
    part.data.reset();
  }
  return {};
}

}  // namespace

WriteHandle::WriteHandle(std::shared_ptr<ShardContext> context, std::string writer_id)
    : context_(std::move(context)),
      writer_id_(std::move(writer_id)),
      heartbeat_(std::make_unique<PeriodicTask>()) {}

Status WriteHandle::start_heartbeat() {
  return heartbeat_->start(
      std::max(context_->options.writer_lease / 3, std::chrono::milliseconds(1)), [this] {
        const std::string id = this->writer_id();
        auto beat = context_->machine->apply([&](ShardState& state) -> Result<TransitionResult> {
          TM_TRY(heartbeat_writer(state, id, lease_expiry(), wall_clock_millis()));
          return TransitionResult::kWrite;
        });
        // Expired (the process was paused or cut off past the lease): a
        // writer of a new id takes its place, so appends go on.
        if (!beat && beat.error().is(ErrorKind::kNotFound)) (void)reregister(id);
        return true;
      });
}

WriteHandle::~WriteHandle() {
  heartbeat_->stop();
  const std::string id = writer_id();
  (void)context_->machine->apply([&](ShardState& state) -> Result<TransitionResult> {
    remove_writer(state, id, wall_clock_millis());
    return TransitionResult::kWrite;
  });
}

std::string WriteHandle::writer_id() const {
  std::lock_guard lock(mu_);
  return writer_id_;
}

Status WriteHandle::reregister(const std::string& expired_id) {
  std::lock_guard lock(mu_);
  if (writer_id_ != expired_id) return {};  // done already
  // Never the old id: its parts are orphans garbage collection may delete,
  // and its record of its last append is gone.
  std::string fresh = "w" + random_id();
  TM_TRY(context_->machine->apply([&](ShardState& state) -> Result<TransitionResult> {
    const std::uint64_t now = wall_clock_millis();
    register_writer(state, fresh, lease_expiry(), now, context_->options.owner);
    return TransitionResult::kWrite;
  }));
  writer_id_ = std::move(fresh);
  return {};
}

std::uint64_t WriteHandle::lease_expiry() const {
  return wall_clock_millis() + static_cast<std::uint64_t>(context_->options.writer_lease.count());
}

Result<Frontier> WriteHandle::fetch_upper() {
  TM_ASSIGN(StatePtr state, context_->machine->fetch());
  upper_ = state->upper;
  return upper_;
}

BatchBuilder WriteHandle::builder(Frontier lower) {
  return BatchBuilder(context_, writer_id(), lower);
}

Result<Batch> WriteHandle::batch(std::span<const Update> updates, Frontier lower, Frontier upper) {
  BatchBuilder b = builder(lower);
  for (const Update& u : updates) TM_TRY(b.add(u.key, u.value, u.time, u.diff));
  return b.finish(upper);
}

std::chrono::milliseconds WriteHandle::wait_for_compaction(const std::function<bool()>& stop) {
  using std::chrono::steady_clock;
  const auto started = steady_clock::now();
  if (!context_->compactor) return std::chrono::milliseconds(0);
  auto last_progress = started;
  std::size_t fewest = SIZE_MAX;
  for (;;) {
    auto state = context_->machine->latest_known();
    if (!state) break;  // the commit that follows meets the same failure
    const std::size_t inputs = read_inputs(**state);
    if (inputs <= kStallReadInputs || (stop && stop())) break;
    const auto now = steady_clock::now();
    if (inputs < fewest) {
      fewest = inputs;
      last_progress = now;
    } else if (now - last_progress >= kStallMaxWait) {
      break;
    }
    context_->request_compaction(**state);
    std::this_thread::sleep_for(kStallPoll);
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(steady_clock::now() - started);
}

bool WriteHandle::compaction_behind() const {
  if (!context_->compactor) return false;
  auto state = context_->machine->latest_known();
  return state && read_inputs(**state) > kStallReadInputs;
}

Status WriteHandle::compare_and_append(std::span<Batch> batches, Frontier expected_upper,
                                       Frontier new_upper) {
  return compare_and_append(batches, expected_upper, new_upper, random_id());
}

Status WriteHandle::compare_and_append(std::span<Batch> batches, Frontier expected_upper,
                                       Frontier new_upper, std::string_view idempotency_token) {
  return compare_and_append(batches, expected_upper, new_upper, idempotency_token, {});
}

Status WriteHandle::compare_and_append(std::span<Batch> batches, Frontier expected_upper,
                                       Frontier new_upper, std::string_view idempotency_token,
                                       std::span<const ProducerRange> producers) {
  if (idempotency_token.empty()) return invalid_usage("an idempotency token cannot be empty");
  std::vector<Description> descs;
  std::vector<PartRef> parts;
  for (const Batch& batch : batches) {
    if (batch.shard() != context_->name) {
      return invalid_usage("batch from another shard (" + batch.shard() +
                           ") cannot be appended to " + "shard " + context_->name);
    }
    descs.push_back(batch.desc());
    parts.insert(parts.end(), batch.parts().begin(), batch.parts().end());
  }
  TM_TRY(validate_append_shape(expected_upper, new_upper, descs, !parts.empty()));

  for (const ProducerRange& range : producers) TM_TRY(validate_producer_id(range.producer));
  const ClientOptions& options = context_->options;
  const std::string id = writer_id();
  // A retry of an attempt in doubt starts in doubt.
  bool maybe_landed = false;
  {
    std::lock_guard lock(mu_);
    maybe_landed = doubt_token_ == idempotency_token;
    if (maybe_landed && doubt_writer_ != id) {
      return make_error(ErrorKind::kIndeterminate,
                        "an earlier attempt under this token, by writer " + doubt_writer_ +
                            ", may have been committed, and that writer lost its lease with "
                            "the record that would tell; read the shard to find out");
    }
  }
  AppendRequest request{
      .writer_id = id,
      .idempotency_token = idempotency_token,
      .expected_upper = expected_upper,
      .new_upper = new_upper,
      .parts = parts,
      // Several batches' parts together are loose, whatever each was.
      .ordered = batches.size() == 1 && batches[0].ordered(),
      .lease_expires_ms = lease_expiry(),
      .producers = producers,
      .producer_expires_ms =
          wall_clock_millis() + static_cast<std::uint64_t>(options.producer_expiry.count()),
      .max_producers = options.max_producers,
      .writer_registered = true};
  // Repeated under the same token, a call that may have landed commits
  // once: failures that may pass are retried (options.write_retry). Once an
  // attempt may have landed, a later LeaseExpired is only a "maybe" (the
  // lost writer took the record of that attempt with it).
  //
  // Inline parts go into the state only while it has room for them
  // (options.inline_state_max_bytes); otherwise they are written to the
  // blob store first, under their keys, and appended as blob parts.
  bool carries_inline =
      std::any_of(parts.begin(), parts.end(), [](const PartRef& p) { return p.is_inline(); });
  bool no_room = false;
  Backoff backoff(options.write_retry);
  Result<StatePtr> applied;
  for (;;) {
    applied = context_->machine->apply(
        [&](ShardState& state) -> Result<TransitionResult> {
          TM_ASSIGN(AppendOutcome outcome, apply_append(state, request));
          if (outcome != AppendOutcome::kApplied) return TransitionResult::kUnchanged;
          if (carries_inline && inline_bytes(state) > options.inline_state_max_bytes) {
            no_room = true;
            return make_error(ErrorKind::kFull, "no room for inline parts in the shard's state");
          }
          // Where compaction runs, the small merges this append makes due ride
          // in its commit (compactor.h).
          if (context_->compactor) (void)merge_inline_tail(*context_, state, wall_clock_millis());
          return TransitionResult::kWrite;
        },
        Carry::kRiders);
    if (no_room) {
      // Nothing was written: this state did not hold the append.
      no_room = false;
      carries_inline = false;
      if (auto spilled = write_inline_parts(*context_, parts); !spilled) {
        applied = std::unexpected(spilled.error());
        break;
      }
      continue;
    }
    if (applied || !is_retryable(applied.error())) break;
    maybe_landed = maybe_landed || applied.error().is(ErrorKind::kIndeterminate);
    if (!backoff.next()) break;
  }
  if (!applied && maybe_landed && applied.error().is(ErrorKind::kLeaseExpired)) {
    applied = std::unexpected(Error{ErrorKind::kIndeterminate,
                                    "this append may have been committed before its writer lost "
                                    "its lease (" +
                                        applied.error().message + ")",
                                    std::nullopt, std::nullopt});
  }
  if (!applied && maybe_landed && !applied.error().is(ErrorKind::kIndeterminate) &&
      is_retryable(applied.error())) {
    applied =
        std::unexpected(Error{ErrorKind::kIndeterminate,
                              "after an earlier indeterminate attempt: " + applied.error().message,
                              std::nullopt, std::nullopt});
  }
  {
    std::lock_guard lock(mu_);
    if (!applied && applied.error().is(ErrorKind::kIndeterminate)) {
      doubt_token_ = std::string(idempotency_token);
      doubt_writer_ = id;
    } else if (doubt_token_ == idempotency_token) {
      doubt_token_.clear();  // settled
    }
  }
  if (applied) {
    for (Batch& batch : batches) BatchOwnership::committed(batch);
    upper_ = new_upper;
    context_->request_compaction(**applied);
    return {};
  }
  const Error& error = applied.error();
  if (error.is(ErrorKind::kUpperMismatch)) {
    upper_ = Frontier::from_optional(error.current_upper);
  } else if (error.is(ErrorKind::kLeaseExpired)) {
    // Register anew for the retry (whose batches are built under the new id).
    if (auto again = reregister(id); !again) {
      return make_error(ErrorKind::kLeaseExpired,
                        error.message + "; registering again failed too: " + again.error().message);
    }
  } else if (error.is(ErrorKind::kIndeterminate)) {
    for (Batch& batch : batches) BatchOwnership::maybe_committed(batch);
  }
  return std::unexpected(error);
}

}  // namespace tidemark
