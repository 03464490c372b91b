#include "shard/change_watch.h"

#include <vector>

namespace tidemark {

ChangeWatch::ChangeWatch(std::shared_ptr<Consensus> consensus, std::chrono::milliseconds poll)
    : consensus_(std::move(consensus)), poll_interval_(poll) {}

ChangeWatch::~ChangeWatch() {
  poller_.stop();
}

ChangeWatch::Wakes ChangeWatch::wakes_of(const Watched& watched) {
  Wakes out;
  out.reserve(watched.wakes.size());
  for (const auto& [id, wake] : watched.wakes) out.push_back(wake);
  return out;
}

Result<ChangeWatch::Id> ChangeWatch::subscribe(const std::string& key, std::function<void()> wake) {
  bool start = false;
  Id id;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
    watched_[key].wakes.emplace(id, std::make_shared<std::function<void()>>(std::move(wake)));
    keys_.emplace(id, key);
    start = !polling_;
    polling_ = true;
  }
  if (start) {
    // The task holds the watch weakly: a Client that goes away ends it.
    std::weak_ptr<ChangeWatch> weak = weak_from_this();
    auto started = poller_.start(poll_interval_, [weak] {
      auto self = weak.lock();
      if (!self) return false;
      self->poll();
      return true;
    });
    if (!started) {
      unsubscribe(id);
      std::lock_guard lock(mu_);
      polling_ = false;
      return std::unexpected(started.error());
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
  std::vector<std::string> keys;
  {
    std::lock_guard lock(mu_);
    keys.reserve(watched_.size());
    for (const auto& [key, watched] : watched_) keys.push_back(key);
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
