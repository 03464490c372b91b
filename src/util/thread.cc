#include "util/thread.h"

#include <string>

namespace tidemark {

Error thread_start_error(std::string_view what, const std::system_error& error) {
  return Error{ErrorKind::kDeterminate,
               "cannot start a thread for " + std::string(what) + ": " + error.what() +
                   " (the process is at its thread or memory limit)",
               std::nullopt, std::nullopt};
}

Result<std::thread> start_thread(std::string_view what, std::function<void()> body) {
  try {
    return std::thread(std::move(body));
  } catch (const std::system_error& error) {
    return std::unexpected(thread_start_error(what, error));
  }
}

}  // namespace tidemark
