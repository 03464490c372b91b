// MemoryPool: the tree of pools behind one mutex, and the Lease that holds
// its bytes.
//
// Every pool of a tree shares one Impl: a node per pool (capacity, used,
// figures, the when_available waiters) and one list of waiting
// reservations in arrival order. One mutex guards all of it, so a
// reservation can check and charge every pool on its way to the root in one
// step.
//
// Invariants, true whenever the mutex is free:
//   - a node's used is the sum of the leases taken in it or its
//     descendants;
//   - no waiting reservation could be granted now (settle has run after
//     every change), and a node is `held` exactly when an older waiting
//     reservation is held up there, so newcomers queue behind it.
// Callbacks and wake-ups are gathered under the mutex (Wakeups) and run
// after it is released, so a callback may call back into the pool.
#include "tidemark/memory_pool.h"

#include <algorithm>
#include <cassert>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <list>
#include <mutex>
#include <utility>
#include <vector>

namespace tidemark {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

struct MemoryPool::Impl {
  static constexpr std::size_t kNoParent = SIZE_MAX;

  // A reservation that could not be granted at once. A blocked thread
  // waits on `cv`; a callback waiter has `done` and the pool its lease
  // will name.
  struct ReserveWaiter {
    enum class State { kWaiting, kGranted, kFailed };
    std::size_t node = 0;
    std::uint64_t n = 0;
    Clock::time_point since;
    State state = State::kWaiting;
    std::string failure;  // why, when kFailed
    std::condition_variable cv;
    std::function<void(Result<Lease>)> done;
    std::shared_ptr<MemoryPool> pool;
  };

  // A wait for available() > 0: a blocked thread (`cv`) or a callback.
  struct AvailabilityWaiter {
    bool ready = false;
    std::condition_variable cv;
    std::function<void()> done;
    std::shared_ptr<MemoryPool> pool;
  };

  struct Node {
    std::string name;
    std::size_t parent = kNoParent;
    std::uint64_t capacity = 0;
    std::uint64_t used = 0;
    std::uint64_t peak_used = 0;
    std::uint64_t waits = 0;
    std::chrono::nanoseconds wait_time{0};
    // An older waiting reservation is held up here: newcomers whose way to
    // the root passes this node wait behind it.
    bool held = false;
    std::vector<std::shared_ptr<AvailabilityWaiter>> availability_waiters;
  };

  // Work found under the mutex, done after it is released.
  struct Wakeups {
    std::vector<std::shared_ptr<ReserveWaiter>> reservations;  // in grant order
    std::vector<std::shared_ptr<AvailabilityWaiter>> availability;
  };

  enum class Attempt { kGranted, kNeverFits, kMustWait };

  std::mutex mutex;
  // A deque keeps each node at one address while nodes are added, so
  // name() can hand out a reference. Slots of destroyed pools are reused.
  std::deque<Node> nodes;
  std::vector<std::size_t> free_nodes;
  std::list<std::shared_ptr<ReserveWaiter>> waiters;  // arrival order, whole tree
  std::size_t availability_waiting = 0;               // over every node
  bool any_held = false;

  static bool bounded(const Node& node) { return node.capacity != kUnlimited; }

  static std::uint64_t room(const Node& node) {
    if (!bounded(node)) return kUnlimited;
    return node.used >= node.capacity ? 0 : node.capacity - node.used;
  }

  // The nodes from `index` up to the root, in that order.
  template <typename F>
  void for_path(std::size_t index, F&& f) {
    for (std::size_t i = index; i != kNoParent; i = nodes[i].parent) f(i, nodes[i]);
  }

  // The first node on the path whose capacity is below `n`: a
  // reservation that can never fit there.
  std::optional<std::size_t> too_small(std::size_t index, std::uint64_t n) {
    std::optional<std::size_t> found;
    for_path(index, [&](std::size_t i, Node& node) {
      if (!found && bounded(node) && n > node.capacity) found = i;
    });
    return found;
  }

  // The lowest node on the path where `n` does not fit now.
  std::optional<std::size_t> lowest_misfit(std::size_t index, std::uint64_t n) {
    std::optional<std::size_t> found;
    for_path(index, [&](std::size_t i, Node& node) {
      if (!found && bounded(node) && n > room(node)) found = i;
    });
    return found;
  }

