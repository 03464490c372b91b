// Batch: immutable updates written to Blob, ready to be appended.
//
// A batch has a description {lower, upper, since}: every update time lies
// in [lower, upper). Its data is one or more parts, each an immutable blob
// object, or, for a small part (ClientOptions::inline_part_max_bytes), the
// encoded part itself carried inside the shard's state: an inline part
// costs its append no blob write, and compaction later moves it into a
// blob part. A batch is produced by a BatchBuilder (write.h) and consumed
// by WriteHandle::compare_and_append.
//
// Ownership: a Batch owns its parts until an append commits them. A batch
// dropped without being committed (abandoned, or its append definitely
// failed) deletes its parts. A batch whose append ended indeterminate is
// never deleted: it may be referenced by the shard, and garbage collection
// removes it later if it is not.
//
// Thread-safety: a Batch is a move-only value; use from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tidemark/error.h"
#include "tidemark/frontier.h"

namespace tidemark {

class Blob;

// A reference to one part as the shard state registers it. [lower, upper)
// is the registered range of the part: reads keep only the part's updates
// whose times lie in both this range and the part's own inline description.
struct PartRef {
  std::string key;
  std::uint64_t size = 0;   // encoded bytes of the blob object
  std::uint64_t count = 0;  // updates in the part
  std::uint64_t bytes = 0;  // uncompressed payload bytes
  Time time_min = 0;        // time range of the part's updates
  Time time_max = 0;
  Frontier lower;  // registered range
  Frontier upper;
  // The encoded part (`size` bytes) when it travels inline, in the shard's
  // state; null when it is the blob object `key`. An inline part keeps a
  // key of its own, which names it in messages and is written to Blob only
  // if the state has no room for it when it is appended.
  std::shared_ptr<const std::string> data;

  bool is_inline() const { return data != nullptr; }
  // Equal fields, and equal inline bytes (not only the same pointer).
  friend bool operator==(const PartRef& a, const PartRef& b) {
    return a.key == b.key && a.size == b.size && a.count == b.count && a.bytes == b.bytes &&
           a.time_min == b.time_min && a.time_max == b.time_max && a.lower == b.lower &&
           a.upper == b.upper && (a.data == b.data || (a.data && b.data && *a.data == *b.data));
  }
};

class Batch {
 public:
  Batch(std::shared_ptr<Blob> blob, std::string shard, Description desc, std::vector<PartRef> parts,
        bool ordered = false);
  Batch(Batch&& other) noexcept;
  Batch& operator=(Batch&& other) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  const std::string& shard() const { return shard_; }
  const Description& desc() const { return desc_; }
  const std::vector<PartRef>& parts() const { return parts_; }
  std::uint64_t count() const;
  bool empty() const { return parts_.empty(); }
  // The parts form one sorted run: each part's updates all sort before the
  // next part's, so a read opens one part at a time. A BatchBuilder writes
  // a batch of more than kMaxLooseParts parts so (write.h).
  bool ordered() const { return ordered_; }

  // Narrows the batch to [new_lower, upper): updates at earlier times are no
  // longer part of it and reads filter them out. This is how a writer whose
  // batch raced with an identical write by another replica appends only the
  // part that is still missing.
  // REQUIRES: lower <= new_lower <= upper; else InvalidUsage.
  [[nodiscard]] Status truncate(Frontier new_lower);

 private:
  // The write path's: WriteHandle::compare_and_append hands the parts to
  // the shard (committed) or keeps them alive (maybe committed).
  friend struct BatchOwnership;
  enum class OwnershipState : std::uint8_t { kOwned, kCommitted, kMaybeCommitted, kMovedFrom };
  void delete_parts_if_owned();

  std::shared_ptr<Blob> blob_;
  std::string shard_;
  Description desc_;
  std::vector<PartRef> parts_;
  bool ordered_ = false;
  OwnershipState state_ = OwnershipState::kOwned;
};

}  // namespace tidemark
