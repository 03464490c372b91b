#include "server/shard_registry.h"

#include "shard/state.h"
#include "util/try.h"

namespace tidemark {

using Clock = std::chrono::steady_clock;

ShardRegistry::ShardRegistry(std::shared_ptr<Client> client, AppenderOptions appender,
                             std::shared_ptr<MemoryPool> pool, std::chrono::milliseconds idle_close)
    : client_(std::move(client)),
      appender_options_(std::move(appender)),
      pool_(std::move(pool)),
      idle_close_(idle_close) {}

void ShardRegistry::touch_locked(std::string_view name) {
  auto it = last_used_.find(name);
  if (it == last_used_.end()) it = last_used_.try_emplace(std::string(name)).first;
  it->second = Clock::now();
}

// A cached handle that found its shard deleted (here or by another
// process) is dropped, with its appender and writer, and the name opened
// anew: it may have been created again.
Result<std::shared_ptr<Shard>> ShardRegistry::open(std::string_view name) {
  TM_TRY(validate_shard_name(name));
  {
    std::lock_guard lock(mu_);
    if (auto it = shards_.find(name); it != shards_.end()) {
      if (!it->second->deleted()) {
        touch_locked(name);
        return it->second;
      }
    }
  }
  forget(name);
  TM_ASSIGN(auto opened, client_->open_shard(name));
  std::lock_guard lock(mu_);
  touch_locked(name);
  return shards_.try_emplace(std::string(name), std::move(opened)).first->second;
}

void ShardRegistry::forget(std::string_view name) {
  std::shared_ptr<Appender> appender_closing;
  std::shared_ptr<SharedWriter> writer_closing;
  std::shared_ptr<Shard> shard_closing;
  {
    std::lock_guard lock(mu_);
    if (auto it = appenders_.find(name); it != appenders_.end()) {
      appender_closing = std::move(it->second);
      appenders_.erase(it);
    }
    if (auto it = writers_.find(name); it != writers_.end()) {
      writer_closing = std::move(it->second);
      writers_.erase(it);
    }
    if (auto it = shards_.find(name); it != shards_.end()) {
      shard_closing = std::move(it->second);
      shards_.erase(it);
    }
  }
  // Outside the lock, as close_idle does.
  if (appender_closing) appender_closing->close();
}

// Only what the maps alone hold (use_count 1 under the mutex, which every
// taker holds to take one) can go: a request in progress keeps its own.
void ShardRegistry::close_idle() {
  std::vector<std::shared_ptr<Appender>> appenders_closing;
  std::vector<std::shared_ptr<SharedWriter>> writers_closing;
  std::vector<std::shared_ptr<Shard>> shards_closing;
  {
    std::lock_guard lock(mu_);
    const auto cutoff = Clock::now() - idle_close_;
    auto idle = [&](const std::string& name) {
      auto it = last_used_.find(name);
      return it == last_used_.end() || it->second < cutoff;
    };
    for (auto it = appenders_.begin(); it != appenders_.end();) {
      if (it->second.use_count() == 1 && idle(it->first) &&
          it->second->stats().queued_records == 0) {
        appenders_closing.push_back(std::move(it->second));
        it = appenders_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = writers_.begin(); it != writers_.end();) {
      if (it->second.use_count() == 1 && idle(it->first)) {
        writers_closing.push_back(std::move(it->second));
        it = writers_.erase(it);
      } else {
        ++it;
      }
    }
    // A shard whose appender or writer is still open is in use (the
    // appender holds it): use_count says so.
    for (auto it = shards_.begin(); it != shards_.end();) {
      if (it->second.use_count() == 1 && idle(it->first) && !appenders_.contains(it->first) &&
          !writers_.contains(it->first)) {
        shards_closing.push_back(std::move(it->second));
        last_used_.erase(it->first);
        it = shards_.erase(it);
      } else {
        ++it;
      }
    }
    idle_closed_ += appenders_closing.size() + writers_closing.size();
  }
  // Outside the lock: closing joins an appender's threads and
  // unregisters writers (a consensus write each).
  for (auto& a : appenders_closing) a->close();
}

Result<std::shared_ptr<Appender>> ShardRegistry::appender(std::string_view name) {
  TM_ASSIGN(auto s, open(name));
  std::shared_ptr<Appender> stopped;  // closed outside the lock
  std::lock_guard lock(mu_);
  touch_locked(name);
  if (auto it = appenders_.find(name); it != appenders_.end()) {
    if (!it->second->failure()) return it->second;
    stopped = std::move(it->second);
    appenders_.erase(it);
    ++appenders_replaced_;
  }
  AppenderOptions appender_options = appender_options_;
  appender_options.parent_pool = pool_;
  appender_options.queue_bytes = pool_->capacity();
  TM_ASSIGN(auto opened, Appender::open(s, appender_options));
  return appenders_.try_emplace(std::string(name), std::move(opened)).first->second;
}

std::shared_ptr<Appender> ShardRegistry::cached_appender(std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = appenders_.find(name);
  if (it == appenders_.end() || it->second->failure()) return nullptr;
  touch_locked(name);
  return it->second;
}

Result<std::shared_ptr<ShardRegistry::SharedWriter>> ShardRegistry::writer(std::string_view name) {
  TM_ASSIGN(auto s, open(name));
  std::lock_guard lock(mu_);
  touch_locked(name);
  if (auto it = writers_.find(name); it != writers_.end()) return it->second;
  auto shared = std::make_shared<SharedWriter>();
  TM_ASSIGN(shared->writer, s->open_writer());
  return writers_.try_emplace(std::string(name), std::move(shared)).first->second;
}

ShardRegistry::Contents ShardRegistry::contents() const {
  Contents out;
  std::lock_guard lock(mu_);
  out.shards.assign(shards_.begin(), shards_.end());
  out.appenders.assign(appenders_.begin(), appenders_.end());
  out.writers = writers_.size();
  out.appenders_replaced = appenders_replaced_;
  out.idle_closed = idle_closed_;
  return out;
}

}  // namespace tidemark
