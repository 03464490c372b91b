// MemoryPool: one byte budget for a whole process, as a tree of pools.
//
// A pool has a capacity and hands out Leases: move-only RAII claims on a
// number of bytes, returned to the pool when the lease is destroyed.
//
//   used        bytes held by live leases (a parent counts its children's)
//   available   max(capacity - used, 0), the least such figure over this
//               pool and its ancestors (what could fit now); kUnlimited
//               when no pool on the way to the root has a capacity
//   overdraft   max(used - capacity, 0), for this pool alone
//
// Ways to get bytes:
//   try_reserve(n)    a lease if n fits now (in this pool and every ancestor),
//                     else nothing; never takes a pool past its capacity.
//   reserve(n)        waits until n fits, first come first served: a waiting
//                     large request is not overtaken by later small ones.
//                     n > capacity fails at once (InvalidUsage) instead of
//                     waiting forever; so does a pool whose capacity is
//                     lowered below a waiter's request.
//   force_reserve(n)  always succeeds at once and may overdraft. The
//                     admission rule bounds how far:
//                     a sender checks available() > 0, encodes, then
//                     force-reserves the actual size, so the overdraft is at
//                     most one call's worth per sender.
// A reservation of 0 bytes always succeeds at once.
// Waiting can be a blocked thread (reserve, wait_until_available), a
// callback (reserve_async, when_available: run on the thread that frees
// the bytes, outside the pool's lock), or a coroutine (co_await
// pool.reserve_awaitable(n)). A pending callback keeps its pool alive
// until it runs, and must not throw.
//
// Child pools draw from their parent: a child's lease also counts against
// every ancestor, so a server's whole budget is one tree. set_capacity may
// lower a capacity below use; new reservations then wait until enough is
// released. An unlimited pool has no capacity: every reservation fits.
//
// Fairness across the tree: a waiting reservation holds up newcomers (and
// later waiters) at the lowest pool on its way to the root where it does
// not fit, so it is not starved by a sibling pool's small reservations,
// while pools it does not contend for are not held up by it.
// wait_until_available and when_available look at available() alone, not
// at the queue of waiting reservations (the admission rule's check).
//
// Thread-safety: every method is safe to call from any thread. A Lease is
// used by one thread at a time but may be moved between threads.
#pragma once

#include <chrono>
#include <coroutine>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tidemark/error.h"

namespace tidemark {

class MemoryPool;

class Lease {
 public:
  Lease() = default;  // holds nothing
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();  // returns the bytes

  std::uint64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const std::shared_ptr<MemoryPool>& pool() const { return pool_; }

  // Moves `n` bytes into a new lease on the same pool.
  // REQUIRES: n <= size().
  [[nodiscard]] Lease split(std::uint64_t n);
  // Takes over `other`'s bytes. REQUIRES: same pool (or either empty).
  void merge(Lease&& other);
  // Returns `n` bytes to the pool now. REQUIRES: n <= size().
  void shrink(std::uint64_t n);
  // Adds `n` bytes if they fit now (like try_reserve); false otherwise.
  [[nodiscard]] bool try_grow(std::uint64_t n);
  // Adds `n` bytes at once, overdrafting if need be (like force_reserve).
  void force_grow(std::uint64_t n);
  // Returns every byte now; the lease is then empty.
  void release();

 private:
  friend class MemoryPool;
  Lease(std::shared_ptr<MemoryPool> pool, std::uint64_t size);
  std::shared_ptr<MemoryPool> pool_;
  std::uint64_t size_ = 0;
};

struct MemoryPoolStats {
  std::string name;
  std::uint64_t capacity = 0;  // UINT64_MAX for an unlimited pool
  std::uint64_t used = 0;
  std::uint64_t overdraft = 0;
  std::uint64_t peak_used = 0;
  std::uint64_t waits = 0;                // reservations that had to wait
  std::chrono::nanoseconds wait_time{0};  // total time they waited
};

class MemoryPool : public std::enable_shared_from_this<MemoryPool> {
 public:
  static constexpr std::uint64_t kUnlimited = UINT64_MAX;

  [[nodiscard]] static std::shared_ptr<MemoryPool> create(std::string name, std::uint64_t capacity);
  [[nodiscard]] static std::shared_ptr<MemoryPool> unlimited(std::string name);
  // A pool that draws from this one. Its capacity may be kUnlimited: then
  // only the ancestors bound it.
  [[nodiscard]] std::shared_ptr<MemoryPool> child(std::string name, std::uint64_t capacity);

  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  const std::string& name() const;
  std::uint64_t capacity() const;
  std::uint64_t used() const;
  std::uint64_t available() const;
  std::uint64_t overdraft() const;
  MemoryPoolStats stats() const;
  // Reservations made on this pool itself that are waiting for room now.
  std::size_t waiting_reservations() const;

  [[nodiscard]] std::optional<Lease> try_reserve(std::uint64_t n);
  [[nodiscard]] Result<Lease> reserve(std::uint64_t n);
  // Like reserve, but gives up at `deadline` with a NotReady error.
  [[nodiscard]] Result<Lease> reserve_until(std::uint64_t n,
                                            std::chrono::steady_clock::time_point deadline);
  [[nodiscard]] Lease force_reserve(std::uint64_t n);

  // Blocks until available() > 0.
  void wait_until_available();
  // Blocks until available() > 0 or the deadline; false on timeout.
  bool wait_until_available_until(std::chrono::steady_clock::time_point deadline);

  // Callback forms: `done` runs exactly once, with the lease (or the error
  // reserve would return), possibly at once on the calling thread.
  void reserve_async(std::uint64_t n, std::function<void(Result<Lease>)> done);
  void when_available(std::function<void()> done);

  // Coroutine form: `Result<Lease> lease = co_await pool->reserve_awaitable(n);`
  class ReserveAwaitable {
   public:
    ReserveAwaitable(std::shared_ptr<MemoryPool> pool, std::uint64_t n);
    bool await_ready();
    void await_suspend(std::coroutine_handle<> handle);
    Result<Lease> await_resume();

   private:
    std::shared_ptr<MemoryPool> pool_;
    std::uint64_t n_;
    std::optional<Result<Lease>> result_;
  };
  [[nodiscard]] ReserveAwaitable reserve_awaitable(std::uint64_t n);

  // Lowering below used() is allowed; raising wakes waiters that now fit.
  void set_capacity(std::uint64_t capacity);

  struct Impl;  // shared by every pool of one tree

 private:
  MemoryPool() = default;
  friend class Lease;
  void release_bytes(std::uint64_t n);
  std::shared_ptr<Impl> impl_;
  std::size_t index_ = 0;               // this pool's node in the tree
  std::shared_ptr<MemoryPool> parent_;  // keeps the parent's node in use
};

}  // namespace tidemark
