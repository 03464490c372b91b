#include <algorithm>
#include <cstring>
#include <optional>

#include "part/part.h"
#include "shard/context.h"
#include "shard/run_writer.h"
#include "shard/state.h"
#include "tidemark/write.h"
#include "util/executor.h"
#include "util/ids.h"
#include "util/try.h"

namespace tidemark {
namespace {

// Buffered updates of one part: bytes in one arena, fixed-size entries
// pointing into it, so buffering costs no allocation per update.
struct PartBuffer {
  struct Entry {
    std::uint64_t offset;  // key bytes, then value bytes
    std::uint32_t key_length;
    std::uint32_t value_length;
    Time time;
    Diff diff;
  };
  // Past this, a buffer reserves what it will hold when its part is cut.
  static constexpr std::size_t kReserveFromBytes = 64 << 10;

  std::string arena;
  std::vector<Entry> entries;
  bool reserved = false;

  std::string_view key(const Entry& e) const { return {arena.data() + e.offset, e.key_length}; }
  std::string_view value(const Entry& e) const {
    return {arena.data() + e.offset + e.key_length, e.value_length};
  }
  std::uint64_t bytes() const { return arena.size() + entries.size() * sizeof(Entry); }

  // Grows the buffer once, to what it will hold at `target` bytes() if
  // updates keep their average size so far, instead of doubling five or six
  // times with a copy each time: fresh pages cost a fault each, and buffers
  // this large are mmap'd anew for every part (see mallopt in cli/main.cc).
  // REQUIRES: !entries.empty().
  void reserve_for(std::uint64_t target) {
    reserved = true;
    const std::uint64_t average = arena.size() / entries.size();
    const std::uint64_t count = target / (average + sizeof(Entry)) + 1;
    entries.reserve(count);
    arena.reserve(count * average);
  }
};

// One part, sorted, consolidated and encoded, not yet stored. An empty
// `ref.key`: everything cancelled out.
struct EncodedPart {
  PartRef ref;
  std::string bytes;
};

// Sorts, consolidates and encodes one part.
Result<EncodedPart> encode_part(const std::shared_ptr<ShardContext>& context,
                                const std::string& writer_id, PartBuffer buffer,
                                Description inline_desc) {
  std::sort(buffer.entries.begin(), buffer.entries.end(),
            [&](const PartBuffer::Entry& a, const PartBuffer::Entry& b) {
              return compare_key_value_time(buffer.key(a), buffer.value(a), a.time, buffer.key(b),
                                            buffer.value(b), b.time) < 0;
            });
  PartWriter writer(inline_desc,
                    PartOptions{context->options.block_bytes, context->options.zstd_level});
  const auto& entries = buffer.entries;
  for (std::size_t i = 0; i < entries.size();) {
    DiffSum sum = entries[i].diff;
    std::size_t j = i + 1;
    while (j < entries.size() && entries[j].time == entries[i].time &&
           buffer.key(entries[j]) == buffer.key(entries[i]) &&
           buffer.value(entries[j]) == buffer.value(entries[i])) {
      sum += entries[j].diff;
      ++j;
    }
    while (sum != 0) {
      TM_TRY(writer.add(UpdateView{buffer.key(entries[i]), buffer.value(entries[i]),
                                   entries[i].time, take_carried_diff(sum)}));
    }
    i = j;
  }
  // The writer holds what it needs (it copies each update into its block's
  // columns): free the buffer before encoding, not after the upload. (Moved
  // out: assigning an empty string would keep the arena's allocation.)
  { const PartBuffer spent = std::move(buffer); }
  if (writer.count() == 0) return EncodedPart{};  // everything cancelled out
  EncodedPart part;
  TM_ASSIGN(part.bytes, writer.finish());
  part.ref.key = part_key(context->name, writer_id);
  part.ref.size = part.bytes.size();
  part.ref.count = writer.stats().count;
  part.ref.bytes = writer.stats().bytes;
  part.ref.time_min = writer.stats().time_min;
  part.ref.time_max = writer.stats().time_max;
  return part;
}

bool stays_inline(const ShardContext& context, const EncodedPart& part) {
  return part.bytes.size() <= context.options.inline_part_max_bytes;
}

// Keeps an encoded part inline when it is small
// (ClientOptions::inline_part_max_bytes), or writes it to Blob.
Result<PartRef> store_part(const std::shared_ptr<ShardContext>& context, EncodedPart part) {
  if (part.ref.key.empty()) return PartRef{};
  if (stays_inline(*context, part)) {
    part.ref.data = std::make_shared<const std::string>(std::move(part.bytes));
    return std::move(part.ref);
  }
  TM_TRY(with_retries(context->options.write_retry,
                      [&] { return context->location.blob->set(part.ref.key, part.bytes); }));
  return std::move(part.ref);
}

Result<PartRef> write_part(const std::shared_ptr<ShardContext>& context,
                           const std::string& writer_id, PartBuffer buffer,
                           Description inline_desc) {
  TM_ASSIGN(EncodedPart part, encode_part(context, writer_id, std::move(buffer), inline_desc));
  return store_part(context, std::move(part));
}

}  // namespace

struct BatchBuilder::State {
  std::shared_ptr<ShardContext> context;
  std::string writer_id;
  Frontier lower;
  PartBuffer buffer;
  std::deque<std::future<Result<PartRef>>> uploads;
  std::vector<PartRef> parts;  // uploaded
  std::optional<Error> failed;
  std::uint64_t added = 0;
  Time max_time = 0;
  bool finished = false;
  // The one part finish_inline() encoded and left for finish() to store,
  // and the upper it was encoded for.
  std::optional<EncodedPart> encoded;
  Frontier encoded_upper;

