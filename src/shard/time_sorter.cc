#include "shard/time_sorter.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <system_error>
#include <utility>

#include "location/posix_io.h"
#include "shard/merge.h"
#include "util/coding.h"
#include "util/try.h"

namespace tidemark {
namespace {

constexpr std::uint64_t kMinRunBufferBytes = 4 << 10;
constexpr std::uint64_t kMaxRunBufferBytes = 64 << 10;
// The in-memory run starts this large (or at the budget) and doubles.
constexpr std::uint64_t kFirstRunBytes = 64 << 10;

// An update of the in-memory run. Its key and value lie contiguously in
// the run's byte region, `offset` bytes before the region's end (so they
// stay put, relative to the end, when the run grows).
struct Entry {
  std::uint32_t offset;
  std::uint32_t key_size;
  std::uint32_t value_size;
  Time time;
  Diff diff;
};
static_assert(sizeof(Entry) == 32);
// What the run keeps room for per update: its entry, and a place for it in
// the radix sort's second array.
constexpr std::uint64_t kEntryCost = 2 * sizeof(Entry);

// Sorts entries[0, count), whose times lie in [least, most], by time,
// stably: a least-significant-digit radix sort on time - least, 8 bits a
// pass, through `spare` (room for `count` entries). One pass counts every
// digit, then one pass moves the entries per digit on which they differ:
// O(count) for any times.
void sort_by_time(Entry* entries, Entry* spare, std::size_t count, Time least, Time most) {
  if (count < 2 || least == most) return;
  const int digits = (std::bit_width(most - least) + 7) / 8;
  std::vector<std::array<std::size_t, 256>> starts(digits);
  for (std::size_t i = 0; i < count; ++i) {
    const Time rank = entries[i].time - least;
    for (int d = 0; d < digits; ++d) ++starts[d][(rank >> (8 * d)) & 0xff];
  }
  Entry* from = entries;
  Entry* to = spare;
  for (int d = 0; d < digits; ++d) {
    auto& start = starts[d];
    if (std::find(start.begin(), start.end(), count) != start.end()) continue;  // all alike
    std::size_t sum = 0;
    for (std::size_t& s : start) sum += std::exchange(s, sum);
    for (std::size_t i = 0; i < count; ++i) {
      to[start[((from[i].time - least) >> (8 * d)) & 0xff]++] = from[i];
    }
    std::swap(from, to);
  }
  if (from != entries) std::memcpy(entries, from, count * sizeof(Entry));
}

// Asks for the cache lines of an entry's key and value ahead of their use:
// the run's bytes are in arrival order, read in time order.
void prefetch(const char* bytes) {
  __builtin_prefetch(bytes);
  __builtin_prefetch(bytes + 63);
}

// How far ahead of the entry in hand prefetch() asks.
constexpr std::size_t kPrefetchAhead = 16;

static_assert(std::endian::native == std::endian::little, "compare_bytes swaps to big-endian");

// As std::string_view::compare (bytes unsigned), eight at a time: keys and
// values are mostly short, and the merge compares mostly equal times, so
// a call into libc's memcmp per comparison cost more than the comparison.
int compare_bytes(std::string_view a, std::string_view b) {
  const std::size_t common = std::min(a.size(), b.size());
  std::size_t i = 0;
  for (; i + 8 <= common; i += 8) {
    std::uint64_t x, y;
    std::memcpy(&x, a.data() + i, 8);
    std::memcpy(&y, b.data() + i, 8);
    if (x != y) return __builtin_bswap64(x) < __builtin_bswap64(y) ? -1 : 1;
  }
  for (; i < common; ++i) {
    const auto x = static_cast<unsigned char>(a[i]);
    const auto y = static_cast<unsigned char>(b[i]);
    if (x != y) return x < y ? -1 : 1;
  }
  return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
}

std::string scratch_message(const std::string& directory, std::string_view what, int error) {
  return "scratch directory " + directory + ": " + std::string(what) + ": " +
         std::error_code(error, std::generic_category()).message() +
         " (a listen sorts a batch larger than its listen buffer there)";
}

// Bytes charged to a ReadMemory's pool while held (nothing without one):
// up to MergeCursor::kDeferBlockBytes at once, even past the pool's
// capacity, as blocks are; a larger charge only when the pool has room.
class Charge {
 public:
  explicit Charge(const ReadMemory& memory) : memory_(&memory) {
    if (memory.pool) lease_ = memory.pool->force_reserve(0);
  }

