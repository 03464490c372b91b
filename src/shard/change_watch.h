// ChangeWatch: wakes whoever in this process waits on a shard's state, at
// once for a change this process makes or reads and within a poll interval
// for one another process makes, so that waiters need not poll one by one.
//
// Every ShardMachine of a Client reports the states it learns (observe());
// a new upper wakes the shard's subscribers at once. While any shard has a
// subscriber, one task on the shared timers reads the head seqno of every
// watched shard in one Consensus::head_seqnos call every `poll` and wakes
// the subscribers of each shard whose seqno moved past what this process
// knew (another process committed: an append, but also a heartbeat or a
// compaction, so a wake means "look again", not "the upper moved").
// Shards with a fast subscriber (a listener: its reader waits on the next
// change) are read every `fast_poll` instead; the task then ticks every
// `fast_poll`, reading only the fast shards until `poll` has passed.
//
// When the backend offers change hints (Consensus::subscribe_change_hints:
// PostgreSQL's LISTEN/NOTIFY), another process's commit wakes at once too:
// a hint for a watched key wakes its subscribers (unless this process
// already knows that seqno), who read the shard as after any wake, so a
// spurious or repeated hint costs a read and nothing else. While the hint
// channel is up the fast shards are read only every `poll`, as a fallback;
// while it is down (and before it first comes up) every `fast_poll` as
// above. When it comes up again every watched shard is read at once, since
// the hints sent while it was down are lost.
//
// A wake is a call to the subscriber's function, from whichever thread
// learned of the change (a writer's, a reader's, the timers' pool): it must
// be quick and must not block or call back into the watch.
//
// Memory: per watched shard its key, two numbers and its subscribers'
// functions; nothing per change or per hint (the backend bounds its queue
// of hints). CPU while nothing changes: one batched
// head read per `poll` (per `fast_poll` of the fast shards), whatever the
// number of subscribers.
//
// Thread-safety: every method is safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "tidemark/frontier.h"
#include "tidemark/location.h"
#include "util/periodic.h"

namespace tidemark {

class ChangeWatch : public std::enable_shared_from_this<ChangeWatch> {
 public:
  using Id = std::uint64_t;

  ChangeWatch(std::shared_ptr<Consensus> consensus, std::chrono::milliseconds poll,
              std::chrono::milliseconds fast_poll);
  ~ChangeWatch();
  ChangeWatch(const ChangeWatch&) = delete;
  ChangeWatch& operator=(const ChangeWatch&) = delete;

  // Calls `wake` after each change of the shard stored under consensus key
  // `key` (see above) until unsubscribe(). An error only when the polling
  // task cannot be started.
  // A `fast` subscriber has its shard read every `fast_poll`.
  [[nodiscard]] Result<Id> subscribe(const std::string& key, std::function<void()> wake,
                                     bool fast = false);
  // After it returns `wake` is not called again, except by a call already
  // in progress on another thread.
  void unsubscribe(Id id);

  // A state of shard `key` this process committed or read.
  void observe(const std::string& key, SeqNo seqno, const Frontier& upper);

  // Reads the watched shards' head seqnos once and wakes those that moved
  // (what the polling task does every `poll`).
  void poll();
  // What the polling task does every tick: poll() once `poll` has passed
  // since the last, else the same for the fast shards alone (nothing when
  // there is none).
  void tick();

  std::size_t subscribers() const;

  // Whether the backend's change hints are flowing (the fast poll is off).
  bool hints_healthy() const;

 private:
  struct Watched {
    bool known = false;          // seqno has been learned (none is a value)
    std::optional<SeqNo> seqno;  // the newest this process knows of
    std::optional<Frontier> upper;
    std::map<Id, std::shared_ptr<std::function<void()>>> wakes;
    std::size_t fast = 0;  // of the subscribers
  };
  void poll_keys(bool fast_only);
  // A hint from the backend (on its thread).
  void on_hint(const ChangeHint& hint);
  using Wakes = std::vector<std::shared_ptr<std::function<void()>>>;
  static Wakes wakes_of(const Watched& watched);

  const std::shared_ptr<Consensus> consensus_;
  const std::chrono::milliseconds poll_interval_;
  const std::chrono::milliseconds tick_interval_;  // min(poll, fast_poll)
  mutable std::mutex mu_;
  std::map<std::string, Watched> watched_;           // GUARDED_BY(mu_)
  std::map<Id, std::string> keys_;                   // GUARDED_BY(mu_)
  Id next_id_ = 1;                                   // GUARDED_BY(mu_)
  std::set<Id> fast_ids_;                            // GUARDED_BY(mu_)
  std::size_t fast_keys_ = 0;                        // GUARDED_BY(mu_): watched with fast > 0
  std::chrono::steady_clock::time_point next_full_;  // GUARDED_BY(poll_mu_)
  bool polling_ = false;                             // GUARDED_BY(mu_)
  std::optional<std::uint64_t> hints_id_;            // GUARDED_BY(mu_): subscribed
  bool hints_healthy_ = false;                       // GUARDED_BY(mu_)
  bool full_due_ = false;                            // GUARDED_BY(mu_): read all next tick
  std::mutex poll_mu_;                               // one poll at a time
  PeriodicTask poller_;                              // last: stopped first
};

}  // namespace tidemark