  // Whether `upper` can end the batch.
  Status check_upper(Frontier upper) const {
    if (upper < lower) {
      return std::unexpected(
          Error{ErrorKind::kInvalidUsage,
                "batch upper " + upper.to_string() + " is below its lower " + lower.to_string(),
                std::nullopt, std::nullopt});
    }
    if (added > 0 && !upper.is_past(max_time)) {
      return std::unexpected(Error{ErrorKind::kInvalidUsage,
                                   "update at time " + std::to_string(max_time) +
                                       " is not below the batch upper " + upper.to_string(),
                                   std::nullopt, std::nullopt});
    }
    return {};
  }

  // Waits for the oldest upload; records its part or its error.
  void collect_oldest() {
    auto result = uploads.front().get();
    uploads.pop_front();
    if (!result) {
      if (!failed) failed = result.error();
    } else if (!result->key.empty()) {
      parts.push_back(std::move(*result));
    }
  }

  void start_upload(Description inline_desc) {
    while (uploads.size() >= std::max<std::size_t>(1, context->options.max_uploads_in_flight)) {
      collect_oldest();
    }
    PartBuffer full = std::move(buffer);
    buffer = PartBuffer{};
    uploads.push_back(submit_or_inline(
        WorkPool::blob_io(),
        [ctx = context, writer = writer_id, full = std::move(full), inline_desc]() mutable {
          return write_part(ctx, writer, std::move(full), inline_desc);
        }));
  }

  // Sorts the parts (each sorted on its own) into one ordered run of
  // parts described by `desc` (see write.h): merges the smallest runs,
  // kRunFanIn at a time, until one is left. Each merge but the last takes
  // only as many runs as leave kRunFanIn for the last one. Every part not
  // yet deleted stays in `parts`, so after an error abandon() finds them.
  // REQUIRES: no upload in flight; every part's registered range is desc's.
  Status sort_into_run(const Description& desc) {
    struct SortedRun {
      std::uint64_t bytes = 0;  // encoded bytes of its parts
      std::vector<PartRef> parts;
    };
    std::vector<SortedRun> runs;
    runs.reserve(parts.size());
    for (PartRef& part : parts) runs.push_back({part.size, {std::move(part)}});
    parts.clear();
    Status status;
    while (runs.size() > 1) {
      const std::size_t take =
          runs.size() <= kRunFanIn ? runs.size() : std::min(kRunFanIn, runs.size() - kRunFanIn + 1);
      std::stable_sort(runs.begin(), runs.end(),
                       [](const SortedRun& a, const SortedRun& b) { return a.bytes < b.bytes; });
      std::vector<MergeCursor::PartRun> inputs;
      inputs.reserve(take);
      for (std::size_t i = 0; i < take; ++i) inputs.push_back({runs[i].parts, /*ordered=*/true});
      RunWriter out(*context, writer_id, desc);
      status = merge_into(*context, inputs, /*advance_to=*/0, out, "a batch");
      if (!status) {
        out.drop();
        break;
      }
      for (std::size_t i = 0; i < take; ++i) {
        // Best effort: one left behind is an orphan garbage collection
        // deletes once this writer is gone.
        for (const PartRef& part : runs[i].parts) (void)context->location.blob->remove(part.key);
      }
      runs.erase(runs.begin(), runs.begin() + static_cast<std::ptrdiff_t>(take));
      // A run that consolidated to nothing has no parts.
      if (!out.written().empty()) runs.push_back({out.bytes(), std::move(out.written())});
    }
    for (SortedRun& run : runs) {
      for (PartRef& part : run.parts) parts.push_back(std::move(part));
    }
    return status;
  }