  // Makes the charge `bytes`. `force`: never waits (bounded by the budget).
  [[nodiscard]] Status resize(std::uint64_t bytes, bool force = false) {
    if (!memory_->pool || bytes == lease_.size()) return {};
    if (bytes < lease_.size()) {
      lease_.shrink(lease_.size() - bytes);
      return {};
    }
    const std::uint64_t more = bytes - lease_.size();
    if (force || bytes <= MergeCursor::kDeferBlockBytes) {
      lease_.force_grow(more);
      return {};
    }
    auto extra =
        memory_->pool->reserve_until(more, std::chrono::steady_clock::now() + memory_->wait);
    if (!extra) {
      return make_error(ErrorKind::kFull,
                        "listen: an update of the batch being sorted needs a buffer of " +
                            std::to_string(bytes) + " bytes, which the " + memory_->pool->name() +
                            " memory (capacity " + std::to_string(memory_->pool->capacity()) +
                            " bytes) could not give within " +
                            std::to_string(memory_->wait.count()) + " ms");
    }
    lease_.merge(std::move(*extra));
    return {};
  }

 private:
  const ReadMemory* memory_;
  Lease lease_;
};

// A run written to a scratch file: records in (time, key, value) order,
// consolidated but for carries, each
//   varint   time - the previous record's time (the first: its time)
//   varint   diff, zig-zag
//   varint   key size
//   varint   value size
//   bytes    key, then value
struct SpilledRun {
  FileDescriptor file;
  std::uint64_t bytes = 0;
  std::size_t level = 0;  // merges behind it
};

// One sorted run being read: the in-memory run, or a scratch file.
class RunCursor {
 public:
  virtual ~RunCursor() = default;
  // Moves to the next record; false at the end (head() is then invalid).
  [[nodiscard]] virtual Result<bool> advance() = 0;
  // Valid until the next advance().
  const UpdateView& head() const { return head_; }

 protected:
  UpdateView head_;
};

bool saturated(Diff diff) {
  return diff == std::numeric_limits<Diff>::max() || diff == std::numeric_limits<Diff>::min();
}

// Merges runs that hold consecutive stretches of one input given in
// (key, value, time) order, in that order, each run sorted by (time, key,
// value). At any one time every update of a run then sorts before every
// update of a later run, or equals the first of them (one update's equals
// cut apart by a run's end): so the merge is by (time, run) alone, and a
// time's updates come out run after run. A loser tree on (head time, run)
// picks the run, played again only when a run's updates at the time it is
// at are out; keys are compared only with the first update at that time
// of the next run, to sum updates equal across runs. The runs' heads sit
// in one array.
class RunMerge {
 public:
  RunMerge(std::vector<std::unique_ptr<RunCursor>> cursors, const ReadMemory& memory)
      : cursors_(std::move(cursors)), heads_(cursors_.size()), group_charge_(memory) {}

  [[nodiscard]] Status start() {
    for (std::size_t run = 0; run < cursors_.size(); ++run) TM_TRY(advance(run));
    // Every node starts with a player that beats all (kNone); each run's
    // play leaves it as a loser on the way up, so once every run has
    // played, each node holds its match's loser and tree_[0] the winner.
    tree_.assign(std::max<std::size_t>(cursors_.size(), 1), kNone);
    for (std::size_t run = 0; run < cursors_.size(); ++run) {
      std::size_t winner = run;
      for (std::size_t node = (run + tree_.size()) / 2; node > 0; node /= 2) {
        if (tree_[node] == kNone || (winner != kNone && before(tree_[node], winner))) {
          std::swap(tree_[node], winner);
        }
      }
      tree_[0] = winner;
    }
    return {};
  }

