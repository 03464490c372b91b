#include "shard/merge.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "shard/read_ahead.h"
#include "util/executor.h"
#include "util/try.h"

namespace tidemark {

// Small and flat, so comparisons during the merge touch little memory: the
// reader (large, with its block buffers) and an ordered run's state live
// behind pointers.
struct MergeCursor::Input {
  // The next update, or while `deferred` only a bound below every update
  // the input holds: (its open part's key_min, "", time 0).
  std::optional<UpdateView> head;
  // The open part's first block is not loaded yet (see kDeferBlockBytes).
  bool deferred = false;
  // A part of this input was done since next() last looked: the budget has
  // room again for other inputs (top_up_read_ahead). Per input, since
  // inputs open on several threads at once.
  bool part_done = false;
  Time min = 0;  // effective window of the open part, inclusive
  Time max = 0;
  std::unique_ptr<PartReader> reader;
  // The reader's fetches, reading ahead (null for an inline part, or
  // without read-ahead).
  std::shared_ptr<ReadAheadSource> source;
  // The reader's current block's bytes, from the cursor's ReadMemory.
  std::optional<Lease> block_memory;
  std::unique_ptr<Run> run;  // set when the input is an ordered run
};

// The state of an ordered run, touched once per update (the countdown) and
// otherwise once per part.
struct MergeCursor::Run {
  Run() = default;
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  ~Run() { cancel_ahead(*this); }  // a part opened ahead for no one is not opened

