// Random identifiers for writers, parts and idempotency tokens.
//
// 128 bits from getrandom(2), as
// 32 lowercase hex characters: collisions are not a practical concern.
//
// Thread-safety: safe to call from any thread.
#pragma once

#include <string>

namespace tidemark {

std::string random_id();

}  // namespace tidemark