  bool path_held(std::size_t index) {
    bool held = false;
    for_path(index, [&](std::size_t, Node& node) { held = held || node.held; });
    return held;
  }

  void charge(std::size_t index, std::uint64_t n) {
    for_path(index, [&](std::size_t, Node& node) {
      node.used += n;
      node.peak_used = std::max(node.peak_used, node.used);
    });
  }

  void refund(std::size_t index, std::uint64_t n) {
    for_path(index, [&](std::size_t, Node& node) {
      assert(node.used >= n);
      node.used -= n;
    });
  }

  std::uint64_t available(std::size_t index) {
    std::uint64_t least = kUnlimited;
    for_path(index, [&](std::size_t, Node& node) { least = std::min(least, room(node)); });
    return least;
  }

  std::string never_fits_message(std::size_t index, std::uint64_t n, std::size_t small) {
    return "a reservation of " + std::to_string(n) + " bytes in pool '" + nodes[index].name +
           "' can never fit: pool '" + nodes[small].name + "' has a capacity of " +
           std::to_string(nodes[small].capacity) + " bytes";
  }

  // Grants `n` bytes in pool `index` now if every capacity on its path
  // allows it and no older waiter is held up there (FIFO). REQUIRES: mutex
  // held; the caller runs settle afterwards.
  Attempt attempt(std::size_t index, std::uint64_t n, std::string* failure) {
    if (n == 0) return Attempt::kGranted;
    if (auto small = too_small(index, n)) {
      *failure = never_fits_message(index, n, *small);
      return Attempt::kNeverFits;
    }
    if (path_held(index) || lowest_misfit(index, n)) return Attempt::kMustWait;
    charge(index, n);
    return Attempt::kGranted;
  }

  std::shared_ptr<ReserveWaiter> enqueue(std::size_t index, std::uint64_t n) {
    auto waiter = std::make_shared<ReserveWaiter>();
    waiter->node = index;
    waiter->n = n;
    waiter->since = Clock::now();
    nodes[index].waits += 1;
    waiters.push_back(waiter);
    return waiter;
  }

  void account_wait(const ReserveWaiter& waiter, Clock::time_point now) {
    nodes[waiter.node].wait_time +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - waiter.since);
  }

  // Takes a timed-out waiter out of the queue. REQUIRES: mutex held; the
  // caller runs settle afterwards (the waiter may have held others up).
  void withdraw(const std::shared_ptr<ReserveWaiter>& waiter) {
    account_wait(*waiter, Clock::now());
    waiters.remove(waiter);
  }

  // Restores the invariants after any change: fails waiters that can never
  // fit, grants those that fit in arrival order, marks where the rest are
  // held up, and releases availability waiters whose pool has room.
  // REQUIRES: mutex held.
  void settle(Wakeups& out) {
    if (any_held) {
      for (Node& node : nodes) node.held = false;
      any_held = false;
    }
    if (!waiters.empty()) {
      Clock::time_point now = Clock::now();
      for (auto it = waiters.begin(); it != waiters.end();) {
        ReserveWaiter& waiter = **it;
        if (auto small = too_small(waiter.node, waiter.n)) {
          waiter.state = ReserveWaiter::State::kFailed;
          waiter.failure = never_fits_message(waiter.node, waiter.n, *small);
        } else if (auto misfit = lowest_misfit(waiter.node, waiter.n)) {
          // Held up at its lowest misfit only: pools above it may still
          // serve others until this waiter could use them.
          nodes[*misfit].held = true;
          any_held = true;
          ++it;
          continue;
        } else if (path_held(waiter.node)) {
          ++it;  // fits, but an older waiter comes first
          continue;
        } else {
          charge(waiter.node, waiter.n);
          waiter.state = ReserveWaiter::State::kGranted;
        }
        account_wait(waiter, now);
        out.reservations.push_back(std::move(*it));
        it = waiters.erase(it);
      }
    }
    if (availability_waiting > 0) {
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        auto& list = nodes[i].availability_waiters;
        if (list.empty() || available(i) == 0) continue;
        for (auto& waiter : list) {
          waiter->ready = true;
          out.availability.push_back(std::move(waiter));
        }
        availability_waiting -= list.size();
        list.clear();
      }
    }
  }

  // Wakes threads and runs callbacks. REQUIRES: mutex not held.
  static void deliver(Wakeups& wakeups) {
    for (auto& waiter : wakeups.reservations) {
      if (!waiter->done) {
        waiter->cv.notify_one();
        continue;
      }
      auto done = std::move(waiter->done);
      if (waiter->state == ReserveWaiter::State::kGranted) {
        done(Lease(std::move(waiter->pool), waiter->n));
      } else {
        done(invalid_usage(std::move(waiter->failure)));
      }
    }
    for (auto& waiter : wakeups.availability) {
      if (!waiter->done) {
        waiter->cv.notify_one();
        continue;
      }
      auto done = std::move(waiter->done);
      done();
    }
  }

  // Pools are only handed out as shared_ptrs (Lease and shared_from_this
  // rely on it); the constructor stays private.
  static std::shared_ptr<MemoryPool> make_pool(std::shared_ptr<Impl> impl, std::size_t index) {
    struct Constructible : MemoryPool {};
    std::shared_ptr<MemoryPool> pool = std::make_shared<Constructible>();
    pool->impl_ = std::move(impl);
    pool->index_ = index;
    return pool;
  }
};

