#include "location/mem_blob.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "tidemark/blob_key.h"
#include "util/try.h"

namespace tidemark {

Result<std::optional<std::string>> MemBlob::get(std::string_view key) {
  TM_TRY(validate_blob_key(key));
  std::lock_guard lock(mutex_);
  auto found = objects_.find(key);
  if (found == objects_.end()) return std::nullopt;
  return found->second;
}

Result<std::string> MemBlob::get_range(std::string_view key, std::uint64_t offset,
                                       std::uint64_t length) {
  TM_TRY(validate_blob_key(key));
  std::lock_guard lock(mutex_);
  auto found = objects_.find(key);
  if (found == objects_.end()) {
    return make_error(ErrorKind::kNotFound, "mem blob: no object " + std::string(key));
  }
  const std::string& bytes = found->second;
  if (offset >= bytes.size()) return std::string();
  // min() before adding: offset + length may overflow.
  std::uint64_t available = bytes.size() - offset;
  return bytes.substr(offset, std::min(length, available));
}

Status MemBlob::set(std::string_view key, std::string_view bytes) {
  TM_TRY(validate_blob_key(key));
  std::string copy(bytes);  // allocate before taking the lock
  std::lock_guard lock(mutex_);
  auto found = objects_.find(key);
  if (found == objects_.end()) {
    objects_.emplace(std::string(key), std::move(copy));
  } else {
    found->second = std::move(copy);
  }
  return {};
}

Status MemBlob::remove(std::string_view key) {
  TM_TRY(validate_blob_key(key));
  std::string removed;  // freed after the lock is released
  std::lock_guard lock(mutex_);
  auto found = objects_.find(key);
  if (found != objects_.end()) {
    removed = std::move(found->second);
    objects_.erase(found);
  }
  return {};
}

Status MemBlob::list(std::string_view prefix,
                     const std::function<void(std::string_view key, std::uint64_t size)>& visit) {
  TM_TRY(validate_blob_prefix(prefix));
  std::vector<std::pair<std::string, std::uint64_t>> matches;
  {
    std::lock_guard lock(mutex_);
    for (auto it = objects_.lower_bound(prefix); it != objects_.end(); ++it) {
      if (!it->first.starts_with(prefix)) break;  // keys with the prefix are contiguous
      matches.emplace_back(it->first, it->second.size());
    }
  }
  for (const auto& [key, size] : matches) visit(key, size);
  return {};
}

}  // namespace tidemark
