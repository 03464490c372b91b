// Fuzz target: the shard state codecs read from consensus and the blob
// store: full states and rollups (decode_state), diffs applied to a state
// (apply_version) and the shard registry (decode_registry). Any input must
// decode or give an error, never a crash or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string>

#include "shard/state.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tidemark;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const VersionedData version{7, bytes};
  auto state = decode_state("fuzz", version);
  // A diff on a small state that is not empty, so that its splices and
  // removals reach something.
  ShardState before;
  before.name = "fuzz";
  before.seqno = 6;
  before.upper = Frontier::at(10);
  HollowBatch batch;
  batch.desc = Description{Frontier::at(0), Frontier::at(10), Frontier::at(0)};
  PartRef part;
  part.key = "shard/fuzz/part/w1-p1";
  part.count = 3;
  part.bytes = 60;
  part.time_max = 9;
  part.lower = Frontier::at(0);
  part.upper = Frontier::at(10);
  batch.parts = PartList({part});
  before.batches.push_back(batch);
  before.writers["w1"] = WriterState{"t", 100};
  before.readers["r1"] = ReaderState{Frontier::at(0), 100, 6};
  (void)apply_version("fuzz", &before, version);
  (void)version_rollup("fuzz", version);
  (void)decode_registry(bytes);
  (void)state;
  return 0;
}