  void abandon() {
    while (!uploads.empty()) collect_oldest();
    for (const PartRef& part : parts) (void)context->location.blob->remove(part.key);
    parts.clear();
  }
};

BatchBuilder::BatchBuilder(std::shared_ptr<ShardContext> context, std::string writer_id,
                           Frontier lower)
    : state_(std::make_unique<State>()) {
  state_->context = std::move(context);
  state_->writer_id = std::move(writer_id);
  state_->lower = lower;
}

BatchBuilder::BatchBuilder(BatchBuilder&&) noexcept = default;
BatchBuilder& BatchBuilder::operator=(BatchBuilder&& other) noexcept {
  if (this != &other) {
    if (state_ && !state_->finished) state_->abandon();
    state_ = std::move(other.state_);
  }
  return *this;
}

BatchBuilder::~BatchBuilder() {
  if (state_ && !state_->finished) state_->abandon();
}

std::uint64_t BatchBuilder::added() const {
  return state_->added;
}

Status BatchBuilder::add(std::string_view key, std::string_view value, Time time, Diff diff) {
  State& s = *state_;
  if (s.finished) return invalid_usage("batch builder is already finished");
  if (s.failed) return std::unexpected(*s.failed);
  if (!s.lower.includes(time)) {
    return invalid_usage("update at time " + std::to_string(time) + " is below the batch lower " +
                         s.lower.to_string());
  }
  if (key.size() > UINT32_MAX || value.size() > UINT32_MAX) {
    return invalid_usage("key or value larger than 4 GiB");
  }
  PartBuffer& b = s.buffer;
  b.entries.push_back(PartBuffer::Entry{b.arena.size(), static_cast<std::uint32_t>(key.size()),
                                        static_cast<std::uint32_t>(value.size()), time, diff});
  b.arena.append(key);
  b.arena.append(value);
  if (!b.reserved && b.arena.size() >= PartBuffer::kReserveFromBytes) {
    b.reserve_for(s.context->options.part_target_bytes);
  }
  s.max_time = std::max(s.max_time, time);
  ++s.added;
  if (b.bytes() >= s.context->options.part_target_bytes) {
    // The upper is not known yet: the part's inline description is open.
    s.start_upload(Description{s.lower, Frontier::closed(), Frontier::at(0)});
  }
  return {};
}

Result<Batch> BatchBuilder::finish(Frontier upper) {
  State& s = *state_;
  if (s.finished) return invalid_usage("batch builder is already finished");
  auto fail = [&](Error error) -> Result<Batch> {
    s.abandon();
    s.finished = true;
    return std::unexpected(std::move(error));
  };
  if (s.encoded) {
    // Checked by finish_inline().
    if (upper != s.encoded_upper) {
      return fail(invalid_usage("a batch finish_inline() encoded for upper " +
                                s.encoded_upper.to_string() + " cannot end at " + upper.to_string())
                      .error());
    }
    auto part = store_part(s.context, std::move(*s.encoded));
    s.encoded.reset();
    if (!part) {
      s.failed = part.error();
    } else if (!part->key.empty()) {
      s.parts.push_back(std::move(*part));
    }
  } else {
    if (s.failed) return fail(*s.failed);
    if (auto checked = s.check_upper(upper); !checked) return fail(checked.error());
    if (!s.buffer.entries.empty()) {
      const Description desc{s.lower, upper, Frontier::at(0)};
      if (s.uploads.empty()) {
        // The only part: written on this thread (a thread per small batch
        // cost more than the upload itself).
        auto part = write_part(s.context, s.writer_id, std::move(s.buffer), desc);
        s.buffer = PartBuffer{};
        if (!part) {
          s.failed = part.error();
        } else if (!part->key.empty()) {
          s.parts.push_back(std::move(*part));
        }
      } else {
        s.start_upload(desc);
      }
    }
  }
  while (!s.uploads.empty()) s.collect_oldest();
  if (s.failed) return fail(*s.failed);
  const Description desc{s.lower, upper, Frontier::at(0)};
  for (PartRef& part : s.parts) {
    part.lower = desc.lower;
    part.upper = desc.upper;
  }
  const bool ordered = s.parts.size() > kMaxLooseParts;
  if (ordered) {
    if (auto sorted = s.sort_into_run(desc); !sorted) return fail(sorted.error());
  }
  s.finished = true;
  return Batch(s.context->location.blob, s.context->name, desc, std::move(s.parts), ordered);
}

Result<std::optional<Batch>> BatchBuilder::finish_inline(Frontier upper) {
  State& s = *state_;
  if (s.finished || s.encoded) return invalid_usage("batch builder is already finished");
  // Several parts: some are uploading or uploaded already.
  if (!s.uploads.empty() || !s.parts.empty()) return std::optional<Batch>();
  // A failure, a bad upper or no updates: finish() settles it with no I/O
  // (there is no part to delete or to write).
  if (s.failed || !s.check_upper(upper) || s.buffer.entries.empty()) return finish(upper);
  auto part = encode_part(s.context, s.writer_id, std::move(s.buffer),
                          Description{s.lower, upper, Frontier::at(0)});
  s.buffer = PartBuffer{};
  if (!part) {
    s.failed = part.error();
    return finish(upper);
  }
  const bool no_io = part->ref.key.empty() || stays_inline(*s.context, *part);
  s.encoded = std::move(*part);
  s.encoded_upper = upper;
  if (no_io) return finish(upper);
  return std::optional<Batch>();
}

}  // namespace tidemark