  // The next update, or null at the end; it stays valid until the next
  // call.
  [[nodiscard]] Result<const UpdateView*> next() {
    if (carry_ != 0) return carried();
    if (advance_pending_) {
      advance_pending_ = false;
      TM_TRY(advance_winner());
    }
    while (!cursors_.empty() && heads_[tree_[0]].live) {
      const Head& head = heads_[tree_[0]];
      // The winner's head is the whole of its group unless the run goes on
      // with its equal (a carry: after a saturated diff only) or the next
      // run's first update at this time equals it.
      const Head* following = next_run_head();
      if (!saturated(head.diff) && (following == nullptr || !same_update(head, *following))) {
        advance_pending_ = true;
        out_ = UpdateView{head.key, head.value, head.time, head.diff};
        return &out_;
      }
      // Copied: advancing the run may move its buffer.
      TM_TRY(hold(head.key.size() + head.value.size()));
      std::memcpy(group_.get(), head.key.data(), head.key.size());
      std::memcpy(group_.get() + head.key.size(), head.value.data(), head.value.size());
      Head group{head.time, std::string_view(group_.get(), head.key.size()),
                 std::string_view(group_.get() + head.key.size(), head.value.size()), 0, true};
      DiffSum sum = head.diff;
      TM_TRY(advance_winner());
      while (heads_[tree_[0]].live && same_update(heads_[tree_[0]], group)) {
        sum += heads_[tree_[0]].diff;
        TM_TRY(advance_winner());
      }
      if (sum == 0) continue;
      group_head_ = group;
      carry_ = sum;
      return carried();
    }
    return nullptr;
  }

 private:
  static constexpr std::size_t kNone = SIZE_MAX;

  struct Head {
    Time time = 0;
    std::string_view key;
    std::string_view value;
    Diff diff = 0;
    bool live = false;  // false once the run is exhausted: after every head
  };

  static bool same_update(const Head& a, const Head& b) {
    return a.time == b.time && a.key.size() == b.key.size() && a.value.size() == b.value.size() &&
           compare_bytes(a.key, b.key) == 0 && compare_bytes(a.value, b.value) == 0;
  }

  // Whether run a's head goes out before run b's: by time, then run.
  bool before(std::size_t a, std::size_t b) const {
    const Head& x = heads_[a];
    const Head& y = heads_[b];
    if (!x.live) return false;
    if (!y.live) return true;
    return x.time != y.time ? x.time < y.time : a < b;
  }

  // Moves run `run` on (dropping its buffer and file at its end).
  [[nodiscard]] Status advance(std::size_t run) {
    TM_ASSIGN(bool more, cursors_[run]->advance());
    Head& head = heads_[run];
    head.live = more;
    if (!more) {
      cursors_[run].reset();
      return {};
    }
    const UpdateView& view = cursors_[run]->head();
    head.time = view.time;
    head.key = view.key;
    head.value = view.value;
    head.diff = view.diff;
    return {};
  }

  // Moves the winning run on; once it has left the time it was at, plays
  // it again from its leaf up.
  [[nodiscard]] Status advance_winner() {
    const std::size_t run = tree_[0];
    const Time time = heads_[run].time;
    TM_TRY(advance(run));
    if (heads_[run].live && heads_[run].time == time) return {};
    std::size_t winner = run;
    for (std::size_t node = (run + tree_.size()) / 2; node > 0; node /= 2) {
      if (before(tree_[node], winner)) std::swap(tree_[node], winner);
    }
    tree_[0] = winner;
    following_known_ = false;
    return {};
  }

  // The head of the run that goes on after the winner at the winner's
  // time, if any: the best of the runs the winner beat on its way up.
  // It holds still while the winner is at that time.
  const Head* next_run_head() {
    if (!following_known_) {
      const std::size_t winner = tree_[0];
      std::size_t best = kNone;
      for (std::size_t node = (winner + tree_.size()) / 2; node > 0; node /= 2) {
        if (best == kNone || before(tree_[node], best)) best = tree_[node];
      }
      following_ = best != kNone && heads_[best].live && heads_[best].time == heads_[winner].time
                       ? best
                       : kNone;
      following_known_ = true;
    }
    return following_ == kNone ? nullptr : &heads_[following_];
  }

  // Room for a group's key and value of `bytes`.
  [[nodiscard]] Status hold(std::size_t bytes) {
    if (bytes <= group_capacity_) return {};
    const std::size_t capacity = std::max<std::size_t>(bytes, 256);
    TM_TRY(group_charge_.resize(capacity));
    group_ = std::make_unique_for_overwrite<char[]>(capacity);
    group_capacity_ = capacity;
    return {};
  }

