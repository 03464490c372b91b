#include "shard/state.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "util/coding.h"
#include "util/ids.h"

namespace tidemark {
namespace {

// 3 and 4: leases on writers, seqno holds, ordered batches, rollups in blob.
// 5 and 6: producers; a diff names its rollup's id too (rollup keys are
// unique per write). 7 and 8: the owners of readers and writers; a full
// state carries the incarnation and the tombstone flag. The older formats
// are still read: a shard written by an older Tidemark goes on in the new
// formats from its next version.
constexpr std::uint8_t kStateFormatVersion = 7;
constexpr std::uint8_t kDiffFormatVersion = 8;
constexpr std::uint8_t kProducersStateFormatVersion = 5;
constexpr std::uint8_t kProducersDiffFormatVersion = 6;
constexpr std::uint8_t kOldStateFormatVersion = 3;
constexpr std::uint8_t kOldDiffFormatVersion = 4;
constexpr std::uint8_t kRegistryFormatVersion = 1;
// The longest owner kept; a longer one is cut (it is only for people).
constexpr std::size_t kMaxOwnerBytes = 256;
// The state's flags byte (format 7): bit 0 a tombstone.
constexpr std::uint8_t kStateDeleted = 1;

bool get_string(Decoder& d, std::string* s) {
  std::string_view v;
  if (!d.get_bytes(&v)) return false;
  s->assign(v);
  return true;
}

// A batch's flags byte: bit 0 ordered; bit 1 each part is followed by its
// inline bytes (empty for a blob part). A batch without inline parts is
// written as before bit 1 existed, and a Tidemark that predates it refuses
// a batch with the bit (malformed) rather than misread it.
constexpr std::uint8_t kBatchOrdered = 1;
constexpr std::uint8_t kBatchInlineParts = 2;

void put_batch(Encoder& e, const HollowBatch& batch) {
  put_frontier(e, batch.desc.lower);
  put_frontier(e, batch.desc.upper);
  put_frontier(e, batch.desc.since);
  const bool any_inline = std::any_of(batch.parts.begin(), batch.parts.end(),
                                      [](const PartRef& p) { return p.is_inline(); });
  e.put_u8(static_cast<std::uint8_t>((batch.ordered ? kBatchOrdered : 0) |
                                     (any_inline ? kBatchInlineParts : 0)));
  e.put_varint(batch.parts.size());
  for (const PartRef& part : batch.parts) {
    e.put_bytes(part.key);
    e.put_varint(part.size);
    e.put_varint(part.count);
    e.put_varint(part.bytes);
    e.put_varint(part.time_min);
    e.put_varint(part.time_max);
    put_frontier(e, part.lower);
    put_frontier(e, part.upper);
    if (any_inline) e.put_bytes(part.data ? std::string_view(*part.data) : std::string_view());
  }
}

bool get_batch(Decoder& d, HollowBatch* batch) {
  if (!get_frontier(d, &batch->desc.lower) || !get_frontier(d, &batch->desc.upper) ||
      !get_frontier(d, &batch->desc.since)) {
    return false;
  }
  std::uint8_t flags;
  if (!d.get_u8(&flags) || (flags & ~(kBatchOrdered | kBatchInlineParts)) != 0) return false;
  batch->ordered = (flags & kBatchOrdered) != 0;
  std::uint64_t count;
  if (!d.get_varint(&count) || count > d.remaining()) return false;
  std::vector<PartRef> parts(count);
  for (PartRef& part : parts) {
    if (!get_string(d, &part.key) || !d.get_varint(&part.size) || !d.get_varint(&part.count) ||
        !d.get_varint(&part.bytes) || !d.get_varint(&part.time_min) ||
        !d.get_varint(&part.time_max) || !get_frontier(d, &part.lower) ||
        !get_frontier(d, &part.upper)) {
      return false;
    }
    if ((flags & kBatchInlineParts) != 0) {
      std::string_view bytes;
      if (!d.get_bytes(&bytes)) return false;
      if (!bytes.empty()) {
        // An inline part is exactly the encoding its reference sizes.
        if (bytes.size() != part.size) return false;
        part.data = std::make_shared<const std::string>(bytes);
      }
    }
  }
  batch->parts = PartList(std::move(parts));
  return true;
}

// Writers and readers carry their owner from formats 7 and 8 on.
void put_writer(Encoder& e, const std::string& id, const WriterState& writer) {
  e.put_bytes(id);
  e.put_bytes(writer.last_token);
  e.put_varint(writer.lease_expires_ms);
  e.put_bytes(writer.owner);
}

bool get_writer(Decoder& d, std::string* id, WriterState* writer, bool with_owner) {
  return get_string(d, id) && get_string(d, &writer->last_token) &&
         d.get_varint(&writer->lease_expires_ms) && (!with_owner || get_string(d, &writer->owner));
}

void put_reader(Encoder& e, const std::string& id, const ReaderState& reader) {
  e.put_bytes(id);
  put_frontier(e, reader.since);
  e.put_varint(reader.lease_expires_ms);
  e.put_varint(reader.seqno);
  e.put_bytes(reader.owner);
}

bool get_reader(Decoder& d, std::string* id, ReaderState* reader, bool with_owner) {
  return get_string(d, id) && get_frontier(d, &reader->since) &&
         d.get_varint(&reader->lease_expires_ms) && d.get_varint(&reader->seqno) &&
         (!with_owner || get_string(d, &reader->owner));
}

void put_producer(Encoder& e, const std::string& id, const ProducerState& producer) {
  e.put_bytes(id);
  e.put_varint(producer.sequence);
  e.put_varint(producer.time);
  e.put_varint(producer.expires_ms);
}

bool get_producer(Decoder& d, std::string* id, ProducerState* producer) {
  return get_string(d, id) && d.get_varint(&producer->sequence) && d.get_varint(&producer->time) &&
         d.get_varint(&producer->expires_ms);
}

// The invariants of ShardState (state.h); `bad` names what is wrong.
Status validate_state(const ShardState& state,
                      const std::function<std::unexpected<Error>(std::string)>& bad) {
  if (state.upper < state.since) return bad("since is beyond upper");
  if (state.deleted && (!state.batches.empty() || !state.readers.empty() ||
                        !state.writers.empty() || !state.producers.empty())) {
    return bad("a deleted shard still holds batches, readers, writers or producers");
  }
  Frontier previous_upper = Frontier::at(0);
  for (std::size_t i = 0; i < state.batches.size(); ++i) {
    const HollowBatch& batch = state.batches[i];
    if (batch.desc.upper < batch.desc.lower || batch.desc.lower < previous_upper ||
        state.upper < batch.desc.upper || batch.desc.lower.is_closed()) {
      return bad("batch " + std::to_string(i) + " has description " + batch.desc.to_string() +
                 " out of order or beyond upper " + state.upper.to_string());
    }
    previous_upper = batch.desc.upper;
    for (const PartRef& part : batch.parts) {
      if (part.lower < batch.desc.lower || batch.desc.upper < part.upper ||
          part.upper < part.lower) {
        return bad("part " + part.key + " registered outside its batch");
      }
    }
  }
  return {};
}

}  // namespace

std::uint64_t inline_bytes(const ShardState& state) {
  std::uint64_t bytes = 0;
  for (const HollowBatch& batch : state.batches) {
    for (const PartRef& part : batch.parts) bytes += part.is_inline() ? part.size : 0;
  }
  return bytes;
}

std::uint64_t HollowBatch::count() const {
  std::uint64_t n = 0;
  for (const PartRef& p : parts) n += p.count;
  return n;
}

std::uint64_t HollowBatch::bytes() const {
  std::uint64_t n = 0;
  for (const PartRef& p : parts) n += p.size;
  return n;
}

std::uint64_t HollowBatch::payload_bytes() const {
  std::uint64_t n = 0;
  for (const PartRef& p : parts) n += p.bytes;
  return n;
}

std::string shard_consensus_key(std::string_view shard) {
  return "shard/" + std::string(shard);
}
std::string shard_part_prefix(std::string_view shard) {
  return "shard/" + std::string(shard) + "/part/";
}
std::string registry_consensus_key() {
  return "registry";
}

std::string part_key(std::string_view shard, std::string_view writer_id) {
  return shard_part_prefix(shard) + std::string(writer_id) + "_" + random_id();
}

std::string_view part_key_writer(std::string_view key, std::string_view prefix) {
  if (!key.starts_with(prefix)) return {};
  std::string_view rest = key.substr(prefix.size());
  std::size_t underscore = rest.find('_');
  if (underscore == std::string_view::npos || underscore == 0) return {};
  return rest.substr(0, underscore);
}

std::string shard_rollup_prefix(std::string_view shard) {
  return "shard/" + std::string(shard) + "/rollup/";
}

std::string rollup_key(std::string_view shard, SeqNo seqno, std::string_view id) {
  // Zero-padded so keys sort by seqno.
  char digits[21];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(seqno));
  std::string key = shard_rollup_prefix(shard) + digits;
  if (!id.empty()) key.append("-").append(id);
  return key;
}

