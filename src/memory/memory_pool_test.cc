// Tests for MemoryPool and Lease, one behaviour per test, then a
// multi-threaded stress test (run under ThreadSanitizer in CI).
#include "tidemark/memory_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <coroutine>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace tidemark {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Polls `done` until it holds or five seconds pass.
template <typename Predicate>
bool eventually(Predicate done) {
  Clock::time_point deadline = Clock::now() + 5s;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Waits until `pool` has seen `waits` reservations that had to wait, i.e.
// until a reserving thread is queued.
void wait_for_waits(const std::shared_ptr<MemoryPool>& pool, std::uint64_t waits) {
  ASSERT_TRUE(eventually([&] { return pool->stats().waits >= waits; }));
}

// Collects reserve_async results, in the order the callbacks ran.
struct Grants {
  std::mutex mutex;
  std::vector<std::string> order;
  std::vector<Lease> leases;
  std::vector<Error> errors;

  std::function<void(Result<Lease>)> callback(std::string label) {
    return [this, label = std::move(label)](Result<Lease> result) {
      std::lock_guard lock(mutex);
      order.push_back(label);
      if (result) {
        leases.push_back(std::move(*result));
      } else {
        errors.push_back(result.error());
      }
    };
  }
  std::vector<std::string> snapshot() {
    std::lock_guard lock(mutex);
    return order;
  }
};

// --- Capacity arithmetic -------------------------------------------------------

TEST(MemoryPoolTest, TryReserveWithinCapacity) {
  auto pool = MemoryPool::create("pool", 100);
  std::optional<Lease> a = pool->try_reserve(60);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->size(), 60u);
  EXPECT_EQ(a->pool(), pool);
  std::optional<Lease> b = pool->try_reserve(40);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(pool->used(), 100u);
  EXPECT_EQ(pool->available(), 0u);
}

TEST(MemoryPoolTest, TryReserveOverCapacityFails) {
  auto pool = MemoryPool::create("pool", 100);
  Lease held = *pool->try_reserve(70);
  EXPECT_FALSE(pool->try_reserve(31).has_value());
  EXPECT_FALSE(pool->try_reserve(101).has_value());
  EXPECT_EQ(pool->used(), 70u);
  EXPECT_TRUE(pool->try_reserve(30).has_value());
}

TEST(MemoryPoolTest, AvailableUsedOverdraftArithmetic) {
  auto pool = MemoryPool::create("pool", 100);
  EXPECT_EQ(pool->capacity(), 100u);
  EXPECT_EQ(pool->used(), 0u);
  EXPECT_EQ(pool->available(), 100u);
  EXPECT_EQ(pool->overdraft(), 0u);
  Lease a = *pool->try_reserve(30);
  EXPECT_EQ(pool->used(), 30u);
  EXPECT_EQ(pool->available(), 70u);
  EXPECT_EQ(pool->overdraft(), 0u);
  Lease b = pool->force_reserve(90);
  EXPECT_EQ(pool->used(), 120u);
  EXPECT_EQ(pool->available(), 0u);
  EXPECT_EQ(pool->overdraft(), 20u);
  MemoryPoolStats stats = pool->stats();
  EXPECT_EQ(stats.name, "pool");
  EXPECT_EQ(stats.capacity, 100u);
  EXPECT_EQ(stats.used, 120u);
  EXPECT_EQ(stats.overdraft, 20u);
  EXPECT_EQ(pool->name(), "pool");
}

TEST(MemoryPoolTest, ZeroByteReservationsAlwaysSucceed) {
  auto pool = MemoryPool::create("pool", 10);
  Lease full = pool->force_reserve(20);  // overdrafted
  std::optional<Lease> zero = pool->try_reserve(0);
  ASSERT_TRUE(zero.has_value());
  EXPECT_TRUE(zero->empty());
  Result<Lease> reserved = pool->reserve(0);
  ASSERT_TRUE(reserved.has_value());
  EXPECT_EQ(reserved->size(), 0u);
  EXPECT_EQ(pool->used(), 20u);
  EXPECT_EQ(pool->stats().waits, 0u);
}

// --- Overdraft -------------------------------------------------------------------

TEST(MemoryPoolTest, ForceReserveOverdraftsAndRecovers) {
  auto pool = MemoryPool::create("pool", 100);
  Lease a = *pool->try_reserve(80);
  Lease forced = pool->force_reserve(50);
  EXPECT_EQ(forced.size(), 50u);
  EXPECT_EQ(pool->overdraft(), 30u);
  EXPECT_FALSE(pool->try_reserve(1).has_value());
  forced.release();
  EXPECT_EQ(pool->overdraft(), 0u);
  EXPECT_EQ(pool->available(), 20u);
  EXPECT_TRUE(pool->try_reserve(20).has_value());
}

TEST(MemoryPoolTest, ForceReserveOnAFullPoolStillSucceeds) {
  auto pool = MemoryPool::create("pool", 0);
  Lease forced = pool->force_reserve(1000);
  EXPECT_EQ(pool->used(), 1000u);
  EXPECT_EQ(pool->overdraft(), 1000u);
}

// --- Waiting -------------------------------------------------------------------------

