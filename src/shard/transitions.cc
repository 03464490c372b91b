// The pure transitions of a ShardState (transitions.h).
#include "shard/transitions.h"

#include <algorithm>

namespace tidemark {
namespace {

// The longest owner kept; a longer one is cut (it is only for people).
constexpr std::size_t kMaxOwnerBytes = 256;

Error expired(const ShardState& state, std::string_view what, std::string_view id) {
  return Error{ErrorKind::kNotFound,
               std::string(what) + " " + std::string(id) + " of shard " + state.name +
                   " has expired (its lease ran out or it was removed)",
               std::nullopt, std::nullopt};
}

// since = the least hold, never past upper and never backwards.
void advance_since(ShardState& state) {
  if (state.readers.empty()) return;
  Frontier least = Frontier::closed();
  for (const auto& [id, reader] : state.readers) least = std::min(least, reader.since);
  least = std::min(least, state.upper);
  if (state.since < least) state.since = least;
}

}  // namespace

bool expire_leases(ShardState& state, std::uint64_t now_ms) {
  std::size_t dropped = std::erase_if(state.readers, [&](const auto& entry) {
    return !entry.second.critical() && entry.second.lease_expires_ms < now_ms;
  });
  dropped += std::erase_if(
      state.writers, [&](const auto& entry) { return entry.second.lease_expires_ms < now_ms; });
  dropped += std::erase_if(state.producers,
                           [&](const auto& entry) { return entry.second.expires_ms < now_ms; });
  return dropped > 0;
}

void register_writer(ShardState& state, std::string_view writer_id, std::uint64_t lease_expires_ms,
                     std::uint64_t now_ms, std::string_view owner) {
  expire_leases(state, now_ms);
  WriterState& writer = state.writers[std::string(writer_id)];
  writer.lease_expires_ms = std::max(writer.lease_expires_ms, lease_expires_ms);
  if (!owner.empty()) writer.owner = owner.substr(0, kMaxOwnerBytes);
  advance_since(state);
}

Status heartbeat_writer(ShardState& state, std::string_view writer_id,
                        std::uint64_t lease_expires_ms, std::uint64_t now_ms) {
  expire_leases(state, now_ms);
  auto it = state.writers.find(writer_id);
  if (it == state.writers.end()) return std::unexpected(expired(state, "writer", writer_id));
  it->second.lease_expires_ms = std::max(it->second.lease_expires_ms, lease_expires_ms);
  advance_since(state);
  return {};
}

void remove_writer(ShardState& state, std::string_view writer_id, std::uint64_t now_ms) {
  expire_leases(state, now_ms);
  auto it = state.writers.find(writer_id);
  if (it != state.writers.end()) state.writers.erase(it);
  advance_since(state);
}

void register_reader(ShardState& state, std::string_view reader_id, bool critical,
                     std::uint64_t lease_expires_ms, std::uint64_t now_ms, std::string_view owner) {
  expire_leases(state, now_ms);
  auto it = state.readers.find(reader_id);
  if (it != state.readers.end() && !owner.empty()) {
    it->second.owner = owner.substr(0, kMaxOwnerBytes);  // a restarted sink's new process
  }
  if (it == state.readers.end()) {
    ReaderState reader;
    reader.since = state.since;
    reader.owner = owner.substr(0, kMaxOwnerBytes);
    if (!critical) {
      reader.lease_expires_ms = std::max<std::uint64_t>(lease_expires_ms, 1);
      reader.seqno = state.seqno + 1;
    }
    state.readers.emplace(std::string(reader_id), reader);
  } else if (!critical) {
    it->second.lease_expires_ms = std::max<std::uint64_t>(lease_expires_ms, 1);
  }
  advance_since(state);
}

Status heartbeat_reader(ShardState& state, std::string_view reader_id,
                        std::uint64_t lease_expires_ms, std::uint64_t now_ms,
                        std::optional<SeqNo> pinned) {
  expire_leases(state, now_ms);
  auto it = state.readers.find(reader_id);
  if (it == state.readers.end()) return std::unexpected(expired(state, "reader", reader_id));
  if (!it->second.critical()) {
    it->second.lease_expires_ms = std::max(it->second.lease_expires_ms, lease_expires_ms);
    it->second.seqno = std::max(it->second.seqno, pinned.value_or(state.seqno + 1));
  }
  advance_since(state);
  return {};
}

void heartbeat_readers(ShardState& state, std::span<const ReaderBeat> beats, std::uint64_t now_ms,
                       std::vector<std::string>* expired) {
  expire_leases(state, now_ms);
  for (const ReaderBeat& beat : beats) {
    auto it = state.readers.find(beat.reader_id);
    if (it == state.readers.end()) {
      expired->emplace_back(beat.reader_id);
      continue;
    }
    if (!it->second.critical()) {
      it->second.lease_expires_ms = std::max(it->second.lease_expires_ms, beat.lease_expires_ms);
      it->second.seqno = std::max(it->second.seqno, beat.pinned.value_or(state.seqno + 1));
    }
  }
  advance_since(state);
}

Status downgrade_reader_since(ShardState& state, std::string_view reader_id, Frontier since,
                              std::uint64_t now_ms) {
  expire_leases(state, now_ms);
  auto it = state.readers.find(reader_id);
  if (it == state.readers.end()) return std::unexpected(expired(state, "reader", reader_id));
  if (it->second.since < since) it->second.since = since;
  advance_since(state);
  return {};
}

void remove_reader(ShardState& state, std::string_view reader_id, std::uint64_t now_ms) {
  expire_leases(state, now_ms);
  auto it = state.readers.find(reader_id);
  if (it != state.readers.end()) state.readers.erase(it);
  advance_since(state);
}

Result<bool> bury(ShardState& state, bool force) {
  if (state.deleted) return false;
  if (!force) {
    std::string held;
    for (const auto& [id, reader] : state.readers) {
      if (reader.critical()) held += (held.empty() ? "" : ", ") + id;
    }
    if (!held.empty()) {
      return make_error(ErrorKind::kHeld,
                        "shard " + state.name + " is held by " + held +
                            " (a sink's hold): delete the sink or release the hold (shard "
                            "release) first, or delete with force");
    }
  }
  state.deleted = true;
  state.batches.clear();
  state.readers.clear();
  state.writers.clear();
  state.producers.clear();
  return true;
}

bool revive(ShardState& state) {
  if (!state.deleted) return false;
  ShardState fresh;
  fresh.name = state.name;
  fresh.seqno = state.seqno;
  fresh.rollup = state.rollup;
  fresh.rollup_id = state.rollup_id;
  fresh.incarnation = state.incarnation + 1;
  state = std::move(fresh);
  return true;
}

SeqNo seqno_since(const ShardState& state) {
  SeqNo least = state.seqno;
  for (const auto& [id, reader] : state.readers) {
    if (!reader.critical()) least = std::min(least, reader.seqno);
  }
  return least;
}

std::unexpected<Error> upper_mismatch(Frontier expected, Frontier current) {
  Error error{
      ErrorKind::kUpperMismatch,
      "expected upper " + expected.to_string() + " but the shard's upper is " + current.to_string(),
      expected.as_optional(), current.as_optional()};
  return std::unexpected(std::move(error));
}

Status validate_append_shape(Frontier expected_upper, Frontier new_upper,
                             std::span<const Description> batches, bool has_data) {
  if (new_upper < expected_upper) {
    return invalid_usage("new upper " + new_upper.to_string() + " is below expected upper " +
                         expected_upper.to_string());
  }
  if (expected_upper.is_closed()) return invalid_usage("the shard is closed to appends");
  if (new_upper == expected_upper && has_data) {
    return invalid_usage("empty interval [" + expected_upper.to_string() + ", " +
                         new_upper.to_string() + ") cannot carry data");
  }
  for (const Description& desc : batches) {
    if (desc.upper < desc.lower) {
      return invalid_usage("batch description " + desc.to_string() + " has upper < lower");
    }
    if (desc.lower < expected_upper || new_upper < desc.upper) {
      return invalid_usage("batch " + desc.to_string() + " does not lie within [" +
                           expected_upper.to_string() + ", " + new_upper.to_string() + ")");
    }
  }
  return {};
}

Status validate_producer_id(std::string_view id) {
  if (id.empty() || id.size() > 128) {
    return invalid_usage("producer id must be 1 to 128 characters, got " +
                         std::to_string(id.size()));
  }
  for (char c : id) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return invalid_usage("producer id \"" + std::string(id) +
                           "\" has a character outside [A-Za-z0-9._-]");
    }
  }
  return {};
}