  const UpdateView* carried() {
    const Diff diff = take_carried_diff(carry_);
    out_ = UpdateView{group_head_.key, group_head_.value, group_head_.time, diff};
    return &out_;
  }

  std::vector<std::unique_ptr<RunCursor>> cursors_;  // null once exhausted
  std::vector<Head> heads_;                          // by run
  std::vector<std::size_t> tree_;                    // [0] the winner, [1, runs) each match's loser
  bool advance_pending_ = false;                     // the winner's head went out as it was
  bool following_known_ = false;
  std::size_t following_ = kNone;  // next_run_head()'s run
  // A group summed across updates, its key and value copied, and what of
  // its sum is still to go out.
  std::unique_ptr<char[]> group_;
  std::size_t group_capacity_ = 0;
  Head group_head_;
  DiffSum carry_ = 0;
  Charge group_charge_;
  UpdateView out_;  // what next() returned
};

}  // namespace

struct TimeSorter::Impl {
  Impl(std::uint64_t budget, std::string directory, ReadMemory memory)
      : budget(std::clamp<std::uint64_t>(budget, 2 * kEntryCost, kMaxBudget) / sizeof(Entry) *
               sizeof(Entry)),
        directory(std::move(directory)),
        memory(std::move(memory)),
        buffer_bytes(run_buffer_bytes(budget)),
        run_charge(this->memory) {}

  [[nodiscard]] Status add(const UpdateView& update);
  [[nodiscard]] Status finish();
  [[nodiscard]] Result<const UpdateView*> next();

  // --- The in-memory run ---
  Entry* entries() { return run.get(); }
  char* bytes_end() { return reinterpret_cast<char*>(run.get()) + capacity; }
  // Room for more: each entry holds its own place and one for the sort.
  std::uint64_t free_bytes() const { return top - count * kEntryCost; }
  UpdateView view(const Entry& e) {
    const char* key = bytes_end() - e.offset;
    return UpdateView{std::string_view(key, e.key_size),
                      std::string_view(key + e.key_size, e.value_size), e.time, e.diff};
  }
  // Grows the run toward `needed` bytes, within the budget.
  [[nodiscard]] Status grow(std::uint64_t needed);
  // Sorts the run by (time, arrival) and consolidates it in place.
  void seal();
  // Seals the run and writes it to a scratch file; the run is then empty.
  [[nodiscard]] Result<SpilledRun> write_run();
  // write_run, and the run added after the others.
  [[nodiscard]] Status spill();
  // Keeps the last update added, for the order check of the next.
  void remember_last(const UpdateView& update) {
    last_key.assign(update.key);
    last_value.assign(update.value);
    last_time = update.time;
    last_spilled = true;
  }

  // --- Scratch files ---
  class Writer;
  class FileCursor;
  class MemoryCursor;
  [[nodiscard]] Result<Writer> open_writer();
  // Adds a written run at `level`, merging the level once it is full.
  // Adds a run written after every run before it: once the last
  // kMaxFanIn runs are of one level they are merged into one of the next.
  [[nodiscard]] Status add_run(SpilledRun written);
  // Merges the last `take` runs into one (runs merge only with their
  // neighbours in arrival order: RunMerge relies on it).
  [[nodiscard]] Status merge_last(std::size_t take);

  const std::uint64_t budget;  // a multiple of sizeof(Entry)
  std::string directory;       // resolved when the first file is made
  bool directory_made = false;
  const ReadMemory memory;
  const std::uint64_t buffer_bytes;
  TimeSorterStats stats;
  std::optional<Error> failed;  // sticky
  bool finished = false;

  // The run: `count` entries from the front, their keys and values in
  // [top, capacity) from the back.
  std::unique_ptr<Entry[]> run;
  std::uint64_t capacity = 0;
  std::size_t count = 0;
  std::uint64_t top = 0;
  Time least_time = UINT64_MAX;  // of the run's entries
  Time most_time = 0;
  Charge run_charge;
  // The last update added before the run was last emptied.
  std::string last_key, last_value;
  Time last_time = 0;
  bool last_spilled = false;