TEST(MemoryPoolTest, ReserveWaitsAndWakesOnRelease) {
  auto pool = MemoryPool::create("pool", 100);
  std::optional<Lease> held = pool->try_reserve(100);
  std::atomic<bool> granted{false};
  std::thread waiter([&] {
    Result<Lease> lease = pool->reserve(40);
    ASSERT_TRUE(lease.has_value());
    EXPECT_EQ(lease->size(), 40u);
    granted = true;
  });
  wait_for_waits(pool, 1);
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(granted.load());
  held.reset();
  waiter.join();
  EXPECT_TRUE(granted.load());
  EXPECT_EQ(pool->used(), 0u);
}

TEST(MemoryPoolTest, ReserveLargerThanCapacityFailsAtOnce) {
  auto pool = MemoryPool::create("pool", 100);
  Result<Lease> lease = pool->reserve(101);
  ASSERT_FALSE(lease.has_value());
  EXPECT_EQ(lease.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_EQ(pool->stats().waits, 0u);
  // An ancestor's capacity bounds a child whose own capacity is unlimited.
  auto child = pool->child("child", MemoryPool::kUnlimited);
  Result<Lease> in_child = child->reserve(150);
  ASSERT_FALSE(in_child.has_value());
  EXPECT_EQ(in_child.error().kind, ErrorKind::kInvalidUsage);
  EXPECT_NE(in_child.error().message.find("'pool'"), std::string::npos) << in_child.error().message;
}

TEST(MemoryPoolTest, ReserveUntilTimesOut) {
  auto pool = MemoryPool::create("pool", 10);
  Lease held = *pool->try_reserve(10);
  Clock::time_point start = Clock::now();
  Result<Lease> lease = pool->reserve_until(5, start + 20ms);
  ASSERT_FALSE(lease.has_value());
  EXPECT_EQ(lease.error().kind, ErrorKind::kNotReady);
  EXPECT_GE(Clock::now() - start, 20ms);
  EXPECT_EQ(pool->stats().waits, 1u);
  // The timed-out waiter left the queue: nothing holds newcomers up.
  held.release();
  EXPECT_TRUE(pool->try_reserve(10).has_value());
}

TEST(MemoryPoolTest, ReserveUntilSucceedsBeforeTheDeadline) {
  auto pool = MemoryPool::create("pool", 10);
  std::optional<Lease> held = pool->try_reserve(10);
  std::thread releaser([&] {
    wait_for_waits(pool, 1);
    held.reset();
  });
  Result<Lease> lease = pool->reserve_until(5, Clock::now() + 5s);
  releaser.join();
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->size(), 5u);
}

// --- FIFO fairness ---------------------------------------------------------------------

TEST(MemoryPoolTest, FifoLargeWaiterIsGrantedBeforeLaterSmallOnes) {
  auto pool = MemoryPool::create("pool", 100);
  std::optional<Lease> first = pool->try_reserve(60);
  std::optional<Lease> second = pool->try_reserve(40);
  Grants grants;
  pool->reserve_async(80, grants.callback("large"));
  pool->reserve_async(10, grants.callback("small"));
  EXPECT_TRUE(grants.snapshot().empty());

  // 40 free: the small one would fit, but must not overtake the large one.
  second.reset();
  EXPECT_EQ(pool->available(), 40u);
  EXPECT_TRUE(grants.snapshot().empty());
  EXPECT_FALSE(pool->try_reserve(10).has_value());

  first.reset();
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"large", "small"}));
  EXPECT_EQ(pool->used(), 90u);
}

TEST(MemoryPoolTest, FifoLargeWaiterIsNotStarvedByAStreamOfSmallReservations) {
  auto pool = MemoryPool::create("pool", 100);
  std::vector<Lease> smalls;
  for (int i = 0; i < 10; ++i) smalls.push_back(*pool->try_reserve(10));
  std::atomic<bool> granted{false};
  std::thread large([&] {
    Result<Lease> lease = pool->reserve(50);
    ASSERT_TRUE(lease.has_value());
    granted = true;
  });
  wait_for_waits(pool, 1);

  // Small requests keep arriving as bytes come back; none may overtake.
  Grants grants;
  for (int i = 0; i < 4; ++i) {
    smalls.pop_back();
    EXPECT_EQ(pool->available(), 10u * (i + 1));
    EXPECT_FALSE(pool->try_reserve(10).has_value());
    pool->reserve_async(10, grants.callback("small" + std::to_string(i)));
    EXPECT_TRUE(grants.snapshot().empty());
  }
  EXPECT_FALSE(granted.load());
  smalls.pop_back();  // 50 free: the large one first
  large.join();
  EXPECT_TRUE(granted.load());
  // After the large lease was dropped, the queued small ones were granted in order.
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"small0", "small1", "small2", "small3"}));
}

TEST(MemoryPoolTest, FifoSmallCallbacksRunAfterTheLargeGrant) {
  auto pool = MemoryPool::create("pool", 100);
  std::optional<Lease> held = pool->try_reserve(100);
  Grants grants;
  std::vector<std::uint64_t> used_at_small_grant;
  pool->reserve_async(80, grants.callback("large"));
  pool->reserve_async(20, [&](Result<Lease> lease) {
    ASSERT_TRUE(lease.has_value());
    used_at_small_grant.push_back(pool->used());
    grants.callback("small")(std::move(lease));
  });
  held.reset();
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"large", "small"}));
  ASSERT_EQ(used_at_small_grant.size(), 1u);
  EXPECT_EQ(used_at_small_grant[0], 100u);
}

