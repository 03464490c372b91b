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
#include <string_view>
#include <system_error>
#include <thread>

#include "tidemark/error.h"

namespace tidemark {

// The error for a thread that could not be started for `what`.
Error thread_start_error(std::string_view what, const std::system_error& error);

// A thread running `body`, or the error.
[[nodiscard]] Result<std::thread> start_thread(std::string_view what, std::function<void()> body);

}  // namespace tidemark
