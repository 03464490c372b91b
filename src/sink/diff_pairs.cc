#include "sink/diff_pairs.h"

#include <xxhash.h>

#include <utility>

#include "util/try.h"

namespace tidemark {
namespace {

// |diff| as a count of copies, exact for every i64 (the minimum included).
std::uint64_t copies_of(Diff diff) {
  return diff < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(diff)
                  : static_cast<std::uint64_t>(diff);
}

// "key K at time T" for error messages, with a long key cut short.
std::string describe_group(std::string_view key, Time time) {
  constexpr std::size_t kMaxShown = 64;
  std::string out = "key '";
  out += key.substr(0, kMaxShown);
  if (key.size() > kMaxShown) out += "...";
  out += "' at time " + std::to_string(time);
  return out;
}

bool same_update(const std::optional<UpdateView>& a, const std::optional<UpdateView>& b) {
  if (!a || !b) return !a && !b;
  return a->key == b->key && a->value == b->value && a->time == b->time && a->diff == b->diff;
}

// One of the walker's two passes over the input. Within the current group it
// yields the copies of the updates of its own sign, in value order, and
// steps over the others; it reads every update of the group, so it also
// checks the order of the group's values and fingerprints them, for the
// walker to compare with the other pass.
//
// The pass reads one update at a time and calls next() on its source only
// when the copies of the update under it are used up, so the value of that
// update (a view into the source) stays valid while its copies go out, and
// until the walker's next call.
class Pass {
 public:
  Pass(std::unique_ptr<UpdateSource> source, bool negative)
      : source_(std::move(source)), negative_(negative) {}

  // Reads the first update of the input.
  [[nodiscard]] Status start() {
    TM_ASSIGN(head_, source_->next());
    return {};
  }

  // The update under the cursor: once a group is done, the first update of
  // the next group (nullopt at the end of the input).
  const std::optional<UpdateView>& head() const { return head_; }

  // REQUIRES: head() is the first update of the group about to start.
  void begin_group() {
    head_read_ = false;
    remaining_ = 0;
    group_done_ = false;
    updates_in_group_ = 0;
    fingerprint_ = 0;
  }

  bool has_copy() const { return remaining_ > 0; }
  bool group_done() const { return group_done_; }
  std::uint64_t updates_in_group() const { return updates_in_group_; }
  std::uint64_t fingerprint() const { return fingerprint_; }

  // One copy of the current value; the view is valid until the next
  // advance(). REQUIRES: has_copy().
  std::string_view take_copy() {
    --remaining_;
    return head_->value;
  }

  // Moves to the next update of this pass's sign in the group (key, time),
  // or marks the group done when the next update belongs to another group.
  // REQUIRES: !has_copy() and !group_done().
  [[nodiscard]] Status advance(std::string_view key, Time time) {
    for (;;) {
      if (head_read_) {
        TM_ASSIGN(head_, source_->next());
        head_read_ = false;
      }
      if (!head_ || head_->key != key || head_->time != time) {
        group_done_ = true;
        return {};
      }
      const UpdateView& update = *head_;
      head_read_ = true;
      if (update.diff == 0) {
        return invalid_usage("diff pairs: a zero diff for " + describe_group(key, time));
      }
      // Strictly increasing values: sorted, and each value at most once
      // (or a carry: a diff too large for one update, in several).
      if (updates_in_group_ > 0 &&
          (update.value < previous_value_ ||
           (update.value == previous_value_ && !continues_carry(previous_diff_, update.diff)))) {
        return invalid_usage("diff pairs: the values of " + describe_group(key, time) +
                             " are not strictly increasing");
      }
      previous_value_.assign(update.value);
      previous_diff_ = update.diff;
      ++updates_in_group_;
      fingerprint_ = XXH3_64bits_withSeed(update.value.data(), update.value.size(),
                                          fingerprint_ ^ static_cast<std::uint64_t>(update.diff));
      if ((update.diff < 0) == negative_) {
        remaining_ = copies_of(update.diff);
        return {};
      }
    }
  }

