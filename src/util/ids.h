// Random identifiers for writers, parts and idempotency tokens.
//
// 128 bits from a per-thread generator seeded from std::random_device, as
// 32 lowercase hex characters: collisions are not a practical concern.
//
// Thread-safety: safe to call from any thread.
#pragma once

#include <string>

namespace tidemark {

std::string random_id();

}  // namespace tidemark
