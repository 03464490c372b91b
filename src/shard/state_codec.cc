// The binary codec of shard states (state_codec.h): full states, diffs and
// the registry, with the checks that make a malformed version a Corruption.
#include "shard/state_codec.h"

#include <algorithm>
#include <functional>

#include "util/coding.h"
#include "util/try.h"

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

}  // namespace tidemark