std::optional<RollupRef> parse_rollup_key(std::string_view key, std::string_view prefix) {
  if (!key.starts_with(prefix)) return std::nullopt;
  std::string_view rest = key.substr(prefix.size());
  if (rest.size() < 20) return std::nullopt;
  std::string_view digits = rest.substr(0, 20);
  RollupRef out;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    if (out.seqno > (UINT64_MAX - 9) / 10) return std::nullopt;
    out.seqno = out.seqno * 10 + static_cast<SeqNo>(c - '0');
  }
  rest.remove_prefix(20);
  if (!rest.empty()) {
    if (rest.size() < 2 || rest[0] != '-') return std::nullopt;
    out.id = std::string(rest.substr(1));
  }
  return out;
}

Status validate_shard_name(std::string_view name) {
  if (name.empty() || name.size() > 128) {
    return invalid_usage("shard name must be 1 to 128 characters, got " +
                         std::to_string(name.size()));
  }
  for (char c : name) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return invalid_usage("shard name \"" + std::string(name) +
                           "\" has a character outside [A-Za-z0-9._-]");
    }
  }
  if (name == "." || name == "..") return invalid_usage("shard name cannot be \".\" or \"..\"");
  // Blob keys use the name as a path component, and ".tmp-" components are
  // reserved for files being written.
  if (name.starts_with(".tmp-")) return invalid_usage("shard name cannot start with \".tmp-\"");
  return {};
}