 private:
  std::unique_ptr<UpdateSource> source_;
  bool negative_;  // reads the befores (negative diffs) or the afters
  std::optional<UpdateView> head_;
  bool head_read_ = false;       // head_ has been checked and counted
  std::uint64_t remaining_ = 0;  // copies of head_->value still to go out
  bool group_done_ = false;
  // Bounded by the largest value; its capacity is reused from group to group.
  std::string previous_value_;
  Diff previous_diff_ = 0;
  std::uint64_t updates_in_group_ = 0;
  std::uint64_t fingerprint_ = 0;
};

}  // namespace

struct DiffPairWalker::State {
  State(std::unique_ptr<UpdateSource> befores_source, std::unique_ptr<UpdateSource> afters_source)
      : befores(std::move(befores_source), /*negative=*/true),
        afters(std::move(afters_source), /*negative=*/false) {}

  Result<std::optional<DiffPair>> step();
  // Both passes stand at the same update: the start of the next group.
  Status check_heads_agree() const;
  // Both passes read the same updates in the group that just ended.
  Status check_group_agrees() const;

  Pass befores;
  Pass afters;
  bool in_group = false;
  bool finished = false;
  std::optional<Error> error;  // sticky: every call after a failure returns it
  // The current group. The key is a copy because the passes move on past the
  // update it came from; its capacity is reused from group to group.
  std::string key;
  Time time = 0;
  std::uint64_t index_in_group = 0;
};

Status DiffPairWalker::State::check_heads_agree() const {
  const std::optional<UpdateView>& before_head = befores.head();
  const std::optional<UpdateView>& after_head = afters.head();
  if (same_update(before_head, after_head)) return {};
  std::string where;
  if (before_head && after_head) {
    where = "at the start of " + describe_group(before_head->key, before_head->time);
  } else {
    const UpdateView& more = before_head ? *before_head : *after_head;
    where = "(one pass ended, the other is at " + describe_group(more.key, more.time) + ")";
  }
  return invalid_usage("diff pairs: the two passes over the input disagree " + where +
                       ": the source does not yield the same updates on every pass");
}

Status DiffPairWalker::State::check_group_agrees() const {
  if (befores.updates_in_group() == afters.updates_in_group() &&
      befores.fingerprint() == afters.fingerprint()) {
    return {};
  }
  return invalid_usage("diff pairs: the two passes over the input disagree within " +
                       describe_group(key, time) +
                       ": the source does not yield the same updates on every pass");
}

Result<std::optional<DiffPair>> DiffPairWalker::State::step() {
  for (;;) {
    if (!in_group) {
      if (finished) return std::nullopt;
      TM_TRY(check_heads_agree());
      const std::optional<UpdateView>& first = befores.head();
      if (!first) {
        finished = true;
        return std::nullopt;
      }
      key.assign(first->key);
      time = first->time;
      index_in_group = 0;
      in_group = true;
      befores.begin_group();
      afters.begin_group();
    }
    if (!befores.has_copy() && !befores.group_done()) TM_TRY(befores.advance(key, time));
    if (!afters.has_copy() && !afters.group_done()) TM_TRY(afters.advance(key, time));
    if (befores.has_copy() || afters.has_copy()) {
      DiffPair pair;
      pair.key = key;
      pair.time = time;
      if (befores.has_copy()) pair.before = befores.take_copy();
      if (afters.has_copy()) pair.after = afters.take_copy();
      pair.index_in_group = index_in_group++;
      return pair;
    }
    // Both passes have read past the group and stand at the next one.
    TM_TRY(check_group_agrees());
    in_group = false;
  }
}

Result<DiffPairWalker> DiffPairWalker::open(const OpenUpdateSource& open_source) {
  TM_ASSIGN(auto befores_source, open_source());
  TM_ASSIGN(auto afters_source, open_source());
  if (!befores_source || !afters_source) {
    return invalid_usage("diff pairs: the source factory returned no source");
  }
  auto state = std::make_unique<State>(std::move(befores_source), std::move(afters_source));
  TM_TRY(state->befores.start());
  TM_TRY(state->afters.start());
  return DiffPairWalker(std::move(state));
}

DiffPairWalker::DiffPairWalker(std::unique_ptr<State> state) : state_(std::move(state)) {}
DiffPairWalker::DiffPairWalker(DiffPairWalker&&) noexcept = default;
DiffPairWalker& DiffPairWalker::operator=(DiffPairWalker&&) noexcept = default;
DiffPairWalker::~DiffPairWalker() = default;

Result<std::optional<DiffPair>> DiffPairWalker::next() {
  if (state_->error) return std::unexpected(*state_->error);
  auto result = state_->step();
  if (!result) state_->error = result.error();
  return result;
}

}  // namespace tidemark