// --- Lease -------------------------------------------------------------------

Lease::Lease(std::shared_ptr<MemoryPool> pool, std::uint64_t size)
    : pool_(std::move(pool)), size_(size) {}

Lease::Lease(Lease&& other) noexcept
    : pool_(std::move(other.pool_)), size_(std::exchange(other.size_, 0)) {}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::move(other.pool_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Lease::~Lease() {
  release();
}

Lease Lease::split(std::uint64_t n) {
  assert(n <= size_);
  size_ -= n;
  return Lease(pool_, n);
}

void Lease::merge(Lease&& other) {
  if (other.size_ == 0) {
    other.pool_.reset();
    return;
  }
  if (size_ == 0) {
    pool_ = std::move(other.pool_);
  } else {
    assert(pool_ == other.pool_ && "Lease::merge: leases of different pools");
    other.pool_.reset();
  }
  size_ += std::exchange(other.size_, 0);
}

void Lease::shrink(std::uint64_t n) {
  assert(n <= size_);
  if (n == 0) return;
  size_ -= n;
  pool_->release_bytes(n);
}

bool Lease::try_grow(std::uint64_t n) {
  if (n == 0) return true;
  assert(pool_ && "Lease::try_grow: the lease has no pool");
  std::optional<Lease> extra = pool_->try_reserve(n);
  if (!extra) return false;
  size_ += std::exchange(extra->size_, 0);
  return true;
}

void Lease::force_grow(std::uint64_t n) {
  if (n == 0) return;
  assert(pool_ && "Lease::force_grow: the lease has no pool");
  Lease extra = pool_->force_reserve(n);
  size_ += std::exchange(extra.size_, 0);
}

void Lease::release() {
  if (size_ == 0) return;
  pool_->release_bytes(std::exchange(size_, 0));
}

// --- MemoryPool --------------------------------------------------------------

std::shared_ptr<MemoryPool> MemoryPool::create(std::string name, std::uint64_t capacity) {
  auto impl = std::make_shared<Impl>();
  Impl::Node& root = impl->nodes.emplace_back();
  root.name = std::move(name);
  root.capacity = capacity;
  return Impl::make_pool(std::move(impl), 0);
}

std::shared_ptr<MemoryPool> MemoryPool::unlimited(std::string name) {
  return create(std::move(name), kUnlimited);
}

std::shared_ptr<MemoryPool> MemoryPool::child(std::string name, std::uint64_t capacity) {
  std::size_t index;
  {
    std::lock_guard lock(impl_->mutex);
    Impl::Node node;
    node.name = std::move(name);
    node.parent = index_;
    node.capacity = capacity;
    if (impl_->free_nodes.empty()) {
      index = impl_->nodes.size();
      impl_->nodes.push_back(std::move(node));
    } else {
      index = impl_->free_nodes.back();
      impl_->free_nodes.pop_back();
      impl_->nodes[index] = std::move(node);
    }
  }
  std::shared_ptr<MemoryPool> pool = Impl::make_pool(impl_, index);
  pool->parent_ = shared_from_this();
  return pool;
}

MemoryPool::~MemoryPool() {
  if (!impl_) return;
  std::lock_guard lock(impl_->mutex);
  Impl::Node& node = impl_->nodes[index_];
  // Leases, pending callbacks and child pools all keep their pool alive.
  assert(node.used == 0);
  assert(node.availability_waiters.empty());
  if (index_ != 0) {
    node = Impl::Node{};
    impl_->free_nodes.push_back(index_);
  }
}

const std::string& MemoryPool::name() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->nodes[index_].name;
}