std::string encode_state(const ShardState& state) {
  std::string out;
  Encoder e(&out);
  e.put_u8(kStateFormatVersion);
  e.put_bytes(state.name);
  e.put_varint(state.incarnation);
  e.put_u8(state.deleted ? kStateDeleted : 0);
  put_frontier(e, state.upper);
  put_frontier(e, state.since);
  e.put_varint(state.writers.size());
  for (const auto& [id, writer] : state.writers) put_writer(e, id, writer);
  e.put_varint(state.readers.size());
  for (const auto& [id, reader] : state.readers) put_reader(e, id, reader);
  e.put_varint(state.producers.size());
  for (const auto& [id, producer] : state.producers) put_producer(e, id, producer);
  e.put_varint(state.batches.size());
  for (const HollowBatch& batch : state.batches) put_batch(e, batch);
  return out;
}

Result<ShardState> decode_state(std::string_view shard, const VersionedData& data) {
  auto bad = [&](std::string what) {
    return corruption("state of shard " + std::string(shard) + " at seqno " +
                      std::to_string(data.seqno) + ": " + what);
  };
  Decoder d(data.data);
  std::uint8_t version;
  if (!d.get_u8(&version)) return bad("empty");
  if (version != kStateFormatVersion && version != kProducersStateFormatVersion &&
      version != kOldStateFormatVersion) {
    return bad("unsupported state format version " + std::to_string(version));
  }
  const bool with_owners = version >= kStateFormatVersion;
  ShardState state;
  state.seqno = data.seqno;
  state.rollup = data.seqno;
  if (!get_string(d, &state.name)) return bad("truncated name");
  if (state.name != shard) return bad("holds shard \"" + state.name + "\"");
  if (with_owners) {
    std::uint8_t flags;
    if (!d.get_varint(&state.incarnation) || !d.get_u8(&flags)) return bad("truncated header");
    if ((flags & ~kStateDeleted) != 0) return bad("unknown state flags");
    state.deleted = (flags & kStateDeleted) != 0;
  }
  if (!get_frontier(d, &state.upper) || !get_frontier(d, &state.since)) {
    return bad("malformed frontiers");
  }
  std::uint64_t writers;
  if (!d.get_varint(&writers) || writers > d.remaining()) return bad("malformed writer count");
  for (std::uint64_t i = 0; i < writers; ++i) {
    std::string id;
    WriterState writer;
    if (!get_writer(d, &id, &writer, with_owners)) return bad("malformed writer");
    state.writers.emplace(std::move(id), std::move(writer));
  }
  std::uint64_t readers;
  if (!d.get_varint(&readers) || readers > d.remaining()) return bad("malformed reader count");
  for (std::uint64_t i = 0; i < readers; ++i) {
    std::string id;
    ReaderState reader;
    if (!get_reader(d, &id, &reader, with_owners)) return bad("malformed reader");
    state.readers.emplace(std::move(id), std::move(reader));
  }
  if (version != kOldStateFormatVersion) {
    std::uint64_t producers;
    if (!d.get_varint(&producers) || producers > d.remaining()) {
      return bad("malformed producer count");
    }
    for (std::uint64_t i = 0; i < producers; ++i) {
      std::string id;
      ProducerState producer;
      if (!get_producer(d, &id, &producer)) return bad("malformed producer");
      state.producers.emplace(std::move(id), producer);
    }
  }
  std::uint64_t batches;
  if (!d.get_varint(&batches) || batches > d.remaining()) return bad("malformed batch count");
  state.batches.resize(batches);
  for (HollowBatch& batch : state.batches) {
    if (!get_batch(d, &batch)) return bad("malformed batch");
  }
  if (!d.empty()) return bad("trailing bytes");
  TM_TRY(validate_state(state, bad));
  return state;
}

