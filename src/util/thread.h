// Starting threads without aborting: std::thread and std::async throw
// std::system_error when the system has no thread to give (a container's
// pids limit, the address space for a stack), and an exception nobody
// catches ends the process. These return the failure as an error instead
// (Determinate, naming what the thread was for), so the one request,
// shard or sink that needed the thread fails and the process goes on.
//
// Thread-safety: plain functions.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "tidemark/error.h"

namespace tidemark {

// The error for a thread that could not be started for `what`.
Error thread_start_error(std::string_view what, const std::system_error& error);

// A thread running `body`, or the error.
[[nodiscard]] Result<std::thread> start_thread(std::string_view what, std::function<void()> body);

// std::async(std::launch::async, f); when no thread can be started, f
// runs here, now, and the future is ready with its result: the work is
// done either way, sooner or later. `f` (which may own large buffers) is
// moved once, into shared ownership, never copied. F returns a value.
template <typename F>
std::future<std::invoke_result_t<std::decay_t<F>&>> async_or_inline(F&& f) {
  using R = std::invoke_result_t<std::decay_t<F>&>;
  auto shared = std::make_shared<std::decay_t<F>>(std::forward<F>(f));
  try {
    return std::async(std::launch::async, [shared] { return (*shared)(); });
  } catch (const std::system_error&) {
    std::promise<R> done;
    done.set_value((*shared)());
    return done.get_future();
  }
}

}  // namespace tidemark