TEST(MemoryPoolTest, WaitingReservationsCountsThisPoolsOwn) {
  auto root = MemoryPool::create("root", 100);
  auto child = root->child("child", 100);
  std::optional<Lease> held = root->try_reserve(100);
  EXPECT_EQ(root->waiting_reservations(), 0u);
  Grants grants;
  root->reserve_async(10, grants.callback("root"));
  child->reserve_async(10, grants.callback("child"));
  child->reserve_async(10, grants.callback("child 2"));
  EXPECT_EQ(root->waiting_reservations(), 1u);
  EXPECT_EQ(child->waiting_reservations(), 2u);
  held.reset();
  EXPECT_EQ(root->waiting_reservations(), 0u);
  EXPECT_EQ(child->waiting_reservations(), 0u);
}

TEST(MemoryPoolTest, FifoTimedOutWaiterStopsHoldingOthersUp) {
  auto pool = MemoryPool::create("pool", 100);
  Lease held = *pool->try_reserve(90);
  Grants grants;
  std::thread large([&] {
    Result<Lease> lease = pool->reserve_until(50, Clock::now() + 30ms);
    EXPECT_FALSE(lease.has_value());
  });
  wait_for_waits(pool, 1);
  pool->reserve_async(5, grants.callback("small"));  // behind the large one
  EXPECT_TRUE(grants.snapshot().empty());
  large.join();  // the timeout settles the queue
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"small"}));
  EXPECT_EQ(pool->used(), 95u);
}

// --- set_capacity --------------------------------------------------------------------

TEST(MemoryPoolTest, SetCapacityBelowUseKeepsLeasesAndMakesNewReservationsWait) {
  auto pool = MemoryPool::create("pool", 100);
  std::optional<Lease> held = pool->try_reserve(80);
  pool->set_capacity(50);
  EXPECT_EQ(held->size(), 80u);
  EXPECT_EQ(pool->used(), 80u);
  EXPECT_EQ(pool->capacity(), 50u);
  EXPECT_EQ(pool->overdraft(), 30u);
  EXPECT_EQ(pool->available(), 0u);
  EXPECT_FALSE(pool->try_reserve(10).has_value());
  Grants grants;
  pool->reserve_async(10, grants.callback("waiter"));
  held->shrink(30);  // used 50 = capacity: still no room
  EXPECT_TRUE(grants.snapshot().empty());
  held.reset();
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"waiter"}));
  EXPECT_EQ(pool->used(), 10u);
}

TEST(MemoryPoolTest, SetCapacityBelowAWaitersRequestFailsIt) {
  auto pool = MemoryPool::create("pool", 100);
  Lease held = *pool->try_reserve(100);
  Grants grants;
  pool->reserve_async(60, grants.callback("large"));
  pool->reserve_async(30, grants.callback("fits"));
  std::optional<Result<Lease>> from_thread;
  std::thread waiter([&] { from_thread = pool->reserve(70); });
  wait_for_waits(pool, 3);
  pool->set_capacity(50);
  waiter.join();
  ASSERT_TRUE(from_thread.has_value());
  ASSERT_FALSE(from_thread->has_value());
  EXPECT_EQ(from_thread->error().kind, ErrorKind::kInvalidUsage);
  {
    std::lock_guard lock(grants.mutex);
    ASSERT_EQ(grants.order, (std::vector<std::string>{"large"}));
    ASSERT_EQ(grants.errors.size(), 1u);
    EXPECT_EQ(grants.errors[0].kind, ErrorKind::kInvalidUsage);
  }
  held.release();  // the 30-byte waiter still fits the new capacity
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"large", "fits"}));
}

TEST(MemoryPoolTest, SetCapacityRaiseWakesWaiters) {
  auto pool = MemoryPool::create("pool", 100);
  Lease held = *pool->try_reserve(100);
  Grants grants;
  pool->reserve_async(20, grants.callback("a"));
  pool->reserve_async(30, grants.callback("b"));
  pool->set_capacity(130);
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"a"}));
  pool->set_capacity(150);
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(pool->used(), 150u);
}

// --- Lease ---------------------------------------------------------------------------

TEST(LeaseTest, SplitAndMergeKeepTheAccounting) {
  auto pool = MemoryPool::create("pool", 100);
  Lease lease = *pool->try_reserve(60);
  Lease part = lease.split(25);
  EXPECT_EQ(lease.size(), 35u);
  EXPECT_EQ(part.size(), 25u);
  EXPECT_EQ(part.pool(), pool);
  EXPECT_EQ(pool->used(), 60u);
  Lease nothing = lease.split(0);
  EXPECT_TRUE(nothing.empty());

  lease.merge(std::move(part));
  EXPECT_EQ(lease.size(), 60u);
  EXPECT_TRUE(part.empty());  // NOLINT(bugprone-use-after-move): merge empties it
  EXPECT_EQ(pool->used(), 60u);

  Lease empty;
  empty.merge(std::move(lease));  // an empty lease adopts the pool
  EXPECT_EQ(empty.size(), 60u);
  EXPECT_EQ(empty.pool(), pool);
  empty.merge(Lease());  // merging nothing changes nothing
  EXPECT_EQ(empty.size(), 60u);
  empty.release();
  EXPECT_EQ(pool->used(), 0u);
}

