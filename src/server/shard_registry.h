// ShardRegistry: the shards a server has open, each with its appender
// (managed appends) and its writer (explicit appends), opened by the first
// request that needs them and shared by the requests after it.
//
// A handle that found its shard deleted (here or by another process) is
// dropped with its appender and writer, and the name opened anew; an
// appender an error stopped is replaced by the next append. What no request
// has taken for `idle_close` and only the registry holds (an appender with
// no record queued) is closed by close_idle(), which the server runs on the
// shared timers: an idle shard costs no thread, no heartbeat and no cached
// state, and the next request opens it again.
//
// Memory: one shard handle, appender and writer per shard used within
// idle_close (and per shard a request still holds); the appenders' queues
// draw from the pool the registry is given.
//
// Thread-safety: all methods are safe for concurrent use. Those marked
// blocking open shards, appenders or writers (consensus and blob calls) or
// close them: call them from a worker, not from an I/O thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tidemark/appender.h"
#include "tidemark/client.h"
#include "tidemark/memory_pool.h"
#include "tidemark/write.h"

namespace tidemark {

class ShardRegistry {
 public:
  // A shard's writer, shared by its explicit appends.
  struct SharedWriter {
    std::mutex mu;  // one explicit append at a time per shard
    std::unique_ptr<WriteHandle> writer;
  };

  // Appenders open with `appender`, drawing from `pool` (their parent
  // pool; their queue may take all of it).
  ShardRegistry(std::shared_ptr<Client> client, AppenderOptions appender,
                std::shared_ptr<MemoryPool> pool, std::chrono::milliseconds idle_close);
  ShardRegistry(const ShardRegistry&) = delete;
  ShardRegistry& operator=(const ShardRegistry&) = delete;

  // Blocking: the shard, opened once and cached.
  [[nodiscard]] Result<std::shared_ptr<Shard>> open(std::string_view name);

  // Blocking: the shard's appender. One an error stopped (a backend down
  // past its retries: its pending records failed) is replaced, so the
  // shard takes appends again once the backend is back.
  [[nodiscard]] Result<std::shared_ptr<Appender>> appender(std::string_view name);

  // The shard's appender if one is open and has not failed, else null.
  // Never blocks: an I/O thread may call it.
  std::shared_ptr<Appender> cached_appender(std::string_view name);

  // Blocking: the shard's writer for explicit appends.
  [[nodiscard]] Result<std::shared_ptr<SharedWriter>> writer(std::string_view name);

  // Blocking: drops the shard's handle, appender and writer (after a
  // delete). Requests holding them finish with them (and fail: the shard
  // is gone); the next request opens the shard anew.
  void forget(std::string_view name);

  // Blocking: closes what is idle (see above).
  void close_idle();

  // What is open now, for /metrics and for the server's stop.
  struct Contents {
    std::vector<std::pair<std::string, std::shared_ptr<Shard>>> shards;
    std::vector<std::pair<std::string, std::shared_ptr<Appender>>> appenders;
    std::size_t writers = 0;
    std::uint64_t appenders_replaced = 0;  // since start: appenders an error stopped
    std::uint64_t idle_closed = 0;         // since start: appenders and writers closed idle
  };
  Contents contents() const;

 private:
  // Marks the shard as used now. REQUIRES: mu_ held.
  void touch_locked(std::string_view name);

  const std::shared_ptr<Client> client_;
  const AppenderOptions appender_options_;
  const std::shared_ptr<MemoryPool> pool_;
  const std::chrono::milliseconds idle_close_;

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Shard>, std::less<>> shards_;          // guarded by mu_
  std::map<std::string, std::shared_ptr<Appender>, std::less<>> appenders_;    // guarded by mu_
  std::uint64_t appenders_replaced_ = 0;                                       // guarded by mu_
  std::map<std::string, std::shared_ptr<SharedWriter>, std::less<>> writers_;  // guarded by mu_
  // When a request last took each shard's handle, appender or writer
  // (guarded by mu_); close_idle closes what has not been taken for
  // idle_close_.
  std::map<std::string, std::chrono::steady_clock::time_point, std::less<>> last_used_;
  std::uint64_t idle_closed_ = 0;  // guarded by mu_
};

}  // namespace tidemark