bool is_full_version(std::string_view data) {
  if (data.empty()) return false;
  const auto version = static_cast<std::uint8_t>(data[0]);
  return version == kStateFormatVersion || version == kProducersStateFormatVersion ||
         version == kOldStateFormatVersion;
}

bool diff_can_carry(const ShardState& before, const ShardState& after) {
  return before.incarnation == after.incarnation && before.deleted == after.deleted;
}

namespace {

// A diff's header: its format version and the rollup it names.
bool get_diff_header(Decoder& d, std::uint8_t* version, RollupRef* rollup) {
  if (!d.get_u8(version) || !d.get_varint(&rollup->seqno)) return false;
  if (*version == kOldDiffFormatVersion) return true;
  return (*version == kDiffFormatVersion || *version == kProducersDiffFormatVersion) &&
         get_string(d, &rollup->id);
}

}  // namespace

Result<RollupRef> version_rollup(std::string_view shard, const VersionedData& data) {
  if (is_full_version(data.data)) return RollupRef{data.seqno, {}};
  Decoder d(data.data);
  std::uint8_t version;
  RollupRef rollup;
  if (!get_diff_header(d, &version, &rollup) || rollup.seqno >= data.seqno) {
    return corruption("state of shard " + std::string(shard) + " at seqno " +
                      std::to_string(data.seqno) + ": neither a full state nor a diff");
  }
  return rollup;
}