TEST(LeaseTest, ShrinkReturnsBytesAndWakesWaiters) {
  auto pool = MemoryPool::create("pool", 100);
  Lease lease = *pool->try_reserve(100);
  Grants grants;
  pool->reserve_async(30, grants.callback("waiter"));
  lease.shrink(20);
  EXPECT_EQ(lease.size(), 80u);
  EXPECT_EQ(pool->used(), 80u);
  EXPECT_TRUE(grants.snapshot().empty());
  lease.shrink(10);
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"waiter"}));
  EXPECT_EQ(pool->used(), 100u);
  lease.shrink(0);
  EXPECT_EQ(lease.size(), 70u);
}

TEST(LeaseTest, TryGrowAddsOnlyWhatFits) {
  auto pool = MemoryPool::create("pool", 100);
  Grants grants;  // declared first: outlives the lease whose release serves it
  Lease lease = *pool->try_reserve(50);
  EXPECT_TRUE(lease.try_grow(30));
  EXPECT_EQ(lease.size(), 80u);
  EXPECT_FALSE(lease.try_grow(30));
  EXPECT_EQ(lease.size(), 80u);
  EXPECT_EQ(pool->used(), 80u);
  EXPECT_TRUE(lease.try_grow(0));
  // try_grow obeys FIFO like try_reserve.
  pool->reserve_async(30, grants.callback("waiter"));
  EXPECT_FALSE(lease.try_grow(10));
}

TEST(LeaseTest, ForceGrowOverdrafts) {
  auto pool = MemoryPool::create("pool", 100);
  Lease lease = *pool->try_reserve(90);
  lease.force_grow(40);
  EXPECT_EQ(lease.size(), 130u);
  EXPECT_EQ(pool->used(), 130u);
  EXPECT_EQ(pool->overdraft(), 30u);
  lease.shrink(40);
  EXPECT_EQ(pool->overdraft(), 0u);
}

TEST(LeaseTest, ReleaseAndDestructionReturnEveryByte) {
  auto pool = MemoryPool::create("pool", 100);
  Lease lease = *pool->try_reserve(40);
  lease.release();
  EXPECT_TRUE(lease.empty());
  EXPECT_EQ(lease.pool(), pool);  // still names its pool: may grow again
  EXPECT_EQ(pool->used(), 0u);
  EXPECT_TRUE(lease.try_grow(10));
  EXPECT_EQ(pool->used(), 10u);
  {
    Lease scoped = *pool->try_reserve(50);
    EXPECT_EQ(pool->used(), 60u);
  }
  EXPECT_EQ(pool->used(), 10u);
}

TEST(LeaseTest, MoveTransfersOwnership) {
  auto pool = MemoryPool::create("pool", 100);
  Lease a = *pool->try_reserve(30);
  Lease b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.size(), 30u);
  EXPECT_EQ(pool->used(), 30u);

  Lease c = *pool->try_reserve(20);
  c = std::move(b);  // c's own 20 bytes go back
  EXPECT_EQ(c.size(), 30u);
  EXPECT_EQ(pool->used(), 30u);
  c = Lease();
  EXPECT_EQ(pool->used(), 0u);
  static_assert(!std::is_copy_constructible_v<Lease>);
  static_assert(!std::is_copy_assignable_v<Lease>);
}

TEST(LeaseTest, LeaseKeepsItsPoolAlive) {
  Lease lease;
  EXPECT_TRUE(lease.empty());
  EXPECT_EQ(lease.pool(), nullptr);
  {
    auto pool = MemoryPool::create("pool", 100);
    auto child = pool->child("child", 50);
    lease = *child->try_reserve(20);
  }
  ASSERT_NE(lease.pool(), nullptr);
  EXPECT_EQ(lease.pool()->used(), 20u);
  EXPECT_EQ(lease.pool()->name(), "child");
}

// --- Unlimited and child pools ----------------------------------------------------------

TEST(MemoryPoolTest, UnlimitedPoolGrantsEverything) {
  auto pool = MemoryPool::unlimited("unlimited");
  EXPECT_EQ(pool->capacity(), MemoryPool::kUnlimited);
  EXPECT_EQ(pool->available(), MemoryPool::kUnlimited);
  std::optional<Lease> huge = pool->try_reserve(std::uint64_t{1} << 62);
  ASSERT_TRUE(huge.has_value());
  Result<Lease> more = pool->reserve(std::uint64_t{1} << 40);
  ASSERT_TRUE(more.has_value());
  EXPECT_EQ(pool->used(), (std::uint64_t{1} << 62) + (std::uint64_t{1} << 40));
  EXPECT_EQ(pool->overdraft(), 0u);
  EXPECT_EQ(pool->available(), MemoryPool::kUnlimited);
  EXPECT_EQ(pool->stats().capacity, MemoryPool::kUnlimited);
}