std::uint64_t MemoryPool::capacity() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->nodes[index_].capacity;
}

std::uint64_t MemoryPool::used() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->nodes[index_].used;
}

std::uint64_t MemoryPool::available() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->available(index_);
}

std::uint64_t MemoryPool::overdraft() const {
  std::lock_guard lock(impl_->mutex);
  const Impl::Node& node = impl_->nodes[index_];
  return Impl::bounded(node) && node.used > node.capacity ? node.used - node.capacity : 0;
}

std::size_t MemoryPool::waiting_reservations() const {
  std::lock_guard lock(impl_->mutex);
  std::size_t n = 0;
  for (const auto& waiter : impl_->waiters) n += waiter->node == index_ ? 1 : 0;
  return n;
}

MemoryPoolStats MemoryPool::stats() const {
  std::lock_guard lock(impl_->mutex);
  const Impl::Node& node = impl_->nodes[index_];
  return MemoryPoolStats{
      .name = node.name,
      .capacity = node.capacity,
      .used = node.used,
      .overdraft = Impl::bounded(node) && node.used > node.capacity ? node.used - node.capacity : 0,
      .peak_used = node.peak_used,
      .waits = node.waits,
      .wait_time = node.wait_time,
  };
}

std::optional<Lease> MemoryPool::try_reserve(std::uint64_t n) {
  Impl::Wakeups wakeups;
  Impl::Attempt attempt;
  {
    std::lock_guard lock(impl_->mutex);
    std::string failure;
    attempt = impl_->attempt(index_, n, &failure);
    impl_->settle(wakeups);
  }
  Impl::deliver(wakeups);
  if (attempt != Impl::Attempt::kGranted) return std::nullopt;
  return Lease(shared_from_this(), n);
}

Result<Lease> MemoryPool::reserve(std::uint64_t n) {
  return reserve_until(n, Clock::time_point::max());
}

Result<Lease> MemoryPool::reserve_until(std::uint64_t n, Clock::time_point deadline) {
  Impl::Wakeups wakeups;
  std::string failure;
  bool granted = false;
  {
    std::unique_lock lock(impl_->mutex);
    switch (impl_->attempt(index_, n, &failure)) {
      case Impl::Attempt::kGranted:
        granted = true;
        impl_->settle(wakeups);
        break;
      case Impl::Attempt::kNeverFits:
        break;
      case Impl::Attempt::kMustWait: {
        std::shared_ptr<Impl::ReserveWaiter> waiter = impl_->enqueue(index_, n);
        impl_->settle(wakeups);
        while (waiter->state == Impl::ReserveWaiter::State::kWaiting) {
          if (deadline == Clock::time_point::max()) {
            waiter->cv.wait(lock);
          } else if (waiter->cv.wait_until(lock, deadline) == std::cv_status::timeout &&
                     waiter->state == Impl::ReserveWaiter::State::kWaiting) {
            impl_->withdraw(waiter);
            impl_->settle(wakeups);
            std::string message = "pool '" + impl_->nodes[index_].name + "': " + std::to_string(n) +
                                  " bytes did not fit before the deadline";
            lock.unlock();
            Impl::deliver(wakeups);
            return make_error(ErrorKind::kNotReady, std::move(message));
          }
        }
        granted = waiter->state == Impl::ReserveWaiter::State::kGranted;
        if (!granted) failure = std::move(waiter->failure);
        break;
      }
    }
  }
  Impl::deliver(wakeups);
  if (!granted) return invalid_usage(std::move(failure));
  return Lease(shared_from_this(), n);
}

Lease MemoryPool::force_reserve(std::uint64_t n) {
  Impl::Wakeups wakeups;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->charge(index_, n);
    impl_->settle(wakeups);
  }
  Impl::deliver(wakeups);
  return Lease(shared_from_this(), n);
}

