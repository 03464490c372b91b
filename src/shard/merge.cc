#include "shard/merge.h"

#include <algorithm>

namespace tidemark {

// Small and flat, so comparisons during the merge touch little memory: the
// reader (large, with its block buffers) lives behind a pointer.
struct MergeCursor::Input {
  std::optional<UpdateView> head;
  Time min = 0;  // effective window, inclusive
  Time max = 0;
  std::unique_ptr<PartReader> reader;
};

MergeCursor::MergeCursor() = default;
MergeCursor::MergeCursor(MergeCursor&&) noexcept = default;
MergeCursor& MergeCursor::operator=(MergeCursor&&) noexcept = default;
MergeCursor::~MergeCursor() = default;

namespace {

// [lower, upper) as an inclusive [min, max]; false when empty.
bool to_inclusive(Frontier lower, Frontier upper, Time* min, Time* max) {
  if (lower.is_closed()) return false;
  *min = lower.time();
  if (upper.is_closed()) {
    *max = UINT64_MAX;
    return true;
  }
  if (upper.time() <= lower.time()) return false;
  *max = upper.time() - 1;
  return true;
}

}  // namespace

Result<MergeCursor> MergeCursor::open(std::shared_ptr<Blob> blob, const std::vector<PartRef>& parts,
                                      TimeWindow window) {
  MergeCursor cursor;
  cursor.blob_ = std::move(blob);
  cursor.inputs_.reserve(parts.size());
  for (const PartRef& ref : parts) {
    Time reg_min, reg_max;
    if (!to_inclusive(ref.lower, ref.upper, &reg_min, &reg_max)) continue;  // truncated away
    Time min = std::max({reg_min, window.min, ref.time_min});
    Time max = std::min({reg_max, window.max, ref.time_max});
    if (ref.count == 0 || min > max) continue;  // nothing of this part is wanted

    TM_ASSIGN(PartReader reader, PartReader::open_blob(*cursor.blob_, ref.key, ref.size));
    const Description& inline_desc = reader.inline_desc();
    Time inline_min, inline_max;
    if (!to_inclusive(inline_desc.lower, inline_desc.upper, &inline_min, &inline_max) ||
        inline_min > reg_max || inline_max < reg_min) {
      return corruption("part " + ref.key + ": registered range [" + ref.lower.to_string() + ", " +
                        ref.upper.to_string() +
                        ") cannot be reconciled with its inline description " +
                        inline_desc.to_string());
    }
    if (reader.stats().count != ref.count) {
      return corruption("part " + ref.key + ": holds " + std::to_string(reader.stats().count) +
                        " updates but the shard registered " + std::to_string(ref.count));
    }
    Input input;
    input.min = std::max(min, inline_min);
    input.max = std::min(max, inline_max);
    if (input.min > input.max) continue;
    input.reader = std::make_unique<PartReader>(std::move(reader));
    cursor.inputs_.push_back(std::move(input));
  }
  return cursor;
}

Status MergeCursor::advance(Input& input) {
  for (;;) {
    TM_ASSIGN(auto update, input.reader->next());
    if (!update) {
      input.head.reset();
      input.reader.reset();  // release its block buffers early
      return {};
    }
    if (update->time >= input.min && update->time <= input.max) {
      input.head = *update;
      return {};
    }
  }
}

bool MergeCursor::less(std::size_t a, std::size_t b) const {
  const UpdateView& x = *inputs_[a].head;
  const UpdateView& y = *inputs_[b].head;
  return compare_key_value_time(x.key, x.value, x.time, y.key, y.value, y.time) < 0;
}

Result<std::optional<UpdateView>> MergeCursor::next() {
  // heap comparator: std heaps are max-heaps, so invert.
  auto greater = [this](std::size_t a, std::size_t b) { return less(b, a); };
  if (!started_) {
    started_ = true;
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      TM_TRY(advance(inputs_[i]));
      if (inputs_[i].head) heap_.push_back(i);
    }
    std::make_heap(heap_.begin(), heap_.end(), greater);
  } else if (advance_current_ && current_) {
    TM_TRY(advance(inputs_[*current_]));
    if (!inputs_[*current_].head) {
      current_.reset();
    } else if (!heap_.empty() && less(heap_.front(), *current_)) {
      heap_.push_back(*current_);
      std::push_heap(heap_.begin(), heap_.end(), greater);
      current_.reset();
    }
  }
  if (!current_) {
    if (heap_.empty()) return std::optional<UpdateView>{};
    std::pop_heap(heap_.begin(), heap_.end(), greater);
    current_ = heap_.back();
    heap_.pop_back();
  }
  advance_current_ = true;
  return inputs_[*current_].head;
}

ConsolidatingCursor::ConsolidatingCursor(MergeCursor merge, std::string what)
    : merge_(std::move(merge)), what_(std::move(what)) {}

Result<std::optional<UpdateView>> ConsolidatingCursor::next() {
  for (;;) {
    if (!peek_) {
      if (exhausted_) return std::optional<UpdateView>{};
      TM_ASSIGN(peek_, merge_.next());
      if (!peek_) {
        exhausted_ = true;
        return std::optional<UpdateView>{};
      }
    }
    key_.assign(peek_->key);
    value_.assign(peek_->value);
    const Time time = peek_->time;
    Diff sum = peek_->diff;
    peek_.reset();
    for (;;) {
      TM_ASSIGN(auto update, merge_.next());
      if (!update) {
        exhausted_ = true;
        break;
      }
      if (update->key != key_ || update->value != value_) {
        peek_ = update;
        break;
      }
      TM_ASSIGN(sum, checked_add_diff(sum, update->diff, what_));
    }
    if (sum != 0) return std::optional<UpdateView>{UpdateView{key_, value_, time, sum}};
  }
}

}  // namespace tidemark
