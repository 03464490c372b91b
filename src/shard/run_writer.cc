#include "shard/run_writer.h"

#include <algorithm>

#include "shard/state.h"
#include "tidemark/retry.h"
#include "util/try.h"

namespace tidemark {

RunWriter::RunWriter(ShardContext& context, std::string writer_id, Description desc,
                     std::function<Status()> after_part, InlineOutput inline_output)
    : context_(context),
      writer_id_(std::move(writer_id)),
      desc_(desc),
      after_part_(std::move(after_part)),
      inline_output_(inline_output) {}

Status RunWriter::add(std::string_view key, std::string* value, Time time, Diff diff,
                      bool carry_goes_on) {
  if (!part_) {
    part_.emplace(desc_, PartOptions{context_.options.block_bytes, context_.options.zstd_level});
  }
  TM_TRY(part_->add(key, value, time, diff));
  if (!carry_goes_on && part_->encoded_bytes_so_far() >= context_.options.part_target_bytes) {
    TM_TRY(write_part(false));
  }
  return {};
}

Status RunWriter::flush() {
  return write_part(true);
}

Status RunWriter::write_part(bool last) {
  if (!part_ || part_->count() == 0) return {};
  PartRef ref;
  ref.key = part_key(context_.name, writer_id_);
  ref.count = part_->count();
  ref.bytes = part_->stats().bytes;
  ref.time_min = part_->stats().time_min;
  ref.time_max = part_->stats().time_max;
  ref.lower = desc_.lower;
  ref.upper = desc_.upper;
  TM_ASSIGN(std::string encoded, part_->finish());
  part_.reset();
  ref.size = encoded.size();
  const bool fits_inline =
      last && written_.empty() && ref.size <= context_.inline_merge_max_bytes();
  if (inline_output_ != InlineOutput::kNever && fits_inline) {
    ref.data = std::make_shared<const std::string>(std::move(encoded));
  } else if (inline_output_ == InlineOutput::kOnly) {
    return make_error(ErrorKind::kTooLarge, "the run does not fit in one inline part of " +
                                                std::to_string(context_.inline_merge_max_bytes()) +
                                                " bytes");
  } else {
    TM_TRY(with_retries(context_.options.write_retry,
                        [&] { return context_.location.blob->set(ref.key, encoded); }));
  }
  bytes_ += ref.size;
  written_.push_back(std::move(ref));
  return after_part_ ? after_part_() : Status{};
}

void RunWriter::drop() {
  for (const PartRef& part : written_) {
    if (!part.is_inline()) (void)context_.location.blob->remove(part.key);
  }
  written_.clear();
}

Status merge_into(ShardContext& context, const std::vector<MergeCursor::PartRun>& runs,
                  Time advance_to, RunWriter& out, std::string_view what,
                  const std::function<bool()>& stop) {
  // No read-ahead: a compaction's merge has no pool to bound it.
  TM_ASSIGN(MergeCursor merge, MergeCursor::open(context.read_blob, runs, TimeWindow{}, stop, {},
                                                 /*read_ahead=*/false));
  std::string key, value;
  Time time = 0;
  DiffSum sum = 0;
  bool have = false;
  std::string carried;  // a copy of the value for each carried update but the last
  for (std::uint64_t n = 1;; ++n) {
    if (stop && n % 4096 == 0 && stop()) {
      return make_error(ErrorKind::kClosed, std::string(what) + " was stopped");
    }
    TM_ASSIGN(auto update, merge.next());
    if (update) {
      const Time t = std::max(update->time, advance_to);
      if (have && t == time && update->key == key && update->value == value) {
        sum += update->diff;
        continue;
      }
    }
    // A huge value's buffer moves into the part rather than being copied.
    while (have && sum != 0) {
      const Diff diff = take_carried_diff(sum);
      if (sum == 0) {
        TM_TRY(out.add(key, &value, time, diff));
      } else {
        carried.assign(value);
        TM_TRY(out.add(key, &carried, time, diff, /*carry_goes_on=*/true));
      }
    }
    if (!update) break;
    key.assign(update->key);
    release_oversized(value, update->value.size());
    value.assign(update->value);
    time = std::max(update->time, advance_to);
    sum = update->diff;
    have = true;
  }
  return out.flush();
}

}  // namespace tidemark