void MemoryPool::wait_until_available() {
  wait_until_available_until(Clock::time_point::max());
}

bool MemoryPool::wait_until_available_until(Clock::time_point deadline) {
  std::unique_lock lock(impl_->mutex);
  if (impl_->available(index_) > 0) return true;
  auto waiter = std::make_shared<Impl::AvailabilityWaiter>();
  auto& list = impl_->nodes[index_].availability_waiters;
  list.push_back(waiter);
  impl_->availability_waiting += 1;
  while (!waiter->ready) {
    if (deadline == Clock::time_point::max()) {
      waiter->cv.wait(lock);
    } else if (waiter->cv.wait_until(lock, deadline) == std::cv_status::timeout && !waiter->ready) {
      std::erase(list, waiter);
      impl_->availability_waiting -= 1;
      return false;
    }
  }
  return true;
}

void MemoryPool::reserve_async(std::uint64_t n, std::function<void(Result<Lease>)> done) {
  Impl::Wakeups wakeups;
  std::string failure;
  Impl::Attempt attempt;
  {
    std::lock_guard lock(impl_->mutex);
    attempt = impl_->attempt(index_, n, &failure);
    if (attempt == Impl::Attempt::kMustWait) {
      std::shared_ptr<Impl::ReserveWaiter> waiter = impl_->enqueue(index_, n);
      waiter->done = std::move(done);
      waiter->pool = shared_from_this();
    }
    impl_->settle(wakeups);
  }
  Impl::deliver(wakeups);
  switch (attempt) {
    case Impl::Attempt::kGranted:
      done(Lease(shared_from_this(), n));
      break;
    case Impl::Attempt::kNeverFits:
      done(invalid_usage(std::move(failure)));
      break;
    case Impl::Attempt::kMustWait:
      break;
  }
}

void MemoryPool::when_available(std::function<void()> done) {
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->available(index_) == 0) {
      auto waiter = std::make_shared<Impl::AvailabilityWaiter>();
      waiter->done = std::move(done);
      waiter->pool = shared_from_this();
      impl_->nodes[index_].availability_waiters.push_back(std::move(waiter));
      impl_->availability_waiting += 1;
      return;
    }
  }
  done();
}

MemoryPool::ReserveAwaitable::ReserveAwaitable(std::shared_ptr<MemoryPool> pool, std::uint64_t n)
    : pool_(std::move(pool)), n_(n) {}

bool MemoryPool::ReserveAwaitable::await_ready() {
  Impl& impl = *pool_->impl_;
  Impl::Wakeups wakeups;
  std::string failure;
  Impl::Attempt attempt;
  {
    std::lock_guard lock(impl.mutex);
    attempt = impl.attempt(pool_->index_, n_, &failure);
    impl.settle(wakeups);
  }
  Impl::deliver(wakeups);
  switch (attempt) {
    case Impl::Attempt::kGranted:
      result_.emplace(Lease(pool_, n_));
      return true;
    case Impl::Attempt::kNeverFits:
      result_.emplace(invalid_usage(std::move(failure)));
      return true;
    case Impl::Attempt::kMustWait:
      break;
  }
  return false;
}

void MemoryPool::ReserveAwaitable::await_suspend(std::coroutine_handle<> handle) {
  // The callback may run on another thread before this returns (or on this
  // one, if the bytes were freed since await_ready): touch nothing after.
  pool_->reserve_async(n_, [this, handle](Result<Lease> result) {
    result_.emplace(std::move(result));
    handle.resume();
  });
}

Result<Lease> MemoryPool::ReserveAwaitable::await_resume() {
  return std::move(*result_);
}

MemoryPool::ReserveAwaitable MemoryPool::reserve_awaitable(std::uint64_t n) {
  return ReserveAwaitable(shared_from_this(), n);
}

void MemoryPool::set_capacity(std::uint64_t capacity) {
  Impl::Wakeups wakeups;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->nodes[index_].capacity = capacity;
    impl_->settle(wakeups);
  }
  Impl::deliver(wakeups);
}

void MemoryPool::release_bytes(std::uint64_t n) {
  Impl::Wakeups wakeups;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->refund(index_, n);
    impl_->settle(wakeups);
  }
  Impl::deliver(wakeups);
}

}  // namespace tidemark