ProducerCheck check_producer(const ShardState& state, std::string_view producer,
                             std::uint64_t first, std::size_t max_producers) {
  using Verdict = ProducerCheck::Verdict;
  auto it = state.producers.find(producer);
  if (it == state.producers.end()) {
    if (first > 0) return {Verdict::kGap, 0};
    if (max_producers > 0 && state.producers.size() >= max_producers) return {Verdict::kFull, 0};
    return {Verdict::kNext, 0};
  }
  const std::uint64_t expected = it->second.sequence + 1;
  if (first == expected) return {Verdict::kNext, expected};
  return {first < expected ? Verdict::kDuplicate : Verdict::kGap, expected};
}

Result<AppendOutcome> apply_append(ShardState& state, const AppendRequest& request) {
  auto writer = state.writers.find(request.writer_id);
  if (writer == state.writers.end()) {
    if (request.writer_registered) {
      return make_error(ErrorKind::kLeaseExpired,
                        "writer " + std::string(request.writer_id) + " of shard " + state.name +
                            " lost its lease (no heartbeat for the lease time: its process was "
                            "paused or cut off); nothing was appended");
    }
    return invalid_usage("unknown writer " + std::string(request.writer_id) + " for shard " +
                         state.name);
  }
  if (!request.idempotency_token.empty() &&
      writer->second.last_token == request.idempotency_token) {
    return AppendOutcome::kAlreadyCommitted;
  }
  if (state.upper != request.expected_upper) {
    return upper_mismatch(request.expected_upper, state.upper);
  }
  // A part whose writer is gone may be deleted by garbage collection at any
  // moment: never registered.
  const std::string part_prefix = shard_part_prefix(state.name);
  for (const PartRef& part : request.parts) {
    const std::string_view part_writer = part_key_writer(part.key, part_prefix);
    if (!part_writer.empty() && !state.writers.contains(part_writer)) {
      return make_error(ErrorKind::kLeaseExpired,
                        "part " + part.key + " was written by writer " + std::string(part_writer) +
                            ", whose lease has expired (garbage collection may delete its "
                            "parts): build the batch again; nothing was appended");
    }
  }
  // Producers first: the transition changes nothing unless all continue.
  for (const ProducerRange& range : request.producers) {
    if (range.last < range.first) return invalid_usage("producer range with last < first");
    const ProducerCheck check =
        check_producer(state, range.producer, range.first, request.max_producers);
    if (check.verdict != ProducerCheck::Verdict::kNext) {
      return make_error(
          ErrorKind::kSequenceMismatch,
          "producer " + range.producer + " appends from sequence " + std::to_string(range.first) +
              " but shard " + state.name + " expects " + std::to_string(check.expected) +
              (check.verdict == ProducerCheck::Verdict::kFull ? " and keeps no more producers"
                                                              : ""));
    }
    // A copy: a later range of the same producer continues from this one.
    state.producers[range.producer] =
        ProducerState{range.last, range.time, request.producer_expires_ms};
  }
  if (!request.parts.empty()) {
    HollowBatch batch;
    batch.desc = Description{request.expected_upper, request.new_upper, state.since};
    batch.parts = PartList(std::vector<PartRef>(request.parts.begin(), request.parts.end()));
    batch.ordered = request.ordered;
    state.batches.push_back(std::move(batch));
  }
  state.upper = request.new_upper;
  writer->second.last_token = std::string(request.idempotency_token);
  writer->second.lease_expires_ms =
      std::max(writer->second.lease_expires_ms, request.lease_expires_ms);
  return AppendOutcome::kApplied;
}

}  // namespace tidemark