TEST(MemoryPoolTest, ChildReservationCountsInParent) {
  auto root = MemoryPool::create("root", 1000);
  auto child = root->child("child", 300);
  auto grandchild = child->child("grandchild", MemoryPool::kUnlimited);
  Lease a = *grandchild->try_reserve(100);
  Lease b = *child->try_reserve(50);
  Lease c = *root->try_reserve(200);
  EXPECT_EQ(grandchild->used(), 100u);
  EXPECT_EQ(child->used(), 150u);
  EXPECT_EQ(root->used(), 350u);
  EXPECT_EQ(grandchild->available(), 150u);  // bounded by the child
  EXPECT_EQ(child->available(), 150u);
  EXPECT_EQ(root->available(), 650u);
  EXPECT_FALSE(grandchild->try_reserve(151).has_value());
  a.release();
  EXPECT_EQ(child->used(), 50u);
  EXPECT_EQ(root->used(), 250u);
}

TEST(MemoryPoolTest, ParentCapacityBoundsChildren) {
  auto root = MemoryPool::create("root", 100);
  auto a = root->child("a", MemoryPool::kUnlimited);
  auto b = root->child("b", 80);
  Lease from_a = *a->try_reserve(60);
  EXPECT_EQ(b->available(), 40u);  // the root, not b, is the limit
  EXPECT_FALSE(b->try_reserve(50).has_value());
  EXPECT_TRUE(b->try_reserve(40).has_value());
  // A forced child reservation overdrafts its ancestors too.
  Lease forced = b->force_reserve(90);
  EXPECT_EQ(b->overdraft(), 10u);
  EXPECT_EQ(root->overdraft(), 50u);
  EXPECT_EQ(a->overdraft(), 0u);
  EXPECT_EQ(a->available(), 0u);
}

TEST(MemoryPoolTest, ChildWaiterIsWokenWhenASiblingReleases) {
  auto root = MemoryPool::create("root", 100);
  auto a = root->child("a", MemoryPool::kUnlimited);
  auto b = root->child("b", MemoryPool::kUnlimited);
  std::optional<Lease> held = b->try_reserve(100);
  std::optional<Result<Lease>> result;
  std::thread waiter([&] { result = a->reserve(30); });
  wait_for_waits(a, 1);
  held.reset();
  waiter.join();
  ASSERT_TRUE(result.has_value() && result->has_value());
  EXPECT_EQ((*result)->pool(), a);
  EXPECT_EQ(root->used(), 30u);
}

TEST(MemoryPoolTest, ChildWaiterIsNotStarvedByASibling) {
  auto root = MemoryPool::create("root", 100);
  auto a = root->child("a", MemoryPool::kUnlimited);
  auto b = root->child("b", MemoryPool::kUnlimited);
  std::optional<Lease> held = b->try_reserve(50);
  Grants grants;
  a->reserve_async(80, grants.callback("large in a"));
  // 50 free at the root, but the waiter in a is held up there.
  EXPECT_FALSE(b->try_reserve(10).has_value());
  b->reserve_async(10, grants.callback("small in b"));
  EXPECT_TRUE(grants.snapshot().empty());
  held.reset();
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"large in a", "small in b"}));
  EXPECT_EQ(root->used(), 90u);
}

TEST(MemoryPoolTest, ChildHeldUpByItsOwnCapacityDoesNotHoldUpSiblings) {
  auto root = MemoryPool::create("root", 100);
  auto a = root->child("a", 50);
  auto b = root->child("b", MemoryPool::kUnlimited);
  std::optional<Lease> in_a = a->try_reserve(30);
  Grants grants;
  a->reserve_async(40, grants.callback("waiter in a"));  // a is the limit, not the root
  EXPECT_FALSE(a->try_reserve(5).has_value());           // FIFO within a
  EXPECT_TRUE(b->try_reserve(50).has_value());           // b is not held up
  in_a.reset();
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"waiter in a"}));
}

TEST(MemoryPoolTest, ChildPoolsComeAndGo) {
  auto root = MemoryPool::create("root", 100);
  for (int i = 0; i < 10; ++i) {
    auto child = root->child("child" + std::to_string(i), 10);
    EXPECT_EQ(child->name(), "child" + std::to_string(i));
    EXPECT_EQ(child->stats().peak_used, 0u);
    Lease lease = *child->try_reserve(10);
    EXPECT_EQ(root->used(), 10u);
  }
  EXPECT_EQ(root->used(), 0u);
  // A child keeps its parent alive.
  std::shared_ptr<MemoryPool> orphan;
  {
    auto parent = MemoryPool::create("parent", 10);
    orphan = parent->child("orphan", MemoryPool::kUnlimited);
  }
  EXPECT_EQ(orphan->available(), 10u);
  EXPECT_FALSE(orphan->try_reserve(11).has_value());
}

// --- Stats ---------------------------------------------------------------------------

