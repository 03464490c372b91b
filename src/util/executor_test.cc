#include "util/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

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

TEST(WorkPoolTest, SubmitOrInlineGivesTheResult) {
  WorkPool pool("test", 2);
  auto owned = std::make_unique<int>(41);  // a move-only capture
  auto future = submit_or_inline(pool, [owned = std::move(owned)] { return *owned + 1; });
  EXPECT_EQ(future.get(), 42);
}

// Every index once, helped by the pool's free threads; with every thread of
// the pool busy, the caller does it all and does not wait for them.
TEST(WorkPoolTest, ForEachHelpedNeverWaitsForABusyPool) {
  WorkPool pool("test", 3);
  std::vector<std::atomic<int>> calls(200);
  std::set<std::thread::id> seen;
  std::mutex seen_mu;
  for_each_helped(pool, 3, calls.size(), [&](std::size_t i) {
    ++calls[i];
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard lock(seen_mu);
    seen.insert(std::this_thread::get_id());
  });
  for (std::size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i].load(), 1) << i;
  EXPECT_GT(seen.size(), 1u);  // helped

  // Block every thread of the pool; the caller alone finishes.
  std::mutex gate;
  std::unique_lock closed(gate);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pool.submit([&gate] { std::lock_guard wait(gate); }));
  }
  std::atomic<int> done{0};
  std::set<std::thread::id> alone;
  for_each_helped(pool, 3, 50, [&](std::size_t) {
    ++done;
    alone.insert(std::this_thread::get_id());  // only this thread: no lock needed
  });
  EXPECT_EQ(done.load(), 50);
  EXPECT_EQ(alone, std::set<std::thread::id>{std::this_thread::get_id()});
  closed.unlock();  // the blocked jobs end; the late helpers find nothing to do
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

// schedule(): each run names the delay before the next; wake() runs a
// waiting task at once, and one running again as soon as it returns.
TEST(TimersTest, ScheduledTasksChooseTheirNextDelayAndWakeRunsThemAtOnce) {
  WorkPool pool("test timers", 2);
  Timers timers(&pool);
  std::atomic<int> runs{0};  // counted once a run has noted its time
  const auto began = std::chrono::steady_clock::now();
  std::vector<std::chrono::steady_clock::duration> at(4);
  // Runs at 0, then 30 ms later, then waits an hour unless woken.
  auto task = timers.schedule(0ms, [&]() -> std::optional<std::chrono::milliseconds> {
    const int run = runs.load();
    at[run] = std::chrono::steady_clock::now() - began;
    ++runs;
    if (run == 0) return 30ms;
    if (run < 3) return std::chrono::milliseconds(std::chrono::hours(1));
    return std::nullopt;
  });
  ASSERT_TRUE(task);
  for (int i = 0; i < 400 && runs < 2; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(runs.load(), 2);
  EXPECT_GE(at[1] - at[0], 30ms);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(runs.load(), 2);  // waiting its hour
  const auto woken = std::chrono::steady_clock::now();
  timers.wake(*task);
  for (int i = 0; i < 2000 && runs < 3; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(runs.load(), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - woken, 1s);
  timers.wake(*task);  // the fourth run ends it
  for (int i = 0; i < 2000 && runs < 4; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(runs.load(), 4);
  EXPECT_EQ(settled_tasks(timers), 0u);
  timers.wake(*task);  // ended: a no-op

  // A wake while the task runs makes it run again as soon as it returns.
  std::atomic<bool> inside{false};
  std::atomic<bool> release{false};
  std::atomic<int> slow_runs{0};
  auto slow = timers.schedule(0ms, [&]() -> std::optional<std::chrono::milliseconds> {
    if (++slow_runs > 1) return std::nullopt;
    inside = true;
    while (!release) std::this_thread::sleep_for(1ms);
    return std::chrono::milliseconds(std::chrono::hours(1));
  });
  ASSERT_TRUE(slow);
  while (!inside) std::this_thread::sleep_for(1ms);
  timers.wake(*slow);
  release = true;
  for (int i = 0; i < 2000 && slow_runs < 2; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(slow_runs.load(), 2);
  EXPECT_EQ(settled_tasks(timers), 0u);
}

// SerialTask: every notify is followed by a run that starts after it, runs
// never overlap, and none starts once stop() has returned.
TEST(SerialTaskTest, NotificationsAreNeverLostAndRunsNeverOverlap) {
  WorkPool pool("test serial", 4);
  std::atomic<int> inside{0}, overlaps{0}, runs{0};
  std::atomic<std::uint64_t> seen{0};   // the latest value a run read
  std::atomic<std::uint64_t> value{0};  // bumped before each notify
  SerialTask task(&pool, [&] {
    if (++inside > 1) ++overlaps;
    seen = value.load();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ++runs;
    --inside;
  });
  std::vector<std::thread> notifiers;
  for (int t = 0; t < 4; ++t) {
    notifiers.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        ++value;
        task.notify();
      }
    });
  }
  for (auto& t : notifiers) t.join();
  // A run started after the last notify, so it saw the final value.
  for (int i = 0; i < 2000 && seen != value; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(seen.load(), value.load());
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_LT(runs.load(), 2000);  // notifications during a run coalesce
  task.stop();
  const int at_stop = runs;
  task.notify();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(runs.load(), at_stop);
}

// run_here: an idle task runs on the caller's thread; a busy one is only
// notified (the run in progress queues the next on the pool), and mixed
// with notify() from other threads, runs still never overlap.
TEST(SerialTaskTest, RunHereRunsAnIdleTaskOnTheCallersThread) {
  WorkPool pool("test serial", 2);
  std::mutex mu;
  std::vector<std::thread::id> ran_on;
  std::atomic<bool> hold{false};
  std::atomic<int> inside{0}, overlaps{0};
  SerialTask task(&pool, [&] {
    if (++inside > 1) ++overlaps;
    {
      std::lock_guard lock(mu);
      ran_on.push_back(std::this_thread::get_id());
    }
    while (hold) std::this_thread::sleep_for(1ms);
    --inside;
  });
  task.run_here();
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(ran_on.size(), 1u);
    EXPECT_EQ(ran_on[0], std::this_thread::get_id());
  }
  // Busy on another thread: run_here returns at once, and the next run
  // comes on the pool after the one in progress.
  hold = true;
  std::thread other([&] { task.run_here(); });
  for (int i = 0; i < 2000 && inside == 0; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(inside.load(), 1);
  task.run_here();  // returns: the run in progress holds
  hold = false;
  other.join();
  for (int i = 0; i < 2000; ++i) {
    {
      std::lock_guard lock(mu);
      if (ran_on.size() == 3) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(ran_on.size(), 3u);
    EXPECT_NE(ran_on[2], std::this_thread::get_id());
  }
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) (t % 2 == 0) ? task.run_here() : task.notify();
    });
  }
  for (auto& t : callers) t.join();
  task.stop();
  EXPECT_EQ(overlaps.load(), 0);
}

// A task may notify itself and stop itself without deadlock.
TEST(SerialTaskTest, ATaskMayNotifyAndStopItself) {
  WorkPool pool("test serial", 1);
  std::atomic<int> runs{0};
  std::unique_ptr<SerialTask> task;
  task = std::make_unique<SerialTask>(&pool, [&] {
    if (++runs < 5) {
      task->notify();
    } else {
      task->stop();
    }
  });
  task->notify();
  for (int i = 0; i < 1000 && runs < 5; ++i) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(runs.load(), 5);
  task->stop();  // ordered after its last run, before the pointer is cleared
  task.reset();
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
