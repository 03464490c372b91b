// ShardContext: what every handle on one shard shares: its name, location,
// options and state machine.
//
// Thread-safety: immutable after construction except the machine, which is
// itself thread-safe.
#pragma once

#include <memory>
#include <string>

#include "shard/machine.h"
#include "shard/state.h"
#include "tidemark/client.h"
#include "tidemark/location.h"

namespace tidemark {

class BackgroundCompactor;

struct ShardContext {
  ShardContext();
  ~ShardContext();  // stops the background compactor first

  std::string name;
  Location location;
  ClientOptions options;
  std::shared_ptr<ShardMachine> machine;
  // Null when background compaction is off. Declared last: destroyed first,
  // while what it uses is still there.
  std::unique_ptr<BackgroundCompactor> compactor;

  // Hands the background compactor a merge the spine needs (if there is
  // one and a compactor runs).
  void request_compaction(const ShardState& state);
};

}  // namespace tidemark