  // Runs on disk in arrival order, so by level, from the highest down
  // (merges of merges of kMaxFanIn runs...).
  std::vector<SpilledRun> written;
  std::size_t emitted = 0;          // the next entry out, from memory
  std::unique_ptr<RunMerge> merge;  // set when the output is merged
  UpdateView out;                   // what next() returned from memory
};

// Writes one run into a fresh scratch file through a buffer.
class TimeSorter::Impl::Writer {
 public:
  Writer(Impl& sorter, FileDescriptor file) : sorter_(&sorter), charge_(sorter.memory) {
    run_.file = std::move(file);
  }

  [[nodiscard]] Status start() {
    TM_TRY(charge_.resize(sorter_->buffer_bytes, true));
    buffer_ = std::make_unique_for_overwrite<char[]>(sorter_->buffer_bytes);
    return {};
  }

  [[nodiscard]] Status append(const UpdateView& update) {
    char header[4 * 10];
    std::size_t length = 0;
    auto put = [&](std::uint64_t v) {
      while (v >= 0x80) {
        header[length++] = static_cast<char>(v | 0x80);
        v >>= 7;
      }
      header[length++] = static_cast<char>(v);
    };
    // The varints and zig-zag of util/coding.h, without a call a byte.
    put(update.time - time_);
    put((static_cast<std::uint64_t>(update.diff) << 1) ^
        static_cast<std::uint64_t>(update.diff >> 63));
    put(update.key.size());
    put(update.value.size());
    time_ = update.time;
    const std::uint64_t record = length + update.key.size() + update.value.size();
    if (used_ + record > sorter_->buffer_bytes) TM_TRY(flush());
    if (record > sorter_->buffer_bytes) {
      // A huge update goes out from the caller's bytes, not copied.
      TM_TRY(write(std::string_view(header, length)));
      TM_TRY(write(update.key));
      TM_TRY(write(update.value));
      return {};
    }
    char* at = buffer_.get() + used_;
    std::memcpy(at, header, length);
    std::memcpy(at + length, update.key.data(), update.key.size());
    std::memcpy(at + length + update.key.size(), update.value.data(), update.value.size());
    used_ += record;
    return {};
  }

  [[nodiscard]] Result<SpilledRun> finish() {
    TM_TRY(flush());
    ++sorter_->stats.runs_written;
    return std::move(run_);
  }

 private:
  [[nodiscard]] Status flush() {
    TM_TRY(write(std::string_view(buffer_.get(), used_)));
    used_ = 0;
    return {};
  }

  [[nodiscard]] Status write(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::write(run_.file.get(), bytes.data(), bytes.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return determinate(scratch_message(sorter_->directory, "write a run", errno));
      }
      bytes.remove_prefix(static_cast<std::size_t>(n));
      run_.bytes += static_cast<std::uint64_t>(n);
      sorter_->stats.bytes_written += static_cast<std::uint64_t>(n);
    }
    return {};
  }

  Impl* sorter_;
  SpilledRun run_;
  std::unique_ptr<char[]> buffer_;  // buffer_bytes, of which used_ are filled
  std::size_t used_ = 0;
  Time time_ = 0;
  Charge charge_;
};

// Reads a scratch file's run through a buffer that holds at least one
// whole record.
class TimeSorter::Impl::FileCursor final : public RunCursor {
 public:
  FileCursor(Impl& sorter, SpilledRun run)
      : sorter_(&sorter), run_(std::move(run)), charge_(sorter.memory) {}

  Result<bool> advance() override {
    for (;;) {
      Decoder decoder(std::string_view(buffer_.data() + begin_, end_ - begin_));
      std::uint64_t time_delta = 0, key_size = 0, value_size = 0;
      std::int64_t diff = 0;
      std::uint64_t record = 0;  // the whole record's size, once its header is in
      if (decoder.get_varint(&time_delta) && decoder.get_signed_varint(&diff) &&
          decoder.get_varint(&key_size) && decoder.get_varint(&value_size)) {
        const std::uint64_t header = (end_ - begin_) - decoder.remaining();
        if (key_size <= decoder.remaining() && value_size <= decoder.remaining() - key_size) {
          const char* key = buffer_.data() + begin_ + header;
          time_ += time_delta;
          head_ = UpdateView{std::string_view(key, key_size),
                             std::string_view(key + key_size, value_size), time_, diff};
          begin_ += header + key_size + value_size;
          return true;
        }
        record = header + key_size + value_size;
      }
      if (offset_ == run_.bytes) {
        if (begin_ == end_) return false;
        return determinate(scratch_message(sorter_->directory, "a run ends inside a record", EIO));
      }
      TM_TRY(refill(record));
    }
  }