std::string encode_diff(const ShardState& before, const ShardState& after,
                        const RollupRef& rollup) {
  std::string out;
  Encoder e(&out);
  e.put_u8(kDiffFormatVersion);
  e.put_varint(rollup.seqno);
  e.put_bytes(rollup.id);
  put_frontier(e, after.upper);
  put_frontier(e, after.since);
  // Writers added or changed, then writers removed.
  std::vector<std::pair<const std::string*, const WriterState*>> upserts;
  for (const auto& [id, writer] : after.writers) {
    auto old = before.writers.find(id);
    if (old == before.writers.end() || !(old->second == writer)) upserts.emplace_back(&id, &writer);
  }
  e.put_varint(upserts.size());
  for (const auto& [id, writer] : upserts) put_writer(e, *id, *writer);
  std::vector<const std::string*> removed;
  for (const auto& [id, writer] : before.writers) {
    if (!after.writers.contains(id)) removed.push_back(&id);
  }
  e.put_varint(removed.size());
  for (const std::string* id : removed) e.put_bytes(*id);
  // Readers added or changed, then readers removed.
  std::vector<std::pair<const std::string*, const ReaderState*>> reader_upserts;
  for (const auto& [id, reader] : after.readers) {
    auto old = before.readers.find(id);
    if (old == before.readers.end() || !(old->second == reader)) {
      reader_upserts.emplace_back(&id, &reader);
    }
  }
  e.put_varint(reader_upserts.size());
  for (const auto& [id, reader] : reader_upserts) put_reader(e, *id, *reader);
  std::vector<const std::string*> readers_removed;
  for (const auto& [id, reader] : before.readers) {
    if (!after.readers.contains(id)) readers_removed.push_back(&id);
  }
  e.put_varint(readers_removed.size());
  for (const std::string* id : readers_removed) e.put_bytes(*id);
  // Producers added or changed, then producers removed.
  std::vector<std::pair<const std::string*, const ProducerState*>> producer_upserts;
  for (const auto& [id, producer] : after.producers) {
    auto old = before.producers.find(id);
    if (old == before.producers.end() || !(old->second == producer)) {
      producer_upserts.emplace_back(&id, &producer);
    }
  }
  e.put_varint(producer_upserts.size());
  for (const auto& [id, producer] : producer_upserts) put_producer(e, *id, *producer);
  std::vector<const std::string*> producers_removed;
  for (const auto& [id, producer] : before.producers) {
    if (!after.producers.contains(id)) producers_removed.push_back(&id);
  }
  e.put_varint(producers_removed.size());
  for (const std::string* id : producers_removed) e.put_bytes(*id);
  // Batches as one splice: the common prefix and suffix stay.
  const auto& b = before.batches;
  const auto& a = after.batches;
  std::size_t prefix = 0;
  while (prefix < b.size() && prefix < a.size() && b[prefix] == a[prefix]) ++prefix;
  std::size_t suffix = 0;
  while (suffix < b.size() - prefix && suffix < a.size() - prefix &&
         b[b.size() - 1 - suffix] == a[a.size() - 1 - suffix]) {
    ++suffix;
  }
  e.put_varint(prefix);
  e.put_varint(b.size() - prefix - suffix);
  e.put_varint(a.size() - prefix - suffix);
  for (std::size_t i = prefix; i < a.size() - suffix; ++i) put_batch(e, a[i]);
  return out;
}