TEST(MemoryPoolTest, StatsCountWaitsWaitTimeAndPeak) {
  auto root = MemoryPool::create("root", 100);
  auto child = root->child("child", 100);
  {
    Lease a = *child->try_reserve(70);
    Lease b = root->force_reserve(50);
  }
  std::optional<Lease> held = child->try_reserve(100);
  std::thread waiter([&] {
    Result<Lease> lease = child->reserve(10);
    EXPECT_TRUE(lease.has_value());
  });
  wait_for_waits(child, 1);
  std::this_thread::sleep_for(5ms);
  held.reset();
  waiter.join();

  MemoryPoolStats stats = child->stats();
  EXPECT_EQ(stats.name, "child");
  EXPECT_EQ(stats.waits, 1u);
  EXPECT_GE(stats.wait_time, 5ms);
  EXPECT_EQ(stats.peak_used, 100u);
  EXPECT_EQ(stats.used, 0u);
  MemoryPoolStats root_stats = root->stats();
  EXPECT_EQ(root_stats.peak_used, 120u);
  EXPECT_EQ(root_stats.waits, 0u);  // the wait is counted where it was made
}

// --- Callbacks and coroutines ---------------------------------------------------------------

TEST(MemoryPoolTest, ReserveAsyncRunsAtOnceWhenItFits) {
  auto pool = MemoryPool::create("pool", 100);
  Grants grants;
  pool->reserve_async(40, grants.callback("now"));
  EXPECT_EQ(grants.snapshot(), (std::vector<std::string>{"now"}));
  EXPECT_EQ(pool->used(), 40u);
  pool->reserve_async(200, grants.callback("never"));
  std::lock_guard lock(grants.mutex);
  ASSERT_EQ(grants.errors.size(), 1u);
  EXPECT_EQ(grants.errors[0].kind, ErrorKind::kInvalidUsage);
  EXPECT_EQ(pool->stats().waits, 0u);
}

TEST(MemoryPoolTest, ReserveAsyncDeferredRunsOnTheReleasingThread) {
  auto pool = MemoryPool::create("pool", 100);
  std::optional<Lease> held = pool->try_reserve(100);
  std::thread::id ran_on;
  std::optional<Lease> granted;
  pool->reserve_async(60, [&](Result<Lease> lease) {
    ASSERT_TRUE(lease.has_value());
    ran_on = std::this_thread::get_id();
    granted = std::move(*lease);
  });
  EXPECT_FALSE(granted.has_value());
  std::thread releaser([&] { held.reset(); });
  std::thread::id releaser_id = releaser.get_id();
  releaser.join();
  ASSERT_TRUE(granted.has_value());
  EXPECT_EQ(granted->size(), 60u);
  EXPECT_EQ(ran_on, releaser_id);
  EXPECT_EQ(pool->stats().waits, 1u);
}

TEST(MemoryPoolTest, CallbacksMayCallBackIntoThePool) {
  auto pool = MemoryPool::create("pool", 100);
  std::optional<Lease> held = pool->try_reserve(100);
  int chained = 0;
  std::function<void(Result<Lease>)> chain = [&](Result<Lease> lease) {
    ASSERT_TRUE(lease.has_value());
    if (++chained < 5) pool->reserve_async(100, chain);  // waits for this lease
  };  // the lease is dropped here, granting the next one
  pool->reserve_async(100, chain);
  held.reset();
  EXPECT_EQ(chained, 5);
  EXPECT_EQ(pool->used(), 0u);
}

TEST(MemoryPoolTest, WhenAvailableFiresOnceThereIsRoom) {
  auto pool = MemoryPool::create("pool", 100);
  int fired = 0;
  pool->when_available([&] { ++fired; });
  EXPECT_EQ(fired, 1);  // at once

  Lease held = pool->force_reserve(120);
  pool->when_available([&] { ++fired; });
  pool->when_available([&] { ++fired; });
  held.shrink(20);  // used == capacity: still nothing available
  EXPECT_EQ(fired, 1);
  held.shrink(1);
  EXPECT_EQ(fired, 3);
}

TEST(MemoryPoolTest, WhenAvailableLooksAtAvailableNotAtTheQueue) {
  auto pool = MemoryPool::create("pool", 100);
  Grants grants;  // declared first: outlives the lease whose release serves it
  std::optional<Lease> held = pool->try_reserve(100);
  pool->reserve_async(50, grants.callback("large"));
  int fired = 0;
  pool->when_available([&] { ++fired; });
  held->shrink(10);  // 10 available, the large waiter still waits
  EXPECT_EQ(fired, 1);
  EXPECT_TRUE(grants.snapshot().empty());
}

TEST(MemoryPoolTest, WhenAvailableInAChildWatchesItsAncestors) {
  auto root = MemoryPool::create("root", 100);
  auto a = root->child("a", MemoryPool::kUnlimited);
  auto b = root->child("b", MemoryPool::kUnlimited);
  std::optional<Lease> held = b->try_reserve(100);
  int fired = 0;
  a->when_available([&] { ++fired; });
  EXPECT_EQ(fired, 0);
  held.reset();
  EXPECT_EQ(fired, 1);
}

TEST(MemoryPoolTest, WaitUntilAvailableBlocksUntilThereIsRoom) {
  auto pool = MemoryPool::create("pool", 100);
  pool->wait_until_available();  // returns at once
  Lease held = pool->force_reserve(100);
  EXPECT_FALSE(pool->wait_until_available_until(Clock::now() + 10ms));
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    pool->wait_until_available();
    woke = true;
  });
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(woke.load());
  held.shrink(1);
  waiter.join();
  EXPECT_TRUE(woke.load());
  EXPECT_TRUE(pool->wait_until_available_until(Clock::now()));
}