 private:
  // Moves what is left to the buffer's front and reads on, the buffer
  // made large enough for a record of `record` bytes.
  [[nodiscard]] Status refill(std::uint64_t record) {
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    // At least a record; back to the usual size once a huge one is gone.
    const std::uint64_t size = std::max(sorter_->buffer_bytes, record);
    if (size > buffer_.size()) {
      TM_TRY(charge_.resize(size));
      buffer_.resize(size);
    } else if (size < buffer_.size() && end_ <= size) {
      buffer_.resize(size);
      buffer_.shrink_to_fit();
      TM_TRY(charge_.resize(size));
    }
    while (end_ < buffer_.size() && offset_ < run_.bytes) {
      const std::uint64_t want =
          std::min<std::uint64_t>(buffer_.size() - end_, run_.bytes - offset_);
      const ssize_t n =
          ::pread(run_.file.get(), buffer_.data() + end_, want, static_cast<off_t>(offset_));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return determinate(scratch_message(sorter_->directory, "read a run", n < 0 ? errno : EIO));
      }
      end_ += static_cast<std::size_t>(n);
      offset_ += static_cast<std::uint64_t>(n);
    }
    return {};
  }

  Impl* sorter_;
  SpilledRun run_;
  std::string buffer_;  // [begin_, end_) read and not yet consumed
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  std::uint64_t offset_ = 0;  // in the file, of buffer_[end_]
  Time time_ = 0;
  Charge charge_;
};

// The sealed in-memory run as a merge's input.
class TimeSorter::Impl::MemoryCursor final : public RunCursor {
 public:
  explicit MemoryCursor(Impl& sorter) : sorter_(&sorter) {}

  Result<bool> advance() override {
    if (next_ == sorter_->count) return false;
    if (next_ + kPrefetchAhead < sorter_->count) {
      prefetch(sorter_->bytes_end() - sorter_->entries()[next_ + kPrefetchAhead].offset);
    }
    head_ = sorter_->view(sorter_->entries()[next_++]);
    return true;
  }

 private:
  Impl* sorter_;
  std::size_t next_ = 0;
};

Status TimeSorter::Impl::add(const UpdateView& update) {
  if (finished) return invalid_usage("TimeSorter: add after finish");
  // The order is checked: the merge of the runs relies on it. Consecutive
  // updates of one (key, value) share its bytes in the run.
  bool shared = false;
  if (count > 0 || last_spilled) {
    const UpdateView previous =
        count > 0 ? view(entries()[count - 1]) : UpdateView{last_key, last_value, last_time, 0};
    int order = compare_bytes(previous.key, update.key);
    if (order == 0) order = compare_bytes(previous.value, update.value);
    if (order > 0 || (order == 0 && previous.time > update.time)) {
      return invalid_usage("TimeSorter: updates out of (key, value, time) order");
    }
    shared = count > 0 && order == 0;
  }
  const std::uint64_t payload = update.key.size() + update.value.size();
  if (kEntryCost + payload > budget) {
    // Alone too big for the run: a run of its own.
    TM_TRY(spill());
    remember_last(update);
    TM_ASSIGN(Writer writer, open_writer());
    TM_TRY(writer.append(update));
    TM_ASSIGN(SpilledRun written, writer.finish());
    return add_run(std::move(written));
  }
  std::uint64_t needed = kEntryCost + (shared ? 0 : payload);
  if (needed > free_bytes()) {
    TM_TRY(grow(capacity - free_bytes() + needed));
    if (needed > free_bytes()) {
      TM_TRY(spill());
      shared = false;
      needed = kEntryCost + payload;
      TM_TRY(grow(needed));
    }
  }
  Entry entry{};
  if (shared) {
    entry.offset = entries()[count - 1].offset;
  } else {
    top -= payload;
    char* at = reinterpret_cast<char*>(run.get()) + top;
    std::memcpy(at, update.key.data(), update.key.size());
    std::memcpy(at + update.key.size(), update.value.data(), update.value.size());
    entry.offset = static_cast<std::uint32_t>(capacity - top);
  }
  entry.key_size = static_cast<std::uint32_t>(update.key.size());
  entry.value_size = static_cast<std::uint32_t>(update.value.size());
  entry.time = update.time;
  entry.diff = update.diff;
  entries()[count++] = entry;
  least_time = std::min(least_time, update.time);
  most_time = std::max(most_time, update.time);
  return {};
}

