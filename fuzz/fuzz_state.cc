// Fuzz target: the shard state codecs read from consensus and the blob
// store: full states and rollups (decode_state), diffs applied to a state
// (apply_version) and the shard registry (decode_registry). Any input must
// decode or give an error, never a crash or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string>

#include "sample_state.h"
#include "shard/state.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tidemark;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const VersionedData version{7, bytes};
  auto state = decode_state("fuzz", version);
  // A diff on a small state that is not empty, so that its splices and
  // removals reach something: the one the seed diff was made against.
  const ShardState before = sample_state();
  (void)apply_version("fuzz", &before, version);
  (void)version_rollup("fuzz", version);
  (void)decode_registry(bytes);
  (void)state;
  return 0;
}