Result<ShardState> apply_version(std::string_view shard, const ShardState* before,
                                 const VersionedData& data) {
  if (is_full_version(data.data)) return decode_state(shard, data);
  auto bad = [&](std::string what) {
    return corruption("state diff of shard " + std::string(shard) + " at seqno " +
                      std::to_string(data.seqno) + ": " + what);
  };
  if (!before || before->seqno + 1 != data.seqno) {
    return bad("the version it applies to (seqno " + std::to_string(data.seqno - 1) +
               ") is not available");
  }
  Decoder d(data.data);
  std::uint8_t version;
  RollupRef rollup;
  if (!get_diff_header(d, &version, &rollup)) return bad("malformed header");
  const bool with_owners = version == kDiffFormatVersion;
  ShardState state;
  state.name = before->name;
  state.incarnation = before->incarnation;
  state.deleted = before->deleted;
  state.seqno = data.seqno;
  state.rollup = rollup.seqno;
  state.rollup_id = std::move(rollup.id);
  if (!get_frontier(d, &state.upper) || !get_frontier(d, &state.since)) {
    return bad("malformed frontiers");
  }
  state.writers = before->writers;
  std::uint64_t count;
  if (!d.get_varint(&count) || count > d.remaining()) return bad("malformed writers");
  for (std::uint64_t i = 0; i < count; ++i) {
    std::string id;
    WriterState writer;
    if (!get_writer(d, &id, &writer, with_owners)) return bad("malformed writer");
    state.writers[std::move(id)] = std::move(writer);
  }
  if (!d.get_varint(&count) || count > d.remaining()) return bad("malformed removed writers");
  for (std::uint64_t i = 0; i < count; ++i) {
    std::string id;
    if (!get_string(d, &id)) return bad("malformed removed writer");
    state.writers.erase(id);
  }
  state.readers = before->readers;
  if (!d.get_varint(&count) || count > d.remaining()) return bad("malformed readers");
  for (std::uint64_t i = 0; i < count; ++i) {
    std::string id;
    ReaderState reader;
    if (!get_reader(d, &id, &reader, with_owners)) return bad("malformed reader");
    state.readers[std::move(id)] = std::move(reader);
  }
  if (!d.get_varint(&count) || count > d.remaining()) return bad("malformed removed readers");
  for (std::uint64_t i = 0; i < count; ++i) {
    std::string id;
    if (!get_string(d, &id)) return bad("malformed removed reader");
    state.readers.erase(id);
  }
  state.producers = before->producers;
  if (version != kOldDiffFormatVersion) {
    if (!d.get_varint(&count) || count > d.remaining()) return bad("malformed producers");
    for (std::uint64_t i = 0; i < count; ++i) {
      std::string id;
      ProducerState producer;
      if (!get_producer(d, &id, &producer)) return bad("malformed producer");
      state.producers[std::move(id)] = producer;
    }
    if (!d.get_varint(&count) || count > d.remaining()) return bad("malformed removed producers");
    for (std::uint64_t i = 0; i < count; ++i) {
      std::string id;
      if (!get_string(d, &id)) return bad("malformed removed producer");
      state.producers.erase(id);
    }
  }
  std::uint64_t prefix, removed, inserted;
  if (!d.get_varint(&prefix) || !d.get_varint(&removed) || !d.get_varint(&inserted) ||
      prefix > before->batches.size() || removed > before->batches.size() - prefix ||
      inserted > d.remaining()) {
    return bad("malformed batch splice");
  }
  state.batches.reserve(before->batches.size() - removed + inserted);
  state.batches.assign(before->batches.begin(), before->batches.begin() + prefix);
  for (std::uint64_t i = 0; i < inserted; ++i) {
    HollowBatch batch;
    if (!get_batch(d, &batch)) return bad("malformed batch");
    state.batches.push_back(std::move(batch));
  }
  state.batches.insert(state.batches.end(), before->batches.begin() + prefix + removed,
                       before->batches.end());
  if (!d.empty()) return bad("trailing bytes");
  TM_TRY(validate_state(state, bad));
  return state;
}

std::string encode_registry(const std::vector<std::string>& names) {
  std::string out;
  Encoder e(&out);
  e.put_u8(kRegistryFormatVersion);
  e.put_varint(names.size());
  for (const std::string& name : names) e.put_bytes(name);
  return out;
}

Result<std::vector<std::string>> decode_registry(std::string_view data) {
  Decoder d(data);
  std::uint8_t version;
  std::uint64_t count;
  if (!d.get_u8(&version) || version != kRegistryFormatVersion || !d.get_varint(&count) ||
      count > d.remaining()) {
    return corruption("shard registry is malformed");
  }
  std::vector<std::string> names(count);
  for (std::string& name : names) {
    if (!get_string(d, &name)) return corruption("shard registry is truncated");
  }
  return names;
}