Status TimeSorter::Impl::grow(std::uint64_t needed) {
  if (needed <= capacity) return {};
  std::uint64_t size = std::max({needed, 2 * capacity, kFirstRunBytes});
  size = std::min((size + sizeof(Entry) - 1) / sizeof(Entry) * sizeof(Entry), budget);
  if (size <= capacity) return {};
  TM_TRY(run_charge.resize(size, true));
  auto larger = std::make_unique_for_overwrite<Entry[]>(size / sizeof(Entry));
  const std::uint64_t used_bytes = capacity - top;
  if (run) {
    std::memcpy(larger.get(), run.get(), count * sizeof(Entry));
    std::memcpy(reinterpret_cast<char*>(larger.get()) + size - used_bytes,
                reinterpret_cast<char*>(run.get()) + top, used_bytes);
  }
  run = std::move(larger);
  capacity = size;
  top = size - used_bytes;
  return {};
}

void TimeSorter::Impl::seal() {
  Entry* begin = entries();
  // Arrival is (key, value, time) order, so sorted stably by time the run
  // is in (time, key, value) order, with equal updates (one (key, value),
  // so one offset) adjacent.
  sort_by_time(begin, begin + count, count, least_time, most_time);
  std::size_t out = 0;
  for (std::size_t i = 0; i < count;) {
    const Entry first = begin[i];
    DiffSum sum = first.diff;
    std::size_t j = i + 1;
    while (j < count && begin[j].time == first.time && begin[j].offset == first.offset &&
           begin[j].key_size == first.key_size && begin[j].value_size == first.value_size) {
      sum += begin[j].diff;
      ++j;
    }
    // A carry takes at most j - i entries (update.h), so `out` never
    // passes j.
    while (sum != 0) {
      Entry piece = first;
      piece.diff = take_carried_diff(sum);
      begin[out++] = piece;
    }
    i = j;
  }
  count = out;
}

Result<SpilledRun> TimeSorter::Impl::write_run() {
  if (count > 0) remember_last(view(entries()[count - 1]));
  seal();
  TM_ASSIGN(Writer writer, open_writer());
  for (std::size_t i = 0; i < count; ++i) {
    if (i + kPrefetchAhead < count) prefetch(bytes_end() - entries()[i + kPrefetchAhead].offset);
    TM_TRY(writer.append(view(entries()[i])));
  }
  TM_ASSIGN(SpilledRun written, writer.finish());
  count = 0;
  top = capacity;
  least_time = UINT64_MAX;
  most_time = 0;
  return written;
}

Status TimeSorter::Impl::spill() {
  if (count == 0) return {};
  TM_ASSIGN(SpilledRun run, write_run());
  return add_run(std::move(run));
}

Result<TimeSorter::Impl::Writer> TimeSorter::Impl::open_writer() {
  if (!directory_made) {
    if (directory.empty()) {
      std::error_code error;
      directory = std::filesystem::temp_directory_path(error).string();
      if (error) directory = "/tmp";
    }
    std::error_code error;
    std::filesystem::create_directories(directory, error);
    if (error) return determinate(scratch_message(directory, "create it", error.value()));
    directory_made = true;
  }
  // O_TMPFILE: a file with no name, gone when closed, or when the process dies.
  FileDescriptor file(::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!file.valid() && (errno == EOPNOTSUPP || errno == EISDIR)) {
    // A file system without O_TMPFILE: a name, unlinked at once.
    std::string path = directory + "/.tidemark-scratch-XXXXXX";
    file = FileDescriptor(::mkostemp(path.data(), O_CLOEXEC));
    if (file.valid() && ::unlink(path.c_str()) != 0) {
      return determinate(scratch_message(directory, "unlink " + path, errno));
    }
  }
  if (!file.valid()) return determinate(scratch_message(directory, "create a file", errno));
  Writer writer(*this, std::move(file));
  TM_TRY(writer.start());
  return writer;
}

