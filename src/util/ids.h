// Random identifiers for writers, parts and idempotency tokens.
//
// 128 bits from the kernel's random generator (getrandom(2)), as 32
// lowercase hex characters: collisions are not a practical concern, and an
// id is as hard to guess as the kernel makes it.
//
// Each thread draws kIdBufferBytes from the kernel at a time and hands
// them out 16 at a time, so a commit's two ids cost a system call in
// every 16 commits, not two a commit. The buffer is per thread and
// fixed (512 bytes a thread that has made an id). A forked child never
// reuses bytes its parent had drawn: the buffers are refilled after a
// fork.
//
// Thread-safety: safe to call from any thread.
#pragma once

#include <cstddef>
#include <string>

namespace tidemark {

inline constexpr std::size_t kIdBufferBytes = 512;

std::string random_id();

}  // namespace tidemark
