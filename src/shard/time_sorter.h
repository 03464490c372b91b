// TimeSorter: the updates of a listen's window, given in (key, value, time)
// order, put out in (time, key, value) order and consolidated, in bounded
// memory: an external merge sort whose runs spill to scratch files.
//
// add() takes updates as a MergeCursor gives them: sorted by (key, value,
// time), so equal ones are adjacent (out of order is InvalidUsage). They
// fill an in-memory run of at most `budget` bytes: 64 bytes an update (its
// entry, and room for the radix sort's second array), plus its key and
// value, stored once for consecutive updates of one (key, value). A full
// run is sorted by time, stably (so within a time in (key, value) order),
// consolidated (diffs of equal (time, key, value) summed, zeros dropped, a
// sum past i64 carried as update.h says) and written to a scratch file.
// An update that alone exceeds the budget is a run of its own, written
// straight from the caller's view. finish() ends the input; next() then
// gives every update in (time, key, value) order, consolidated across
// runs: from memory when the one run never spilled, else by merging the
// runs. The output is exactly what consolidating the whole window at once
// and sorting it stably by time gives.
//
// The merge is cheap because each run is a stretch of the input: at any
// one time, every update of a run sorts before every update of a later
// run (or equals the later run's first, when a run's end cut equal
// updates apart). So runs merge by (time, run) with integer comparisons,
// a time's updates coming out run after run, and keys are compared only
// where one run's updates at a time meet the next run's. Runs are merged
// at most kMaxFanIn at a time, and only with their neighbours: once the
// last kMaxFanIn runs are of one level (merges behind them) they are
// merged into one of the next level, and finish() merges the last (the
// smallest) until at most kMaxFanIn are left. So memory and open files
// are bounded whatever the data, and each update is written
// O(log_kMaxFanIn(data / budget)) times.
//
// Memory: the run, grown by doubling up to the budget; while merging, a
// read buffer per run merged and one write buffer, each of
// run_buffer_bytes(budget) (budget / 65, between 4 KiB and 64 KiB). So at
// most budget + max(budget, 65 x 4 KiB) bytes, and never more than
// budget + 65 x 64 KiB (8 MiB + 4.1 MiB at the default listen buffer),
// plus any update larger than a read buffer, which its reader holds whole
// (and the merge copies once when it sums it with another run's). With
// ReadMemory's pool, all of it is charged there: the run and the buffers
// at once (force_reserve), a buffer grown past 1 MiB for a huge update
// only when the pool has room (Full otherwise), as MergeCursor charges
// blocks.
//
// Scratch files: one per run, in `directory` (made if missing), opened
// with O_TMPFILE, or created and unlinked at once where the file system
// lacks it, so no name points at them: each is closed once its run is
// merged or the sorter destroyed, and the kernel frees it if the process
// dies. A file that cannot be made, written or read fails the call with
// a Determinate error naming the directory; after any error the sorter
// returns that error from every call.
//
// Thread-safety: single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tidemark/read.h"
#include "tidemark/update.h"

namespace tidemark {

// What a TimeSorter did, for tests and figures.
struct TimeSorterStats {
  std::uint64_t runs_written = 0;   // scratch files written (spilled runs and merged runs)
  std::uint64_t merges = 0;         // runs merged into a longer run before the final merge
  std::uint64_t bytes_written = 0;  // to scratch files
};

class TimeSorter {
 public:
  // The most runs one merge reads at once.
  static constexpr std::size_t kMaxFanIn = 64;
  // The largest budget honoured (offsets in the run are 32-bit).
  static constexpr std::uint64_t kMaxBudget = std::uint64_t{1} << 31;

  // `directory` empty: the system's temporary directory.
  TimeSorter(std::uint64_t budget, std::string directory, ReadMemory memory);
  ~TimeSorter();
  TimeSorter(const TimeSorter&) = delete;
  TimeSorter& operator=(const TimeSorter&) = delete;

  // REQUIRES: finish() not called; updates in (key, value, time) order.
  [[nodiscard]] Status add(const UpdateView& update);
  // Ends the input. REQUIRES: called once.
  [[nodiscard]] Status finish();
  // The next update, or null at the end. REQUIRES: finish() succeeded.
  // It stays valid until the next call.
  [[nodiscard]] Result<const UpdateView*> next();

  const TimeSorterStats& stats() const;

  // The size of each read and write buffer of a merge under `budget`.
  static std::uint64_t run_buffer_bytes(std::uint64_t budget);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tidemark