Status TimeSorter::Impl::add_run(SpilledRun run) {
  written.push_back(std::move(run));
  for (;;) {
    const std::size_t level = written.back().level;
    if (written.size() < kMaxFanIn ||
        !std::all_of(written.end() - kMaxFanIn, written.end(),
                     [&](const SpilledRun& r) { return r.level == level; })) {
      return {};
    }
    TM_TRY(merge_last(kMaxFanIn));
  }
}

Status TimeSorter::Impl::merge_last(std::size_t take) {
  ++stats.merges;
  std::vector<std::unique_ptr<RunCursor>> cursors;
  std::size_t level = 0;
  for (auto run = written.end() - take; run != written.end(); ++run) {
    level = std::max(level, run->level + 1);
    cursors.push_back(std::make_unique<FileCursor>(*this, std::move(*run)));
  }
  written.erase(written.end() - take, written.end());
  RunMerge merging(std::move(cursors), memory);
  TM_TRY(merging.start());
  TM_ASSIGN(Writer writer, open_writer());
  for (;;) {
    TM_ASSIGN(auto update, merging.next());
    if (!update) break;
    TM_TRY(writer.append(*update));
  }
  TM_ASSIGN(SpilledRun merged, writer.finish());
  merged.level = level;
  written.push_back(std::move(merged));
  return {};
}

Status TimeSorter::Impl::finish() {
  if (finished) return invalid_usage("TimeSorter: finish twice");
  finished = true;
  if (written.empty()) {
    seal();  // the one run, never spilled: out from memory
    return {};
  }
  if (written.size() + (count > 0 ? 1 : 0) > kMaxFanIn) {
    // Too many for one merge: the run goes to disk too, and the last runs
    // (the smallest) are merged until kMaxFanIn are left.
    TM_TRY(spill());
    while (written.size() > kMaxFanIn) {
      TM_TRY(merge_last(std::min(kMaxFanIn, written.size() - kMaxFanIn + 1)));
    }
  }
  seal();
  std::vector<std::unique_ptr<RunCursor>> cursors;
  for (SpilledRun& run : written) {
    cursors.push_back(std::make_unique<FileCursor>(*this, std::move(run)));
  }
  written.clear();
  if (count > 0) cursors.push_back(std::make_unique<MemoryCursor>(*this));
  merge = std::make_unique<RunMerge>(std::move(cursors), memory);
  return merge->start();
}

Result<const UpdateView*> TimeSorter::Impl::next() {
  if (merge) return merge->next();
  if (emitted == count) return nullptr;
  if (emitted + kPrefetchAhead < count) {
    prefetch(bytes_end() - entries()[emitted + kPrefetchAhead].offset);
  }
  out = view(entries()[emitted++]);
  return &out;
}

TimeSorter::TimeSorter(std::uint64_t budget, std::string directory, ReadMemory memory)
    : impl_(std::make_unique<Impl>(budget, std::move(directory), std::move(memory))) {}

TimeSorter::~TimeSorter() = default;

Status TimeSorter::add(const UpdateView& update) {
  if (impl_->failed) return std::unexpected(*impl_->failed);
  Status added = impl_->add(update);
  if (!added) impl_->failed = added.error();
  return added;
}

Status TimeSorter::finish() {
  if (impl_->failed) return std::unexpected(*impl_->failed);
  Status finished = impl_->finish();
  if (!finished) impl_->failed = finished.error();
  return finished;
}

Result<const UpdateView*> TimeSorter::next() {
  if (impl_->failed) return std::unexpected(*impl_->failed);
  auto update = impl_->next();
  if (!update) impl_->failed = update.error();
  return update;
}

const TimeSorterStats& TimeSorter::stats() const {
  return impl_->stats;
}

std::uint64_t TimeSorter::run_buffer_bytes(std::uint64_t budget) {
  return std::clamp<std::uint64_t>(budget / (kMaxFanIn + 1), kMinRunBufferBytes,
                                   kMaxRunBufferBytes);
}

}  // namespace tidemark