// A coroutine that starts at once and frees itself when it finishes.
struct DetachedTask {
  struct promise_type {
    DetachedTask get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

struct CoroutineOutcome {
  std::optional<Result<Lease>> result;
  std::thread::id resumed_on;
};

DetachedTask reserve_in_coroutine(std::shared_ptr<MemoryPool> pool, std::uint64_t n,
                                  CoroutineOutcome* out) {
  Result<Lease> lease = co_await pool->reserve_awaitable(n);
  out->resumed_on = std::this_thread::get_id();
  out->result.emplace(std::move(lease));
}

TEST(MemoryPoolTest, ReserveAwaitableCompletesAtOnceWhenItFits) {
  auto pool = MemoryPool::create("pool", 100);
  CoroutineOutcome out;
  reserve_in_coroutine(pool, 40, &out);
  ASSERT_TRUE(out.result.has_value());
  ASSERT_TRUE(out.result->has_value());
  EXPECT_EQ((*out.result)->size(), 40u);
  EXPECT_EQ(out.resumed_on, std::this_thread::get_id());

  CoroutineOutcome too_large;
  reserve_in_coroutine(pool, 101, &too_large);
  ASSERT_TRUE(too_large.result.has_value());
  ASSERT_FALSE(too_large.result->has_value());
  EXPECT_EQ(too_large.result->error().kind, ErrorKind::kInvalidUsage);
}

TEST(MemoryPoolTest, ReserveAwaitableResumesAfterARelease) {
  auto pool = MemoryPool::create("pool", 100);
  std::optional<Lease> held = pool->try_reserve(100);
  CoroutineOutcome out;
  reserve_in_coroutine(pool, 70, &out);
  EXPECT_FALSE(out.result.has_value());  // suspended
  EXPECT_EQ(pool->stats().waits, 1u);
  std::thread releaser([&] { held.reset(); });
  std::thread::id releaser_id = releaser.get_id();
  releaser.join();
  ASSERT_TRUE(out.result.has_value());
  ASSERT_TRUE(out.result->has_value());
  EXPECT_EQ((*out.result)->size(), 70u);
  EXPECT_EQ(out.resumed_on, releaser_id);
  EXPECT_EQ(pool->used(), 70u);
}

TEST(MemoryPoolStressTest, ReserveAwaitableUnderContention) {
  auto pool = MemoryPool::create("pool", 100);
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::atomic<int> suspended_or_ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t + 7);
      for (int round = 0; round < kRounds; ++round) {
        // Holds nothing while its coroutine waits, so every waiter is served.
        CoroutineOutcome out;
        std::atomic<bool> done{false};
        [](std::shared_ptr<MemoryPool> pool, std::uint64_t n, CoroutineOutcome* out,
           std::atomic<bool>* done) -> DetachedTask {
          Result<Lease> lease = co_await pool->reserve_awaitable(n);
          out->result.emplace(std::move(lease));
          done->store(true);
        }(pool, 1 + rng() % 60, &out, &done);
        while (!done.load()) std::this_thread::yield();
        ASSERT_TRUE(out.result->has_value());
        ++suspended_or_ready;
        if (rng() % 4 == 0) std::this_thread::yield();
      }  // the lease goes back here, resuming other threads' coroutines
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(suspended_or_ready.load(), kThreads * kRounds);
  EXPECT_EQ(pool->used(), 0u);
  EXPECT_LE(pool->stats().peak_used, 100u);
  std::printf("awaitable stress: %llu of %d reservations suspended\n",
              static_cast<unsigned long long>(pool->stats().waits), kThreads * kRounds);
}

// --- Stress --------------------------------------------------------------------------

// Eight threads reserve, split, merge, shrink and release in a tree of
// pools while a watcher checks the capacity invariants.
struct StressTree {
  static constexpr std::uint64_t kRootCapacity = 1000;
  static constexpr std::uint64_t kChildCapacity = 600;
  std::shared_ptr<MemoryPool> root = MemoryPool::create("root", kRootCapacity);
  std::shared_ptr<MemoryPool> bounded = root->child("bounded", kChildCapacity);
  std::shared_ptr<MemoryPool> open = root->child("open", MemoryPool::kUnlimited);

