#include "util/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "util/periodic.h"

namespace tidemark {
namespace {

using namespace std::chrono_literals;

// A task cancelled while its run waited for a pool thread is erased when
// that run comes (and skips the function): wait for the count to settle.
std::size_t settled_tasks(const Timers& timers) {
  for (int i = 0; i < 200 && timers.tasks() > 0; ++i) std::this_thread::sleep_for(5ms);
  return timers.tasks();
}

TEST(WorkPoolTest, RunsEveryJobOnAtMostItsThreads) {
  WorkPool pool("test", 3);
  std::atomic<int> running{0}, most{0}, done{0};
  std::mutex mu;
  std::set<std::thread::id> threads;
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(pool.submit([&] {
      const int now = ++running;
      for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
      }
      {
        std::lock_guard lock(mu);
        threads.insert(std::this_thread::get_id());
      }
      std::this_thread::sleep_for(2ms);
      --running;
      ++done;
    }));
  }
  for (int i = 0; i < 1000 && done < 60; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(done.load(), 60);
  EXPECT_LE(most.load(), 3);
  EXPECT_GE(most.load(), 2);  // they do run side by side
  EXPECT_LE(pool.threads(), 3u);
  EXPECT_LE(threads.size(), 3u);
}

TEST(TimersTest, TasksRepeatUntilTheySayDoneOrAreCancelled) {
  WorkPool pool("test timers", 2);
  Timers timers(&pool);
  std::atomic<int> counted{0}, finite{0};
  auto repeating = timers.every(5ms, [&] {
    ++counted;
    return true;
  });
  ASSERT_TRUE(repeating);
  auto three = timers.every(5ms, [&] { return ++finite < 3; });
  ASSERT_TRUE(three);
  for (int i = 0; i < 400 && (counted < 10 || finite < 3); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_GE(counted.load(), 10);
  timers.cancel(*repeating);
  const int at_cancel = counted.load();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(counted.load(), at_cancel);  // never again once cancel returned
  EXPECT_EQ(finite.load(), 3);
  EXPECT_EQ(settled_tasks(timers), 0u);
}

TEST(TimersTest, CancelWaitsForARunInProgressAndATaskMayCancelItself) {
  WorkPool pool("test timers", 2);
  Timers timers(&pool);
  std::atomic<bool> inside{false}, finished{false};
  auto slow = timers.every(1ms, [&] {
    inside = true;
    std::this_thread::sleep_for(100ms);
    finished = true;
    return true;
  });
  ASSERT_TRUE(slow);
  while (!inside) std::this_thread::sleep_for(1ms);
  timers.cancel(*slow);
  EXPECT_TRUE(finished.load());  // the run in progress ended before cancel returned

  std::atomic<int> runs{0};
  Timers::Id self = 0;
  std::mutex mu;
  std::unique_lock lock(mu);
  auto own = timers.every(1ms, [&] {
    ++runs;
    std::lock_guard held(mu);
    timers.cancel(self);  // no deadlock: it does not wait for itself
    return true;
  });
  ASSERT_TRUE(own);
  self = *own;
  lock.unlock();
  for (int i = 0; i < 200 && runs == 0; ++i) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(settled_tasks(timers), 0u);
}

// The shared timers behind PeriodicTask: a thousand heartbeats take the
// pool's threads, not a thousand.
TEST(PeriodicTaskTest, AThousandTasksShareTheTimersThreads) {
  std::atomic<int> beats{0};
  std::vector<std::unique_ptr<PeriodicTask>> tasks;
  for (int i = 0; i < 1000; ++i) {
    tasks.push_back(std::make_unique<PeriodicTask>());
    ASSERT_TRUE(tasks.back()->start(10ms, [&] {
      ++beats;
      return true;
    }));
  }
  for (int i = 0; i < 400 && beats < 5000; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_GE(beats.load(), 5000);
  EXPECT_LE(Timers::shared().tasks(), 1000u);
  tasks.clear();  // each stop() cancels its task
  EXPECT_EQ(settled_tasks(Timers::shared()), 0u);
  const int after = beats.load();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(beats.load(), after);
}

}  // namespace
}  // namespace tidemark
