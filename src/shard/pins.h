// ReaderPins: the seqno holds of a leased reader's open cursors.
//
// A leased reader records in the shard state the oldest state version it
// may still read parts from (its seqno hold); garbage collection keeps every
// part referenced at or after the least hold. Each snapshot or listen of the
// reader pins the hold recorded when it started (any state it fetches after
// that is at or above it); the heartbeat moves the recorded hold forward to
// the least pin, or, with nothing pinned, to the version it writes.
//
// pin() and renew() wait for a heartbeat in flight, so a heartbeat never
// records a hold past a pin taken while it ran.
//
// Thread-safety: safe for concurrent use.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "tidemark/location.h"

namespace tidemark {

class ReaderPins : public std::enable_shared_from_this<ReaderPins> {
 public:
  explicit ReaderPins(SeqNo recorded) : recorded_(recorded) {}

  class Pin {
   public:
    Pin() = default;
    Pin(std::shared_ptr<ReaderPins> pins, SeqNo seqno) : pins_(std::move(pins)), seqno_(seqno) {}
    Pin(Pin&& other) noexcept : pins_(std::move(other.pins_)), seqno_(other.seqno_) {}
    Pin& operator=(Pin&& other) noexcept {
      release();
      pins_ = std::move(other.pins_);
      seqno_ = other.seqno_;
      return *this;
    }
    ~Pin() { release(); }

    // Moves this pin to the hold recorded now: call it before fetching a
    // newer state, once nothing of the older one is read any more.
    void renew() {
      if (!pins_) return;
      std::lock_guard beat(pins_->heartbeat_mu_);
      std::lock_guard lock(pins_->mu_);
      pins_->pinned_.erase(pins_->pinned_.find(seqno_));
      seqno_ = pins_->recorded_;
      pins_->pinned_.insert(seqno_);
    }

   private:
    void release() {
      if (!pins_) return;
      std::lock_guard lock(pins_->mu_);
      pins_->pinned_.erase(pins_->pinned_.find(seqno_));
      pins_.reset();
    }
    std::shared_ptr<ReaderPins> pins_;
    SeqNo seqno_ = 0;
  };

  Pin pin() {
    std::lock_guard beat(heartbeat_mu_);
    std::lock_guard lock(mu_);
    pinned_.insert(recorded_);
    return Pin(shared_from_this(), recorded_);
  }

  // For the heartbeat: hold this lock across computing the hold and
  // committing it, then record what was committed.
  std::unique_lock<std::mutex> lock_for_heartbeat() { return std::unique_lock(heartbeat_mu_); }
  std::optional<SeqNo> least_pinned() {
    std::lock_guard lock(mu_);
    if (pinned_.empty()) return std::nullopt;
    return *pinned_.begin();
  }
  void set_recorded(SeqNo seqno) {
    std::lock_guard lock(mu_);
    if (recorded_ < seqno) recorded_ = seqno;
  }

 private:
  std::mutex heartbeat_mu_;  // held by a heartbeat in flight
  std::mutex mu_;
  SeqNo recorded_;               // GUARDED_BY(mu_)
  std::multiset<SeqNo> pinned_;  // GUARDED_BY(mu_)
};

}  // namespace tidemark
