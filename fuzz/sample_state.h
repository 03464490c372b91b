// The small, non-empty shard state the state fuzz target applies diffs to
// and the seeds are made from (make_seeds.cc), so that a seed diff applies
// to the state it was made against.
#pragma once

#include "shard/state.h"

namespace tidemark {

inline ShardState sample_state() {
  ShardState state;
  state.name = "fuzz";
  state.seqno = 6;
  state.upper = Frontier::at(10);
  HollowBatch batch;
  batch.desc = Description{Frontier::at(0), Frontier::at(10), Frontier::at(0)};
  PartRef part;
  part.key = "shard/fuzz/part/w1-p1";
  part.size = 100;
  part.count = 3;
  part.bytes = 60;
  part.time_max = 9;
  part.lower = Frontier::at(0);
  part.upper = Frontier::at(10);
  batch.parts = PartList({part});
  state.batches.push_back(batch);
  state.writers["w1"] = WriterState{"t", 100, ""};
  state.readers["r1"] = ReaderState{Frontier::at(0), 100, 6, ""};
  state.producers["p"] = ProducerState{4, 9, 100};
  return state;
}

}  // namespace tidemark
