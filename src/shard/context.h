// ShardContext: what every handle on one shard shares: its name, location,
// options and state machine.
//
// Thread-safety: immutable after construction except the machine, which is
// itself thread-safe.
#pragma once

#include <memory>
#include <string>

#include "shard/machine.h"
#include "tidemark/client.h"
#include "tidemark/location.h"

namespace tidemark {

struct ShardContext {
  std::string name;
  Location location;
  ClientOptions options;
  std::shared_ptr<ShardMachine> machine;
};

}  // namespace tidemark
