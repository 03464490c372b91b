// The jemalloc settings of the programs that link it (the tidemark binary
// and tidemark-peers: CMakeLists.txt, TIDEMARK_JEMALLOC), in one place so
// they stay the same. Each program defines jemalloc's `malloc_conf` as
// this; MALLOC_CONF in the environment overrides it.
//
// A freed page goes back to the kernel at once (no decay), so RSS follows
// what the heap holds, as the memory caps need: with jemalloc's default of
// 10 s, the bounded-memory scenarios' servers went past their 128 MiB caps
// (up to 143.5 MiB, OOM-killed), and with 0 each stayed under
// (docs/benchmarks.md, "The allocator").
//
// Thread-safety: a constant. Memory: none.
#pragma once

namespace tidemark {

inline constexpr char kJemallocConf[] = "dirty_decay_ms:0,muzzy_decay_ms:0";

}  // namespace tidemark