namespace {

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

namespace {

// What a batch adds to read_inputs.
std::size_t batch_inputs(const HollowBatch& batch) {
  return batch.ordered ? std::size_t{!batch.parts.empty()} : batch.parts.size();
}

}  // namespace

static_assert(kSpineMaxReadInputs < WriteHandle::kStallReadInputs,
              "compaction must act before appends stall");

std::size_t read_inputs(const ShardState& state) {
  std::size_t inputs = 0;
  for (const HollowBatch& batch : state.batches) inputs += batch_inputs(batch);
  return inputs;
}

std::optional<MergeRequest> next_merge(const ShardState& state, std::uint64_t inline_drain_bytes) {
  const auto& batches = state.batches;
  if (inline_drain_bytes != kNoInlineDrain && inline_bytes(state) >= inline_drain_bytes) {
    // From the oldest batch holding an inline part: everything after it.
    for (std::size_t i = 0; i < batches.size(); ++i) {
      if (std::any_of(batches[i].parts.begin(), batches[i].parts.end(),
                      [](const PartRef& p) { return p.is_inline(); })) {
        return MergeRequest{i, batches.size()};
      }
    }
  }
  if (batches.size() < 2) return std::nullopt;
  // suffix[i] = total size of batches[i..].
  std::vector<std::uint64_t> suffix(batches.size() + 1, 0);
  for (std::size_t i = batches.size(); i-- > 0;) {
    suffix[i] = suffix[i + 1] + batches[i].payload_bytes();
  }
  for (std::size_t i = 0; i + 1 < batches.size(); ++i) {
    const bool due = batches[i].payload_bytes() <= kSpineGrowth * suffix[i + 1];
    const bool worth_it =
        suffix[i] >= kSpineMinMergeBytes || batches.size() - i >= kSpineMinMergeBatches;
    if (due && worth_it) return MergeRequest{i, batches.size()};
  }
  // Too many inputs for reads (see kSpineMaxReadInputs): the shortest tail
  // whose merge (one input) brings them to half the bound.
  const std::size_t inputs = read_inputs(state);
  if (inputs > kSpineMaxReadInputs) {
    std::size_t i = batches.size(), tail = 0;
    while (i > 0 && inputs - tail + 1 > kSpineMaxReadInputs / 2) tail += batch_inputs(batches[--i]);
    if (batches.size() - i >= 2 || tail > 1) return MergeRequest{i, batches.size()};
  }
  return std::nullopt;
}

Result<CompactionOutcome> apply_compaction(ShardState& state, std::string_view writer_id,
                                           std::span<const HollowBatch> inputs,
                                           const HollowBatch& output, std::uint64_t now_ms) {
  expire_leases(state, now_ms);
  if (writer_id.empty()) {
    if (!std::all_of(output.parts.begin(), output.parts.end(),
                     [](const PartRef& p) { return p.is_inline(); })) {
      return invalid_usage("a compaction that writes to the blob store needs a writer");
    }
  } else if (!state.writers.contains(writer_id)) {
    // The pass was slower than its lease (its process paused, or its
    // backend calls slow): its output is garbage now; a new pass redoes it.
    return make_error(ErrorKind::kLeaseExpired,
                      "compaction writer " + std::string(writer_id) + " of shard " + state.name +
                          " lost its lease before its merge was applied: nothing was "
                          "replaced; compact again");
  }
  if (inputs.empty()) return invalid_usage("a compaction needs inputs");
  if (output.desc.lower != inputs.front().desc.lower ||
      output.desc.upper != inputs.back().desc.upper) {
    return invalid_usage("compaction output " + output.desc.to_string() +
                         " does not span its inputs");
  }
  auto& batches = state.batches;
  // Our own write, landed in an attempt whose outcome we did not learn.
  if (!output.parts.empty() && std::find(batches.begin(), batches.end(), output) != batches.end()) {
    return CompactionOutcome::kAlreadyApplied;
  }
  auto first = std::find(batches.begin(), batches.end(), inputs.front());
  if (first == batches.end() || static_cast<std::size_t>(batches.end() - first) < inputs.size() ||
      !std::equal(inputs.begin(), inputs.end(), first)) {
    return CompactionOutcome::kInputsGone;
  }
  auto last = first + static_cast<std::ptrdiff_t>(inputs.size());
  if (output.parts.empty()) {
    batches.erase(first, last);  // everything consolidated away
  } else {
    *first = output;
    batches.erase(first + 1, last);
  }
  return CompactionOutcome::kApplied;
}

}  // namespace tidemark
