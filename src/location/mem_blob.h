// MemBlob: a Blob held in process memory, for tests and `mem://`.
//
// Keys follow the shared syntax (blob_key.h). Nothing survives the object;
// "durable" means visible to every later call on this instance. Each call is
// atomic and linearizable: one mutex guards the whole map.
//
// Thread-safety: safe for concurrent use from many threads. `list` copies
// the matching keys and sizes under the lock and calls `visit` after
// releasing it, so a visitor may call back into the blob.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "tidemark/location.h"

namespace tidemark {

class MemBlob : public Blob {
 public:
  MemBlob() = default;

  [[nodiscard]] Result<std::optional<std::string>> get(std::string_view key) override;
  [[nodiscard]] Result<std::string> get_range(std::string_view key, std::uint64_t offset,
                                              std::uint64_t length) override;
  [[nodiscard]] Status set(std::string_view key, std::string_view bytes) override;
  [[nodiscard]] Status remove(std::string_view key) override;
  [[nodiscard]] Status list(
      std::string_view prefix,
      const std::function<void(std::string_view key, std::uint64_t size)>& visit) override;

 private:
  std::mutex mutex_;
  std::map<std::string, std::string, std::less<>> objects_;  // guarded by mutex_
};

}  // namespace tidemark