  std::vector<PartRef> parts;
  std::size_t next_part = 0;  // the first part not opened yet
  std::uint64_t left = 0;     // updates the open part has not returned yet
  // The open part has emitted nothing yet, and its first update must be
  // checked against the last update of the part read before it.
  bool check_order = false;
  // The key of the part read before, and an owned copy of its last update
  // (views die with the reader's block) when the order check needs it: only
  // when the open part's first key repeats that update's key. Of a value
  // over kRunCheckValueBytes only that much is kept (last_value_length is the
  // whole length); the part is read again in the rare case that prefix
  // cannot settle the order.
  std::optional<std::string> last_part;
  std::size_t last_part_index = 0;  // in parts
  std::string last_key, last_value;
  std::uint64_t last_value_length = 0;
  Time last_time = 0;
  std::optional<Error> failed;  // sticky: order corruption, or a failure to check it
  // The next wanted part, being opened ahead (see open_ahead()).
  std::shared_ptr<PendingOpen> ahead;
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

struct MergeCursor::OpenedPart {
  std::unique_ptr<PartReader> reader;
  std::shared_ptr<ReadAheadSource> source;
  Time min = 0;  // effective window, inclusive
  Time max = 0;
};

// A part of a run opened on a blob_io() thread ahead of the merge: its
// footer read and checked, and its first spans fetched, while the part
// before it is read. The job holds what it touches (this, the blob, the
// reference); the run waits for it, or opens it itself when no thread has
// started the job.
struct MergeCursor::PendingOpen {
  enum class State : std::uint8_t { kQueued, kRunning, kDone, kCancelled };
  std::size_t index = 0;  // in Run::parts
  std::mutex mu;
  std::condition_variable done;
  State state = State::kQueued;                             // GUARDED_BY(mu)
  std::optional<Result<std::optional<OpenedPart>>> result;  // GUARDED_BY(mu), once kDone
  ReadAheadGrant grant;                                     // the footer's fetch (kOpenFetchBytes)
};

namespace {

using OpenedPart = MergeCursor::OpenedPart;

// Read-ahead: off, on where the blob is slow (the default), or always
// (tests of read-ahead itself, on quick test blobs).
enum ReadAheadMode : int { kReadAheadOff, kReadAheadAuto, kReadAheadAlways };
std::atomic<int> read_ahead_mode{kReadAheadAuto};

// A reader of the part `ref`: its inline bytes, or its blob object.
Result<PartReader> open_reader(Blob& blob, const PartRef& ref) {
  if (ref.data) return PartReader::from_shared(ref.key, ref.data);
  return PartReader::open_blob(blob, ref.key, ref.size);
}

// Whether anything of the part `ref` may be wanted in `window`, from its
// reference alone.
bool maybe_wanted(const PartRef& ref, TimeWindow window) {
  Time reg_min, reg_max;
  if (!to_inclusive(ref.lower, ref.upper, &reg_min, &reg_max)) return false;
  const Time min = std::max({reg_min, window.min, ref.time_min});
  const Time max = std::min({reg_max, window.max, ref.time_max});
  return ref.count != 0 && min <= max;
}

// Opens the part `ref` filtered to the intersection of its registered
// range, its inline description and `window`; nullopt, without opening it
// when its stats allow, when nothing of it is wanted. With a `budget`, a
// blob part reads through a ReadAheadSource, reading ahead unless one of
// its blocks decodes to over kDeferBlockBytes.
Result<std::optional<OpenedPart>> open_part(const std::shared_ptr<Blob>& blob, const PartRef& ref,
                                            TimeWindow window,
                                            const std::shared_ptr<ReadAheadBudget>& budget) {
  Time reg_min, reg_max;
  if (!to_inclusive(ref.lower, ref.upper, &reg_min, &reg_max)) return std::nullopt;
  Time min = std::max({reg_min, window.min, ref.time_min});
  Time max = std::min({reg_max, window.max, ref.time_max});
  if (ref.count == 0 || min > max) return std::nullopt;  // nothing of this part is wanted

  std::shared_ptr<ReadAheadSource> source;
  Result<PartReader> opened = [&]() -> Result<PartReader> {
    if (ref.data || !budget) return open_reader(*blob, ref);
    source = std::make_shared<ReadAheadSource>(blob, ref.key, ref.size, budget);
    return PartReader::open(ref.key, ref.size,
                            [source](std::uint64_t offset, std::uint64_t length) {
                              return source->fetch(offset, length);
                            });
  }();
  if (!opened) return std::unexpected(std::move(opened).error());
  PartReader reader = std::move(*opened);
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
  // Its blocks decode to no more than its payload allows (check_part_footer):
  // the payload registered, not one a replaced object claims.
  if (reader.stats().bytes != ref.bytes) {
    return corruption("part " + ref.key + ": holds " + std::to_string(reader.stats().bytes) +
                      " payload bytes but the shard registered " + std::to_string(ref.bytes));
  }
  OpenedPart part;
  part.min = std::max(min, inline_min);
  part.max = std::min(max, inline_max);
  if (part.min > part.max) return std::nullopt;
  if (source && reader.largest_decoded_block_bytes() <= MergeCursor::kDeferBlockBytes) {
    // Its first blocks are fetched from now on (the first read of a block
    // starts at 0, with the header).
    source->enable();
    source->read_ahead_from(0);
  }
  part.reader = std::make_unique<PartReader>(std::move(reader));
  part.source = std::move(source);
  return part;
}

// Calls fn(0) .. fn(count - 1), each a blob read or two: one by one while
// that is quick (a local disk: handing work to threads would cost more than
// it saves), the rest with up to MergeCursor::kOpenThreads - 1 jobs of the
// process's blob_io() pool helping once it has taken 2 ms (busy helpers are
// done without). fn(i) must touch only state of its own i. True when all
// of it took under 2 ms.
bool for_each_quickly(std::size_t count, const std::function<void(std::size_t)>& fn) {
  const auto started = std::chrono::steady_clock::now();
  std::size_t first = 0;
  while (first < count &&
         std::chrono::steady_clock::now() - started < std::chrono::milliseconds(2)) {
    fn(first++);
  }
  if (first == count)
    return std::chrono::steady_clock::now() - started < std::chrono::milliseconds(2);
  for_each_helped(WorkPool::blob_io(), MergeCursor::kOpenThreads - 1, count - first,
                  [&](std::size_t i) { fn(first + i); });
  return false;
}

}  // namespace

Result<std::vector<std::uint64_t>> open_block_bytes(Blob& blob,
                                                    const std::vector<MergeCursor::PartRun>& runs,
                                                    bool fetch_footers) {
  // Per part, first the bound its reference gives: its whole payload as one
  // block.
  std::vector<std::vector<std::uint64_t>> parts(runs.size());
  std::vector<std::pair<std::size_t, std::size_t>> to_fetch;  // (run, part)
  for (std::size_t r = 0; r < runs.size(); ++r) {
    for (const PartRef& ref : runs[r].parts) {
      const std::uint64_t bound =
          decoded_block_bytes(max_block_length(ref.bytes, ref.count), ref.count);
      if (fetch_footers && bound > kExactBlockBytesAbove) to_fetch.emplace_back(r, parts[r].size());
      parts[r].push_back(bound);
    }
  }
  std::vector<Status> fetched(to_fetch.size());
  for_each_quickly(to_fetch.size(), [&](std::size_t i) {
    const auto [r, p] = to_fetch[i];
    const PartRef& ref = runs[r].parts[p];
    auto reader = open_reader(blob, ref);
    if (!reader) {
      fetched[i] = std::unexpected(reader.error());
      return;
    }
    parts[r][p] = std::min(parts[r][p], reader->largest_decoded_block_bytes());
  });
  for (const Status& status : fetched) TM_TRY(status);
  std::vector<std::uint64_t> bytes(runs.size(), 0);
  for (std::size_t r = 0; r < runs.size(); ++r) {
    for (std::uint64_t part : parts[r]) {
      bytes[r] = runs[r].ordered ? std::max(bytes[r], part) : bytes[r] + part;
    }
  }
  return bytes;
}

Result<MergeCursor> MergeCursor::open(std::shared_ptr<Blob> blob, const std::vector<PartRun>& runs,
                                      TimeWindow window, const std::function<bool()>& stop,
                                      ReadMemory memory, bool read_ahead) {
  MergeCursor cursor;
  cursor.blob_ = std::move(blob);
  cursor.window_ = window;
  cursor.memory_ = std::move(memory);
  const int mode = read_ahead_mode.load(std::memory_order_relaxed);
  if (read_ahead && mode != kReadAheadOff) {
    cursor.budget_ = std::make_shared<ReadAheadBudget>(cursor.memory_.pool);
    // Read-ahead starts once every input holds its first block, so that
    // the room it leaves the merge counts them all.
    cursor.budget_->pause(true);
  }
  // One input per unordered part (opened below) and per ordered run.
  std::vector<Input> inputs;
  std::vector<const PartRef*> unopened;  // parallel to inputs; nullptr for a run
  for (const PartRun& run : runs) {
    if (run.ordered) {
      Input input;
      input.run = std::make_unique<Run>();
      input.run->parts = run.parts;
      inputs.push_back(std::move(input));
      unopened.push_back(nullptr);
      continue;
    }
    for (const PartRef& ref : run.parts) {
      inputs.emplace_back();
      unopened.push_back(&ref);
    }
  }
  if (cursor.budget_) cursor.budget_->set_inputs(inputs.size());
  // Each input opens its first part and reads its first update. Every one
  // of those is a blob read or two, so they run concurrently: under 200 ms
  // of blob latency a merge of 1,000 parts took minutes one by one. Each
  // input touches only its own state.
  // An input whose first block is large only has its footer read: its
  // block waits until the merge reaches its first key (defer()).
  std::vector<Status> primed(inputs.size());
  auto prime = [&](std::size_t i) -> Status {
    if (stop && stop()) return make_error(ErrorKind::kClosed, "the read was stopped");
    Input& input = inputs[i];
    if (unopened[i]) {
      TM_ASSIGN(auto part, open_part(cursor.blob_, *unopened[i], window, cursor.budget_));
      if (!part) return {};
      input.min = part->min;
      input.max = part->max;
      input.reader = std::move(part->reader);
      input.source = std::move(part->source);
    } else {
      TM_TRY(cursor.open_next_part(input));
    }
    if (defer(input)) return {};
    return cursor.advance(input);
  };
  // Inputs that all opened in under 2 ms came from a blob read-ahead would
  // not speed up (a local disk), only cost CPU: it stays paused (off).
  const bool quick = for_each_quickly(inputs.size(), [&](std::size_t i) { primed[i] = prime(i); });
  cursor.read_ahead_ = mode == kReadAheadAlways || !quick;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    TM_TRY(primed[i]);
    if (inputs[i].head) cursor.inputs_.push_back(std::move(inputs[i]));
  }
  return cursor;  // read-ahead starts with the first next()
}

Result<MergeCursor> MergeCursor::open(std::shared_ptr<Blob> blob, const std::vector<PartRef>& parts,
                                      TimeWindow window) {
  return open(std::move(blob), std::vector<PartRun>{PartRun{parts, /*ordered=*/false}}, window, {});
}

bool MergeCursor::defer(Input& input) {
  if (!input.reader || input.reader->next_block_decoded_bytes() <= kDeferBlockBytes) return false;
  input.deferred = true;
  input.head = UpdateView{input.reader->stats().key_min, std::string_view(), 0, 0};
  return true;
}

void MergeCursor::set_read_ahead_for_testing(bool on) {
  read_ahead_mode.store(on ? kReadAheadAlways : kReadAheadOff, std::memory_order_relaxed);
}

void MergeCursor::reset_read_ahead_for_testing() {
  read_ahead_mode.store(kReadAheadAuto, std::memory_order_relaxed);
}

void MergeCursor::open_ahead(Run& run) const {
  if (!budget_) return;
  std::size_t index = run.next_part;
  while (index < run.parts.size() && !maybe_wanted(run.parts[index], window_)) ++index;
  if (index == run.parts.size() || run.parts[index].data) return;  // nothing to fetch
  std::optional<ReadAheadGrant> grant = budget_->try_take(PartReader::kOpenFetchBytes);
  if (!grant) return;
  auto pending = std::make_shared<PendingOpen>();
  pending->index = index;
  pending->grant = std::move(*grant);
  auto job = [pending, blob = blob_, ref = run.parts[index], window = window_, budget = budget_] {
    {
      std::lock_guard lock(pending->mu);
      if (pending->state != PendingOpen::State::kQueued) return;
      pending->state = PendingOpen::State::kRunning;
    }
    auto part = open_part(blob, ref, window, budget);  // and its first blocks
    std::lock_guard lock(pending->mu);
    pending->result = std::move(part);
    pending->state = PendingOpen::State::kDone;
    pending->grant.end_fetch();  // its bytes stay granted until the part is taken
    pending->done.notify_all();
  };
  if (!WorkPool::blob_io().submit(std::move(job))) return;
  run.ahead = std::move(pending);
}

void MergeCursor::cancel_ahead(Run& run) {
  if (!run.ahead) return;
  {
    std::lock_guard lock(run.ahead->mu);
    if (run.ahead->state == PendingOpen::State::kQueued) {
      run.ahead->state = PendingOpen::State::kCancelled;
      run.ahead->grant = ReadAheadGrant();
    }
  }
  run.ahead.reset();
}

Result<std::optional<MergeCursor::OpenedPart>> MergeCursor::take_ahead(Run& run) {
  std::shared_ptr<PendingOpen> pending = std::move(run.ahead);
  std::unique_lock lock(pending->mu);
  if (pending->state == PendingOpen::State::kQueued) {
    // No thread has started it: open it here.
    pending->state = PendingOpen::State::kCancelled;
    lock.unlock();
    return open_part(blob_, run.parts[pending->index], window_, budget_);
  }
  pending->done.wait(lock, [&] { return pending->state == PendingOpen::State::kDone; });
  return std::move(*pending->result);
}

Status MergeCursor::open_next_part(Input& input) {
  Run& run = *input.run;
  while (run.next_part < run.parts.size()) {
    // next_part moves on only once the part is opened or skipped, so a
    // failed fetch is retried by the next call (opening it here: a part
    // opened ahead is taken, or forgotten, once).
    std::optional<OpenedPart> part;
    if (run.ahead && run.ahead->index == run.next_part) {
      TM_ASSIGN(part, take_ahead(run));
    } else {
      if (run.ahead && run.ahead->index < run.next_part) cancel_ahead(run);
      TM_ASSIGN(part, open_part(blob_, run.parts[run.next_part], window_, budget_));
    }
    const PartRef& ref = run.parts[run.next_part++];
    input.part_done = true;  // the part before is done
    if (!part) continue;
    input.min = part->min;
    input.max = part->max;
    input.reader = std::move(part->reader);
    input.source = std::move(part->source);
    run.left = ref.count;  // open_part checked the part holds this many
    if (!run.ahead) open_ahead(run);
    return {};
  }
  return {};
}

void MergeCursor::top_up_read_ahead() {
  if (!budget_ || !read_ahead_) return;
  auto top_up = [](Input& input) { return !input.source || input.source->resume(); };
  if (current_ && !top_up(inputs_[*current_])) return;
  for (const std::size_t i : heap_) {
    if (!top_up(inputs_[i])) return;
  }
}

void MergeCursor::drop_read_ahead() {
  for (Input& input : inputs_) {
    if (input.source) input.source->drop();
    if (input.run) cancel_ahead(*input.run);
  }
}

Status MergeCursor::leave_part(Input& input) {
  Run& run = *input.run;
  const std::size_t done_index = run.next_part - 1;
  const UpdateView last = *input.head;  // valid while `done` lives
  std::unique_ptr<PartReader> done = std::move(input.reader);
  // Its block's bytes go with it, not to the next part: that one may be
  // deferred (or there may be none), and the merge goes on to other inputs
  // meanwhile.
  std::optional<Lease> done_block = take_block(input);
  if (auto opened = open_next_part(input); !opened) {
    input.reader = std::move(done);  // a retry starts over
    if (done_block) hold_block(input, std::move(*done_block));
    return opened;
  }
  input.head.reset();
  run.check_order = false;
  if (input.reader) {
    // The next part's first key (key_min, which its reader checks against
    // its first update) mostly settles the order check now, with no copy of
    // `last`: only when it repeats the last key must the first update itself
    // be compared with `last`.
    const int order = input.reader->stats().key_min.compare(last.key);
    if (order < 0) {
      run.failed = corruption("part " + input.reader->name() +
                              ": out of order within its run: its first key sorts before the "
                              "last key of part " +
                              done->name())
                       .error();
      return std::unexpected(*run.failed);
    }
    if (order == 0) {
      run.check_order = true;
      run.last_part_index = done_index;
      run.last_key.assign(last.key);
      run.last_value.assign(last.value.substr(0, kRunCheckValueBytes));
      run.last_value_length = last.value.size();
      run.last_time = last.time;
    }
  }
  run.last_part = done->name();
  return {};  // `done` (its block) goes before the next part's block comes
}

void MergeCursor::leave_room_for(std::uint64_t bytes) {
  if (budget_) budget_->add_merge_blocks(static_cast<std::int64_t>(bytes));
}

void MergeCursor::hold_block(Input& input, Lease lease) {
  release_block(input);
  if (budget_) budget_->add_merge_blocks(static_cast<std::int64_t>(lease.size()));
  input.block_memory = std::move(lease);
}

std::optional<Lease> MergeCursor::take_block(Input& input) {
  std::optional<Lease> lease = std::move(input.block_memory);
  input.block_memory.reset();
  if (lease && budget_) budget_->add_merge_blocks(-static_cast<std::int64_t>(lease->size()));
  return lease;
}

void MergeCursor::release_block(Input& input) {
  take_block(input);
}

Status MergeCursor::charge_next_block(Input& input) {
  // The block held now goes before the next one comes (next() drops it).
  release_block(input);
  const std::uint64_t bytes = input.reader->next_block_decoded_bytes();
  if (bytes == 0) return {};
  if (bytes <= kDeferBlockBytes) {
    // An ordinary block: counted, never refused (a merge of many parts
    // needs one each, whatever the pool; see ReadMemory).
    hold_block(input, memory_.pool->force_reserve(bytes));
    return {};
  }
  std::optional<Lease> now = memory_.pool->try_reserve(bytes);
  if (!now && budget_ && budget_->bytes() > 0) {
    // Room held by read-ahead would otherwise keep this block waiting:
    // read-ahead gives its bytes back (those of fetches in flight once they
    // end) and starts again afterwards.
    drop_read_ahead();
  }
  auto lease =
      now ? Result<Lease>(std::move(*now))
          : memory_.pool->reserve_until(bytes, std::chrono::steady_clock::now() + memory_.wait);
  if (!lease) {
    const std::string what = "part " + input.reader->name() + ": its next block decodes to " +
                             std::to_string(bytes) + " bytes, ";
    if (lease.error().is(ErrorKind::kInvalidUsage)) {  // can never fit
      return make_error(ErrorKind::kFull, what + "more than the " + memory_.pool->name() +
                                              " memory's capacity (" +
                                              std::to_string(memory_.pool->capacity()) +
                                              " bytes): it needs a larger memory limit");
    }
    return make_error(ErrorKind::kFull, what + "which the " + memory_.pool->name() +
                                            " memory (capacity " +
                                            std::to_string(memory_.pool->capacity()) +
                                            " bytes) could not give within " +
                                            std::to_string(memory_.wait.count()) + " ms");
  }
  hold_block(input, std::move(*lease));
  return {};
}

Status MergeCursor::advance(Input& input) {
  Run* run = input.run.get();
  if (run && run->failed) return std::unexpected(*run->failed);
  // The head was the open part's last update.
  if (run && run->left == 0 && input.reader) {
    TM_TRY(leave_part(input));
    if (defer(input)) return {};
  }
  for (;;) {
    if (!input.reader) {
      if (run) {
        TM_TRY(open_next_part(input));
      }
      if (!input.reader) {
        input.head.reset();
        release_block(input);  // the input has ended
        return {};
      }
    }
    if (memory_.pool && input.reader->block_used_up()) TM_TRY(charge_next_block(input));
    TM_ASSIGN(auto update, input.reader->next());
    if (!update) {
      input.reader.reset();  // release its block buffers early
      input.source.reset();  // and its read-ahead's
      release_block(input);
      input.part_done = true;
      continue;
    }
    const bool wanted = update->time >= input.min && update->time <= input.max;
    if (wanted && run && run->check_order) [[unlikely]] {
      // The first update the part emits; its own order the reader checks.
      run->check_order = false;
      auto order = compare_with_last(*run, *update);
      if (!order) {
        // The update is consumed: a retry would skip the check.
        run->failed = order.error();
        return std::unexpected(*run->failed);
      }
      if (*order <= 0) {
        run->failed = corruption("part " + input.reader->name() +
                                 ": out of order within its run: its first update (at time " +
                                 std::to_string(update->time) +
                                 ") does not sort after the last update of part " + *run->last_part)
                          .error();
        return std::unexpected(*run->failed);
      }
      release_oversized(run->last_key, 0);  // a huge key is not kept while the part is read
    }
    if (run && --run->left == 0 && !wanted) {
      // The next part's first update must follow it all the same.
      input.head = *update;
      TM_TRY(leave_part(input));
      if (defer(input)) return {};
      continue;
    }
    if (wanted) {
      input.head = *update;
      return {};
    }
  }
}

Result<int> MergeCursor::compare_with_last(const Run& run, UpdateView update) const {
  const std::string_view kept = run.last_value;
  if (kept.size() == run.last_value_length) {
    return compare_key_value_time(update.key, update.value, update.time, run.last_key, kept,
                                  run.last_time);
  }
  // The keys are equal (leave_part kept the value only then), and of the
  // last value only a prefix is kept. A value that differs inside it, or
  // ends inside it (so is shorter, or a prefix of the last one), is settled.
  if (const int order = update.value.substr(0, kept.size()).compare(kept); order != 0) return order;
  if (update.value.size() == kept.size()) return -1;
  // Rare: read the last value back from its part.
  const PartRef& ref = run.parts[run.last_part_index];
  TM_ASSIGN(PartReader reader, open_reader(*blob_, ref));
  std::optional<UpdateView> last;
  for (std::uint64_t i = 0; i < ref.count; ++i) {
    TM_ASSIGN(last, reader.next());
    if (!last) return corruption("part " + ref.key + ": ended early when read again");
  }
  if (!last) return corruption("part " + ref.key + ": empty when read again");
  return compare_key_value_time(update.key, update.value, update.time, last->key, last->value,
                                last->time);
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
    // open() read every input's first update.
    started_ = true;
    if (budget_ && read_ahead_) {
      // Every input holds its first block now, and the caller has said
      // what room it needs (leave_room_for).
      budget_->pause(false);
      for (Input& input : inputs_) {
        if (input.source) input.source->resume();
        if (input.run && !input.run->ahead) open_ahead(*input.run);
      }
    }
    for (std::size_t i = 0; i < inputs_.size(); ++i) heap_.push_back(i);
    std::make_heap(heap_.begin(), heap_.end(), greater);
  } else if (advance_current_ && current_) {
    TM_TRY(advance(inputs_[*current_]));
    if (inputs_[*current_].part_done) [[unlikely]] {
      inputs_[*current_].part_done = false;
      top_up_read_ahead();
    }
    if (!inputs_[*current_].head) {
      current_.reset();
    } else if (inputs_[*current_].deferred || (!heap_.empty() && less(heap_.front(), *current_))) {
      heap_.push_back(*current_);
      std::push_heap(heap_.begin(), heap_.end(), greater);
      current_.reset();
    }
  }
  while (!current_) {
    if (heap_.empty()) return std::optional<UpdateView>{};
    std::pop_heap(heap_.begin(), heap_.end(), greater);
    const std::size_t top = heap_.back();
    Input& input = inputs_[top];
    if (input.deferred) {
      // Every other input's next update sorts at or after this input's
      // bound: load its first block now, and put it back by its real head.
      if (auto loaded = advance(input); !loaded) {
        std::push_heap(heap_.begin(), heap_.end(), greater);  // still deferred: a retry loads it
        return std::unexpected(loaded.error());
      }
      input.deferred = false;
      if (input.head) {
        std::push_heap(heap_.begin(), heap_.end(), greater);
      } else {
        heap_.pop_back();  // the window wanted nothing of it
      }
      continue;
    }
    current_ = top;
    heap_.pop_back();
  }
  advance_current_ = true;
  return inputs_[*current_].head;
}

ConsolidatingCursor::ConsolidatingCursor(MergeCursor merge) : merge_(std::move(merge)) {}

Result<std::optional<UpdateView>> ConsolidatingCursor::next() {
  if (carry_ != 0) {
    return std::optional<UpdateView>{UpdateView{key_, value_, time_, take_carried_diff(carry_)}};
  }
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
    time_ = peek_->time;
    DiffSum sum = peek_->diff;
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
      sum += update->diff;
    }
    if (sum != 0) {
      carry_ = sum;
      return std::optional<UpdateView>{UpdateView{key_, value_, time_, take_carried_diff(carry_)}};
    }
  }
}

}  // namespace tidemark
