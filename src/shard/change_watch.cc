#include "shard/change_watch.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace tidemark {

ChangeWatch::ChangeWatch(std::shared_ptr<Consensus> consensus, std::chrono::milliseconds poll,
                         std::chrono::milliseconds fast_poll)
    : consensus_(std::move(consensus)),
      poll_interval_(poll),
      tick_interval_(std::max(std::chrono::milliseconds(1), std::min(poll, fast_poll))) {}

ChangeWatch::~ChangeWatch() {
  std::optional<std::uint64_t> hints;
  {
    std::lock_guard lock(mu_);
    hints.swap(hints_id_);
  }
  if (hints) consensus_->unsubscribe_change_hints(*hints);
  poller_.stop();
}

ChangeWatch::Wakes ChangeWatch::wakes_of(const Watched& watched) {
  Wakes out;
  out.reserve(watched.wakes.size());
  for (const auto& [id, wake] : watched.wakes) out.push_back(wake);
  return out;
}

Result<ChangeWatch::Id> ChangeWatch::subscribe(const std::string& key, std::function<void()> wake,
                                               bool fast) {
  bool start = false;
  Id id;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
    Watched& watched = watched_[key];
    watched.wakes.emplace(id, std::make_shared<std::function<void()>>(std::move(wake)));
    if (fast) {
      if (watched.fast++ == 0) ++fast_keys_;
      fast_ids_.insert(id);
    }
    keys_.emplace(id, key);
    start = !polling_;
    polling_ = true;
  }
  if (start) {
    // The task holds the watch weakly: a Client that goes away ends it.
    std::weak_ptr<ChangeWatch> weak = weak_from_this();
    auto started = poller_.start(tick_interval_, [weak] {
      auto self = weak.lock();
      if (!self) return false;
      self->tick();
      return true;
    });
    if (!started) {
      unsubscribe(id);
      std::lock_guard lock(mu_);
      polling_ = false;
      return std::unexpected(started.error());
    }
    // Hints, when the backend has them; without, the polls above are all.
    // `this`, not a weak pointer: the destructor unsubscribes, which waits
    // for a delivery in progress, so the watch is never destroyed on the
    // backend's hint thread by its own callback.
    auto hints =
        consensus_->subscribe_change_hints([this](const ChangeHint& hint) { on_hint(hint); });
    if (hints) {
      std::lock_guard lock(mu_);
      hints_id_ = hints;
    }
  }
  return id;
}

void ChangeWatch::unsubscribe(Id id) {
  std::lock_guard lock(mu_);
  auto it = keys_.find(id);
  if (it == keys_.end()) return;
  auto watched = watched_.find(it->second);
  if (watched != watched_.end()) {
    watched->second.wakes.erase(id);
    if (fast_ids_.erase(id) > 0 && --watched->second.fast == 0) --fast_keys_;
    if (watched->second.wakes.empty()) watched_.erase(watched);
  }
  keys_.erase(it);
}

void ChangeWatch::observe(const std::string& key, SeqNo seqno, const Frontier& upper) {
  Wakes wakes;
  {
    std::lock_guard lock(mu_);
    auto it = watched_.find(key);
    if (it == watched_.end()) return;
    Watched& watched = it->second;
    if (watched.seqno && *watched.seqno >= seqno) return;
    watched.known = true;
    watched.seqno = seqno;
    const bool moved = !watched.upper || *watched.upper < upper;
    watched.upper = upper;
    if (moved) wakes = wakes_of(watched);
  }
  for (const auto& wake : wakes) (*wake)();
}

void ChangeWatch::poll() {
  std::lock_guard one(poll_mu_);
  poll_keys(/*fast_only=*/false);
}

void ChangeWatch::tick() {
  std::lock_guard one(poll_mu_);
  const auto now = std::chrono::steady_clock::now();
  bool full_due;
  bool healthy;
  {
    std::lock_guard lock(mu_);
    full_due = std::exchange(full_due_, false);
    healthy = hints_healthy_;
  }
  if (full_due || now >= next_full_) {
    next_full_ = now + poll_interval_;
    return poll_keys(/*fast_only=*/false);
  }
  // Hints wake the fast shards: the full poll is their fallback.
  if (!healthy) poll_keys(/*fast_only=*/true);
}

void ChangeWatch::on_hint(const ChangeHint& hint) {
  Wakes wakes;
  {
    std::lock_guard lock(mu_);
    switch (hint.kind) {
      case ChangeHint::Kind::kLost:
        hints_healthy_ = false;
        return;
      case ChangeHint::Kind::kAll:
        // Read every watched shard on the timers' pool, not on the
        // backend's hint thread.
        hints_healthy_ = true;
        full_due_ = true;
        break;
      case ChangeHint::Kind::kKey: {
        auto it = watched_.find(hint.key);
        if (it == watched_.end()) return;
        const Watched& watched = it->second;
        // This process wrote or read that version already (and woke then).
        if (hint.seqno && watched.known && watched.seqno && *watched.seqno >= *hint.seqno) return;
        wakes = wakes_of(watched);
        break;
      }
    }
  }
  if (hint.kind == ChangeHint::Kind::kAll) {
    poller_.wake_now();
    return;
  }
  for (const auto& wake : wakes) (*wake)();
}

bool ChangeWatch::hints_healthy() const {
  std::lock_guard lock(mu_);
  return hints_healthy_;
}

// REQUIRES: poll_mu_ held.
void ChangeWatch::poll_keys(bool fast_only) {
  std::vector<std::string> keys;
  {
    std::lock_guard lock(mu_);
    if (fast_only && fast_keys_ == 0) return;
    keys.reserve(fast_only ? fast_keys_ : watched_.size());
    for (const auto& [key, watched] : watched_) {
      if (!fast_only || watched.fast > 0) keys.push_back(key);
    }
  }
  if (keys.empty()) return;
  auto seqnos = consensus_->head_seqnos(keys);
  if (!seqnos) return;  // the subscribers' own reads see the outage
  Wakes wakes;
  {
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < keys.size() && i < seqnos->size(); ++i) {
      const std::optional<SeqNo>& seqno = (*seqnos)[i];
      auto it = watched_.find(keys[i]);
      if (it == watched_.end()) continue;
      Watched& watched = it->second;
      // (An optional orders nullopt, no version yet, below every seqno.)
      if (watched.known && !(watched.seqno < seqno)) continue;
      const bool first = !watched.known;
      watched.known = true;
      watched.seqno = seqno;
      // The first read only learns where the shard is.
      if (!first) {
        Wakes more = wakes_of(watched);
        wakes.insert(wakes.end(), more.begin(), more.end());
      }
    }
  }
  for (const auto& wake : wakes) (*wake)();
}

std::size_t ChangeWatch::subscribers() const {
  std::lock_guard lock(mu_);
  return keys_.size();
}

}  // namespace tidemark