  std::shared_ptr<MemoryPool> pick(std::mt19937& rng) {
    switch (rng() % 3) {
      case 0:
        return root;
      case 1:
        return bounded;
      default:
        return open;
    }
  }
};

constexpr int kStressThreads = 8;
constexpr auto kStressPhase = 400ms;

// Reserves, reshapes and releases ordinary (not forced) leases.
void shuffle_leases(StressTree& tree, std::mt19937& rng, std::vector<Lease>& held,
                    std::atomic<int>& violations) {
  auto check = [&] {
    if (tree.root->used() > StressTree::kRootCapacity) ++violations;
    if (tree.bounded->used() > StressTree::kChildCapacity) ++violations;
  };
  std::uint64_t n = 1 + rng() % 150;
  switch (rng() % 8) {
    case 0:
    case 1:
      if (held.size() < 6) {
        if (auto lease = tree.pick(rng)->try_reserve(n)) {
          check();
          held.push_back(std::move(*lease));
        }
      }
      break;
    case 2: {
      // Holding nothing while blocked keeps the threads from deadlocking.
      held.clear();
      Result<Lease> lease = tree.pick(rng)->reserve(n);
      if (!lease) {
        ++violations;
        break;
      }
      check();
      held.push_back(std::move(*lease));
      break;
    }
    case 3:
      if (!held.empty() && held.size() < 6 && held.back().size() >= 2) {
        held.push_back(held.back().split(held.back().size() / 2));
      }
      break;
    case 4:
      if (held.size() >= 2 && held[0].pool() == held[1].pool()) {
        held[0].merge(std::move(held[1]));
        held.erase(held.begin() + 1);
      }
      break;
    case 5:
      if (!held.empty()) held.back().shrink(held.back().size() / 2);
      break;
    case 6:
      if (!held.empty() && held.back().try_grow(n / 4)) check();
      break;
    default:
      if (!held.empty()) held.erase(held.begin());
      break;
  }
}

TEST(MemoryPoolStressTest, ReserveAndTryReserveNeverExceedCapacity) {
  StressTree tree;
  std::atomic<bool> stop{false};
  std::atomic<int> violations{0};
  std::atomic<std::uint64_t> max_root_used{0};
  std::thread watcher([&] {
    while (!stop) {
      std::uint64_t used = tree.root->used();
      if (used > StressTree::kRootCapacity) ++violations;
      if (tree.bounded->used() > StressTree::kChildCapacity) ++violations;
      if (used > max_root_used) max_root_used = used;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  Clock::time_point deadline = Clock::now() + kStressPhase;
  std::atomic<std::uint64_t> operations{0};
  for (int t = 0; t < kStressThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      std::vector<Lease> held;
      while (Clock::now() < deadline) {
        shuffle_leases(tree, rng, held, violations);
        ++operations;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  stop = true;
  watcher.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_GT(operations.load(), 1000u);
  std::printf("stress: %llu operations, waits root %llu bounded %llu open %llu\n",
              static_cast<unsigned long long>(operations.load()),
              static_cast<unsigned long long>(tree.root->stats().waits),
              static_cast<unsigned long long>(tree.bounded->stats().waits),
              static_cast<unsigned long long>(tree.open->stats().waits));
  EXPECT_GT(max_root_used.load(), 0u);
  EXPECT_LE(tree.root->stats().peak_used, StressTree::kRootCapacity);
  EXPECT_LE(tree.bounded->stats().peak_used, StressTree::kChildCapacity);
  EXPECT_EQ(tree.root->used(), 0u);
  EXPECT_EQ(tree.bounded->used(), 0u);
  EXPECT_EQ(tree.open->used(), 0u);
}

TEST(MemoryPoolStressTest, ForcedOverdraftStaysBoundedByOneCallPerThread) {
  constexpr std::uint64_t kMaxForce = 100;
  constexpr std::uint64_t kBound = kStressThreads * kMaxForce;
  StressTree tree;
  std::atomic<bool> stop{false};
  std::atomic<int> violations{0};
  std::atomic<int> overdraft_violations{0};
  std::thread watcher([&] {
    while (!stop) {
      if (tree.root->overdraft() > kBound) ++overdraft_violations;
      if (tree.bounded->overdraft() > kBound) ++overdraft_violations;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  Clock::time_point deadline = Clock::now() + kStressPhase;
  std::atomic<std::uint64_t> forced{0};
  for (int t = 0; t < kStressThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::vector<Lease> held;
      Lease force;  // at most one forced lease per thread at a time
      while (Clock::now() < deadline) {
        if (rng() % 3 == 0) {
          if (!force.empty()) {
            force.release();
          } else {
            // The admission rule: check for room, then charge the actual size.
            std::shared_ptr<MemoryPool> pool = tree.pick(rng);
            if (pool->available() > 0) {
              force = pool->force_reserve(1 + rng() % kMaxForce);
              ++forced;
            }
          }
          if (tree.root->overdraft() > kBound) ++overdraft_violations;
          continue;
        }
        // Ordinary reservations in between: they never add to the overdraft.
        std::uint64_t n = 1 + rng() % 150;
        if (rng() % 2 == 0) {
          held.clear();
          force.release();  // hold nothing while blocked
          Result<Lease> lease = tree.pick(rng)->reserve_until(n, Clock::now() + 50ms);
          if (!lease && lease.error().kind != ErrorKind::kNotReady) ++violations;
          if (lease) held.push_back(std::move(*lease));
        } else if (held.size() < 4) {
          if (auto lease = tree.pick(rng)->try_reserve(n)) held.push_back(std::move(*lease));
        } else {
          held.erase(held.begin());
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  stop = true;
  watcher.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(overdraft_violations.load(), 0);
  EXPECT_GT(forced.load(), 0u);
  EXPECT_LE(tree.root->stats().peak_used, StressTree::kRootCapacity + kBound);
  EXPECT_EQ(tree.root->used(), 0u);
  EXPECT_EQ(tree.root->overdraft(), 0u);
}

}  // namespace
}  // namespace tidemark
